"""``Promise``: a graph node others may depend on before it exists.

Compare Parsl's ``join_app``: a join app's future resolves to the result of the
futures it returns. Here a promise resolves to the value of what it was last
pointed at with ``resolve_with``, and the task it points at may point it
elsewhere while it runs (delegation), any number of levels deep.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from functools import partial
from typing import Any

import dask
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.typing import Key

from .._context import current_key
from .._exceptions import NotInTaskError, PromiseError
from .._internals.dask_private import DataNode, GraphNode, Task, TaskRef, convert_legacy_task
from ..core.plan import collection_graph
from ..core.structure import Path, Structure, format_path
from .parked import PARK_RESOURCE, unresolved


def _client() -> Any:
    """The client to talk to the scheduler through: the worker's inside a task,
    else the default client."""
    from distributed import get_client

    try:
        client = get_client()
    except ValueError:
        raise PromiseError(
            "a Promise is a node on a distributed scheduler: create and resolve it "
            "with a distributed Client active, or inside a task on a worker"
        ) from None
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return client
    if running is getattr(client.loop, "asyncio_loop", None):
        # Client.sync would hand back coroutines nobody awaits here.
        raise PromiseError(
            "Promise() and resolve_with() are blocking calls and cannot run on "
            "the event loop of their client; from async code call them in a "
            "thread, e.g. await asyncio.to_thread(Promise)"
        )
    return client


def _install(client: Any) -> None:
    # Once per client; the plugin is idempotent on the scheduler as well.
    if not getattr(client, "_dask_coro_promises", False):
        from .scheduler import PromisePlugin

        client.register_plugin(PromisePlugin())
        client._dask_coro_promises = True


def _running_key() -> Key | None:
    try:
        return current_key()
    except NotInTaskError:
        return None


class Promise(Delayed):
    """A lazy value with a key that graphs may depend on before it is resolved.

    ``Promise()`` puts a parked task on the scheduler at once (so graphs that
    depend on it can be submitted); ``p.resolve_with(x)`` points it at ``x``. It
    is a dask ``Delayed``: ``dask.delayed(f)(p)``, ``client.compute(p)``,
    ``p.compute()``, passing it into coroutines and yielding it all wait for
    its value, holding no thread or slot meanwhile.

    Inside the graph it is resolved with, a promise stands for itself (its
    value cannot be an input of its own computation): the task receives the
    ``Promise`` and may call ``resolve_with`` on it again, which is how a task
    hands its result on to a subgraph it built at run time.

    Rules, each checked by the scheduler:

    - while unresolved, any client or task may resolve it;
    - once it points at a task, only that task may point it elsewhere; the
      last target wins; a task that re-runs (its worker died) and resolves
      again is a no-op;
    - a promise with a final value cannot be resolved again, nor one the
      scheduler forgot (cancelled or released);
    - a promise cannot depend on itself: resolving it with anything that
      depends on it (through other promises or tasks) is refused;
    - a promise created in a task, which that task finished without resolving,
      fails with ``PromiseError`` (nothing else could resolve it);
    - a promise whose target fails gets the target's exception; one whose
      target is forgotten first fails with ``PromiseError``.

    Parameters
    ----------
    name
        Key prefix (default ``"promise"``).
    """

    __slots__ = ("_future",)

    def __init__(self, name: str = "promise", *, _key: Key | None = None):
        if _key is not None:
            # Rebuilt from a pickle inside a task: bind to the key, no new node.
            from distributed import Future

            key: Any = _key  # any dask key (from_collections is annotated for str)
            future: Any = Future(key)
        else:
            client = _client()
            _install(client)
            key = f"{name}-{uuid.uuid4().hex}"
            creator = _running_key()
            layer = MaterializedLayer(
                {key: Task(key, unresolved, key, creator)},
                annotations={"resources": {PARK_RESOURCE: 1}},
            )
            (future,) = client.get(
                HighLevelGraph({key: layer}, {key: set()}), [key], sync=False
            )
            if creator is not None:
                # Made in a task: wait until the scheduler has the parked
                # task. The task's completion travels on the worker's own
                # connection, and its result (this promise) may be computed
                # by another client at once; either could overtake this
                # client's batched stream (one round trip per promise).
                from .._internals.distributed.client import send_on_client_stream

                mark = uuid.uuid4().hex
                send_on_client_stream(client, {"op": "dask-coro-promise-mark", "token": mark})
                reply = client.sync(client.scheduler.dask_coro_promise_sent, mark=mark)
                if reply.get("status") != "OK":
                    raise PromiseError(reply.get("message", repr(reply)))
        super().__init__(key, HighLevelGraph.from_collections(key, {key: future}, ()))
        self._future = future

    def __reduce__(self) -> tuple[Any, ...]:
        return _promise_from_key, (self.key,)

    def __repr__(self) -> str:
        return f"Promise({self.key!r})"

    def resolve_with(self, x: Any) -> None:
        """Point this promise at ``x`` (a ``Delayed`` or coroutine call, a
        ``Future``, a dask collection, lists, tuples and dicts of them, or a
        plain value) and return at once.

        Its value becomes the value of ``x``, containers traversed as
        ``dask.compute`` and a yield traverse them (``[inc(1), inc(2)]``
        gives ``[2, 3]``); nothing waits for ``x`` here.

        Raises
        ------
        PromiseError
            If the promise already has a final value, if it points at a task
            other than the caller, if the scheduler forgot it (cancelled or
            released), or if ``x`` depends on the promise (a cycle: the
            promise would wait for itself; inside ``x``'s own graph the
            promise stands for itself instead, see the class docstring).
        """
        client = _client()
        _install(client)
        resolver = _running_key()
        target, dsk, receivers = self._target_graph(x)
        # distributed is loaded: we hold one of its clients.
        from .._internals.distributed.client import send_on_client_stream

        # Vet first (one round trip, so errors reach the caller), then send the
        # target's graph and the rewiring on the client's batched stream, where
        # the scheduler handles them in order without waiting for each other.
        # The check waits for a mark sent on that stream first: it sees what
        # this client sent before (the promise's creation, earlier rewirings).
        mark = uuid.uuid4().hex
        send_on_client_stream(client, {"op": "dask-coro-promise-mark", "token": mark})
        reply = client.sync(
            client.scheduler.dask_coro_promise_check,
            promise=self.key,
            target=target,
            resolver=resolver,
            mark=mark,
            upstream=_upstream(target, dsk, receivers),
        )
        if reply.get("status") != "OK":
            raise PromiseError(reply.get("message", repr(reply)))
        if reply.get("noop"):
            return
        futures = client.get(dsk, [target], sync=False) if dsk else []
        send_on_client_stream(
            client,
            {
                "op": "dask-coro-promise-resolve",
                "promise": self.key,
                "target": target,
                "resolver": resolver,
            },
        )
        if reply.get("repoint"):
            # We are the promise's current target: our own completion (on the
            # worker's stream) must not reach the scheduler before the rewiring.
            done = client.sync(
                client.scheduler.dask_coro_promise_applied, promise=self.key, target=target
            )
            if done.get("status") != "OK":
                raise PromiseError(done.get("message", repr(done)))
        # Our futures on the target may go: once rewired, the promise depends
        # on it. Releases travel on the same stream, after the rewiring.
        for f in futures:
            f.release()

    def _target_graph(self, x: Any) -> tuple[Key, dict[Key, Any], list[Key]]:
        """The key ``x`` lives under, the graph to submit for it, with this
        promise standing for itself (see the class docstring), and the keys of
        that graph whose task received the promise that way.

        A list, tuple or dict (what ``core.structure`` walks, as a yield does)
        holding lazy values becomes one task that rebuilds it from their
        results, as ``dask.compute`` would give it; without lazy values it is
        a plain value."""
        if isinstance(x, TaskRef):  # a Future: already on the cluster
            return x.key, {}, []
        if _is_lazy(x):
            target, dsk = _lazy_graph(x)
        else:
            shape = Structure(x, partial(_classify, self.key))
            if not shape.leaves:
                target = f"promise-value-{uuid.uuid4().hex}"
                return target, {target: DataNode(target, x)}, []
            dsk = {}
            refs = []
            for leaf in shape.leaves:
                if isinstance(leaf, TaskRef):  # a Future: the graph carries it
                    key: Key = leaf.key
                    dsk[key] = leaf
                else:
                    key, leaf_dsk = _lazy_graph(leaf)
                    dsk.update(leaf_dsk)
                refs.append(TaskRef(key))
            target = f"promise-value-{uuid.uuid4().hex}"
            dsk[target] = Task(target, _rebuild, shape, *refs)
        dsk.pop(self.key, None)
        me = DataNode(None, self)
        receivers = []
        for k, v in list(dsk.items()):
            if isinstance(v, TaskRef):
                continue  # a Future already on the cluster
            if not isinstance(v, GraphNode):
                v = convert_legacy_task(k, v, dsk.keys())
            if self.key in v.dependencies:
                receivers.append(k)
                v = v.substitute({self.key: me})
                if isinstance(v, Task):
                    # A task that receives the promise is one of its resolvers:
                    # if it fails, say which promise it left unresolved.
                    v = Task(k, _Resolving(self.key, v.func), *v.args, **v.kwargs)
            dsk[k] = v
        return target, dsk, receivers


def _upstream(target: Key, dsk: dict[Key, Any], receivers: list[Key]) -> list[Key]:
    """Where a dependency cycle from the graph of ``target`` back to the
    promise would have to pass: the keys already on the scheduler it depends
    on (its Futures, and dependencies outside it), and its tasks that received
    the promise (one with the same key may be on the scheduler already,
    depending on the promise: the scheduler keeps its task, not ours)."""
    if not dsk:
        return [target]
    out = set(receivers)
    for k, v in dsk.items():
        if isinstance(v, TaskRef):
            out.add(k)
        elif isinstance(v, GraphNode):
            out.update(d for d in v.dependencies if d not in dsk)
    return list(out)


def _is_lazy(x: Any) -> bool:
    return isinstance(x, Delayed) or dask.is_dask_collection(x)


def _lazy_graph(x: Any) -> tuple[Key, dict[Key, Any]]:
    """The key and graph of a ``Delayed`` (coroutine calls, promises) or of
    any other dask collection, as ``Client.compute`` would submit it."""
    if isinstance(x, Delayed):
        return x.key, dict(x.__dask_graph__())
    target, nodes = collection_graph(x)
    return target, {k: v for k, (v, _) in nodes.items()}


def _classify(promise: Key, obj: Any, path: Path) -> bool:
    """A leaf of ``resolve_with``'s container: True for a value to compute."""
    if isinstance(obj, TaskRef) or _is_lazy(obj):
        return True
    if isinstance(obj, (set, frozenset)) and any(
        isinstance(o, TaskRef) or _is_lazy(o) for o in obj
    ):
        raise PromiseError(
            f"cannot resolve promise {promise!r} with a set of lazy values at "
            f"{format_path(path)}: a set has no order to give results back in; "
            "use a list instead"
        )
    return False


def _rebuild(shape: Structure, *values: Any) -> Any:
    """The task a container target becomes: its shape, with the values of its
    lazy leaves."""
    return shape.rebuild(values)


def _promise_from_key(key: Key) -> Promise:
    return Promise(_key=key)


class _Resolving:
    """Wraps the function of a task that received a promise to resolve: an
    exception it raises becomes a ``PromiseError`` naming the promise (with
    the original as its cause and in its message), for the promise's
    dependents to see. Async functions (coroutine calls) stay async."""

    __slots__ = ("promise", "func")

    def __init__(self, promise: Key, func: Any):
        self.promise = promise
        self.func = func

    @property
    def __tornado_coroutine__(self) -> bool:
        from distributed.utils import iscoroutinefunction

        return iscoroutinefunction(self.func)

    def with_key(self, key: Key) -> _Resolving:
        rekey = getattr(self.func, "with_key", None)
        return _Resolving(self.promise, rekey(key) if rekey else self.func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            out = self.func(*args, **kwargs)
        except Exception as e:
            raise self._error(e) from e
        if inspect.isawaitable(out):
            return self._await(out)
        return out

    async def _await(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except Exception as e:
            raise self._error(e) from e

    def _error(self, e: BaseException) -> PromiseError:
        who = _running_key()
        return PromiseError(
            f"promise {self.promise!r} was not resolved: its resolver "
            f"{who!r} raised {type(e).__name__}: {e}"
        )

    def __repr__(self) -> str:
        return f"<resolving {self.promise!r}: {self.func!r}>"
