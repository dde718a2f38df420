"""``distributed.client``: submitting graphs and expressions as ``Client``
does from a task (ranked, ordered, serialized where the caller runs), the
client's batched stream, a ``Future``'s state, and blocking calls of a
worker's client that secede while they wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Iterator
from time import monotonic
from typing import Any

from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.typing import Key
from dask.utils import parse_timedelta
from distributed.core import PooledRPCCall
from distributed.worker import thread_state

from .batched import flush_stream
from .core import keeping_contract
from .threadpoolexecutor import in_coroutine_step, seceded

logger = logging.getLogger("dask_coro")


def annotated_graph(graph: dict[Key, Any], annotated: dict[Key, dict[str, Any]]) -> Any:
    """``graph`` as ``Client.get`` takes it, each task of ``annotated`` with
    its own annotations, as if each came from a layer of its own. One layer,
    whose annotation values are ``dict.get`` of ``{key: value}`` per
    annotation: the scheduler calls a callable annotation with each key of
    the layer (``HLGExpr.__dask_annotations__``, in
    ``distributed.scheduler._materialize_graph``) and skips a None value
    (``Scheduler._apply_annotations``), so a task gets exactly its own. A
    layer's annotations win over the message's global ones there, as
    client-side layers' do. Without annotations, the plain dict."""
    if not annotated:
        return graph
    by_type: dict[str, dict[Key, Any]] = {}
    for k, ann in annotated.items():
        for name, value in ann.items():
            by_type.setdefault(name, {})[k] = value
    layer = MaterializedLayer(graph, annotations={name: d.get for name, d in by_type.items()})
    return HighLevelGraph({_CHILDREN: layer}, {_CHILDREN: set()})


_CHILDREN = "dask-coro-children"


@contextlib.contextmanager
def submitting_as(key: Key) -> Iterator[None]:
    """Submit from the event loop as task ``key`` would from its thread:
    ``Client._graph_to_futures`` reads ``thread_state.key`` to rank a running
    task's children ahead of unrelated queued work."""
    previous = getattr(thread_state, "key", None)
    thread_state.key = key
    try:
        yield
    finally:
        thread_state.key = previous


def seceding_waits(worker: Any, secede_after: Callable[[], float | None]) -> None:
    """Blocking calls of the worker's client made in a coroutine's step
    (``Client.sync``: ``client.gather``, ``Future.result``, ``scatter``,
    ``Event.wait``, ``Lock.acquire``, ...) secede once they have waited
    ``secede_after()`` seconds without an answer, and rejoin after, as inside
    ``worker_client``: a body waiting on them then holds no seat of the
    worker's pool, so it cannot deadlock a worker of one thread. A call
    answered sooner (``Event.set``, a free ``Lock``) keeps the seat, as in a
    plain task; 0 secedes before every call, None never. Once per worker:
    ``Worker._get_client`` (which ``get_client()`` calls, and makes the
    client on first use) is wrapped on the instance, and each client it
    gives has its ``sync`` wrapped."""
    if getattr(worker, "_dask_coro_seceding", False):
        return
    get = worker._get_client

    def _get_client(*args: Any, **kwargs: Any) -> Any:
        client = get(*args, **kwargs)
        if not getattr(client, "_dask_coro_seceding", False):
            client.sync = keeping_contract(client.sync, _seceding(client, client.sync, secede_after))
            client._dask_coro_seceding = True
        return client

    worker._get_client = keeping_contract(get, _get_client)
    worker._dask_coro_seceding = True
    _seceding_as_completed()


def _seceding_as_completed() -> None:
    """``distributed.as_completed``'s iteration in a coroutine's step
    secedes while it waits, and rejoins after, as a blocking call of the
    worker's client does (``seceding_waits``): its ``__next__`` does not go
    through ``Client.sync`` but waits on a ``threading.Condition`` until the
    client's loop puts a finished future in its ``queue``
    (``as_completed._track_future``), so on a worker of one thread the
    futures it waits for would never run. Only a ``__next__`` that would
    wait (``has_ready()`` False) secedes; elsewhere, and outside a
    coroutine's step, it is distributed's own. Once per process (the class
    is distributed's); ``next_batch(block=True)`` and ``batches()`` go
    through ``__next__`` too."""
    from distributed import as_completed

    next_ = as_completed.__next__
    if getattr(next_, "_dask_coro_seceding", False):
        return

    def __next__(self: Any) -> Any:
        if self.has_ready() or not in_coroutine_step():
            return next_(self)
        return seceded(next_, self)

    __next__._dask_coro_seceding = True  # type: ignore[attr-defined]
    as_completed.__next__ = __next__  # type: ignore[method-assign]


def _seceding(
    client: Any, sync: Callable[..., Any], secede_after: Callable[[], float | None]
) -> Callable[..., Any]:
    def sync_seceding(func: Any, *args: Any, asynchronous: Any = None, **kwargs: Any) -> Any:
        if client.asynchronous or asynchronous or not in_coroutine_step():
            return sync(func, *args, asynchronous=asynchronous, **kwargs)
        grace = secede_after()
        if grace is None:
            return sync(func, *args, asynchronous=asynchronous, **kwargs)
        if grace <= 0:
            return seceded(lambda: sync(func, *args, asynchronous=asynchronous, **kwargs))
        # What Client.sync does (distributed.utils.sync: the call runs on
        # the client's loop while this thread waits for it, up to
        # callback_timeout), with a first wait that ends after the grace:
        # a call still waiting then secedes.
        timeout = parse_timedelta(kwargs.pop("callback_timeout", None))
        answer = asyncio.run_coroutine_threadsafe(_called(func, args, kwargs, timeout), client.loop.asyncio_loop)
        deadline = None if timeout is None else monotonic() + timeout

        def answered(wait: float | None) -> Any:
            concurrent.futures.wait([answer], timeout=wait)
            if answer.done():
                return answer.result()
            if deadline is not None and monotonic() >= deadline:
                client.loop.add_callback(answer.cancel)
                raise TimeoutError(f"timed out after {timeout} s.")  # as distributed.utils.sync says it
            raise _StillWaiting

        try:
            return answered(grace if deadline is None else min(grace, timeout))
        except _StillWaiting:
            pass
        return seceded(lambda: answered(None if deadline is None else max(0.0, deadline - monotonic())))

    return sync_seceding


class _StillWaiting(Exception):
    pass


async def _called(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
) -> Any:
    """``func(*args, **kwargs)`` awaited, within ``timeout`` as
    ``distributed.utils.sync`` awaits it."""
    awaitable = func(*args, **kwargs)
    if timeout is not None:
        return await asyncio.wait_for(awaitable, timeout)
    return await awaitable


def future_in_memory(client: Any, key: Key) -> Any:
    """A ``Future`` of ``client`` for ``key``, which another client's task
    put in memory: finished already, so ``Client.gather`` asks who has it
    (``Future.__init__``'s ``state`` runs the client's handler for that
    state, ``Client._handle_key_in_memory``; the scheduler is not told that
    this client wants the key)."""
    from distributed import Future

    return Future(key, client, state="memory")  # type: ignore[arg-type]


def future_settled(future: Any) -> asyncio.Future[None]:
    """Done when ``future``'s client hears that its key finished, erred or was
    cancelled: the event of its ``FutureState`` (``Future._state``, set by
    ``finish``/``set_error``/``cancel``, cleared by ``lose``/``reset``), which
    every waiting path of ``Client`` awaits. One loop future among the event's
    waiters, as ``asyncio.Event.wait`` adds, without the task and coroutines
    around it (``Client.gather`` waits through a task per future,
    ``utils.All``); cancelling it takes it off the event."""
    event = future._state._get_event()
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if event.is_set():
        waiter.set_result(None)
        return waiter
    waiters = event._waiters  # asyncio.Event.set sets each of them
    waiters.append(waiter)

    def leave(_: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            waiters.remove(waiter)

    waiter.add_done_callback(leave)
    return waiter


def client_holds(client: Any, key: Key) -> bool:
    """Whether ``client`` still has a Future of ``key`` (``Client.refcount``)."""
    return client.refcount.get(key, 0) > 0


def send_on_client_stream(client: Any, msg: dict[str, Any]) -> None:
    """Send ``msg`` on the client's batched stream, ordered with its graph
    submissions (``Client._send_to_scheduler``)."""
    client._send_to_scheduler(msg)


def get_in_order(client: Any, graph: Any, keys: list[Key]) -> list[Any]:
    """``client.get(graph, keys, sync=False)``, the futures of ``keys``, with
    the graph's order given: each task's priority is its place among
    ``graph``'s keys (dependencies first), so ``Scheduler.update_graph`` does
    not order the graph with ``dask.order.order`` on its offload thread, one
    thread hop less before the tasks are assigned (it orders only when the
    message has no ``internal_priority``; ``Scheduler._set_priorities`` gives
    a task missing from it no priority, so every key of the graph is in it).
    ``Client.get`` takes no order; ``Client._graph_to_futures``, which it
    calls, does. For small graphs whose order does not matter."""
    from dask._expr import HLGExpr, LLGExpr
    from distributed.spans import SpanMetadata

    order = {k: i for i, k in enumerate(graph.keys())}
    expr = HLGExpr(graph) if isinstance(graph, HighLevelGraph) else LLGExpr(graph)
    futures = client._graph_to_futures(
        expr=expr,
        keys=set(keys),
        span_metadata=SpanMetadata(collections=[{"type": "low-level-graph"}]),
        internal_priority=order,
        fifo_timeout="60s",  # Client.get's default
    )
    return [futures[k] for k in keys]


def collections_message(expr: Any, graph: dict[Key, Any], collections: list[Any]) -> tuple[Any, Any]:
    """What ``Client.compute(collections)`` sends, built where the caller
    runs (a coroutine's lane, as a ``worker_client`` task builds it in its
    own thread), for ``send_serialized`` to send from the event loop:
    ``expr`` (the finalized, optimized expression of the collections) with
    the tasks of ``graph`` beside it, in one ``_ExprSequence``, already
    serialized (``Client._graph_to_futures`` serializes ``to_serialize(expr)``;
    ``distributed.protocol.serialize`` hands a ``Serialized`` back as it is),
    and the span metadata ``Client.compute`` gives it
    (``get_collections_metadata``). The scheduler materializes the tasks
    (``_materialize_graph``), as for ``Client.compute``."""
    from dask._expr import LLGExpr, _ExprSequence
    from distributed.client import get_collections_metadata
    from distributed.protocol.serialize import Serialized, serialize, to_serialize
    from distributed.spans import SpanMetadata

    whole = _ExprSequence(expr, LLGExpr(graph))
    ser = Serialized(*serialize(to_serialize(whole), on_error="raise"))
    return ser, SpanMetadata(collections=[get_collections_metadata(c) for c in collections])


def serialized_graph(graph: Any) -> Any:
    """``graph`` (a dict, or a ``HighLevelGraph`` from ``annotated_graph``)
    as ``Client.get`` would send it, serialized where the caller runs
    (``collections_message``), with ``Client.get``'s span metadata."""
    from dask._expr import HLGExpr, LLGExpr
    from distributed.protocol.serialize import Serialized, serialize, to_serialize
    from distributed.spans import SpanMetadata

    expr = HLGExpr(graph) if isinstance(graph, HighLevelGraph) else LLGExpr(graph)
    ser = Serialized(*serialize(to_serialize(expr), on_error="raise"))
    return ser, SpanMetadata(collections=[{"type": "low-level-graph"}])


def send_serialized(client: Any, message: tuple[Any, Any], keys: list[Key]) -> list[Any]:
    """Send a ``collections_message`` (or a ``serialized_graph``) as ``Client.compute`` sends its
    expression (``Client._graph_to_futures``: the ``dask.annotate`` in effect,
    ``thread_state.key`` as the submitting task, ``fifo_timeout`` 60 s);
    the futures of ``keys``."""
    ser, metadata = message
    futures = client._graph_to_futures(
        expr=ser, keys=set(keys), span_metadata=metadata, fifo_timeout="60s"
    )
    return [futures[k] for k in keys]


def flush_client_stream(client: Any) -> None:
    """Send what the client's batched stream holds on the event loop's next
    turn, not at the end of its batch interval (``flush_stream``)."""
    flush_stream(getattr(client, "scheduler_comm", None))


def set_batch_interval(client: Any, seconds: float) -> None:
    """How long the client's batched stream gathers messages before it sends
    (``Client.scheduler_comm``, a ``BatchedSend`` with ``interval``)."""
    comm = getattr(client, "scheduler_comm", None)
    if comm is not None:
        comm.interval = seconds


def own_scheduler_rpc(client: Any, worker: Any) -> bool:
    """Give ``client`` a scheduler RPC of its own pool if it talks to the
    scheduler through the connection pool of a worker other than ``worker``;
    whether it did.

    A client a worker makes (``Worker._get_client``) is handed that worker's
    ``PooledRPCCall`` to the scheduler, which ``Client.__init__`` keeps as
    ``client.scheduler``; ``_get_client`` also makes it the process's default
    client, so every other worker of the process adopts it
    (dask/distributed #3921 notes the sharing). When the worker that made it
    closes its pool (``Worker.close``: ``self.rpc.close()``), every RPC of the
    client (``who_has`` in ``gather``, ``scheduler_info``) raises
    ``RuntimeError('ConnectionPool is closed')`` on the workers that remain.
    Re-pointed at ``client.rpc`` (the client's own ``ConnectionPool``, which
    a client made from an address uses), it outlives that worker. A client on
    its own worker's pool is left alone: the two close together."""
    current = client.scheduler
    if not isinstance(current, PooledRPCCall):
        return False
    if current.pool is client.rpc or current.pool is worker.rpc:
        return False
    client.scheduler = client.rpc(current.addr)
    return True


# -- a client's submissions, kept across a reconnect ----------------------------

#: What ``watch_submissions`` and ``keeping_on_reconnect`` wrapped (the class's own methods).
_ORIGINAL: dict[str, Any] = {}


def watch_submissions(seen: Callable[[Any, Key | None, tuple[Any, ...], dict[str, Any]], None]) -> None:
    """Once per process: ``seen(client, task, args, kwargs)`` after each
    graph a ``Client`` sends (``Client._graph_to_futures``, which
    ``compute``, ``persist``, ``get`` and ``submit`` call), ``task`` the key
    of the task submitting it (``thread_state.key``, as the message's
    ``submitting_task``; None outside a task). ``submit_again(client, args,
    kwargs)`` sends the same graph, with the same keys. What ``seen``
    raises is logged: the submission is sent already."""
    from distributed import Client

    if "_graph_to_futures" in _ORIGINAL:
        return
    original = _ORIGINAL["_graph_to_futures"] = Client._graph_to_futures

    def _graph_to_futures(self: Any, *args: Any, **kwargs: Any) -> Any:
        futures = original(self, *args, **kwargs)
        try:
            seen(self, getattr(thread_state, "key", None), args, kwargs)
        except Exception:
            logger.exception("dask_coro: a submission not recorded")
        return futures

    Client._graph_to_futures = keeping_contract(original, _graph_to_futures)  # type: ignore[method-assign]


def submission_keys(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Key]:
    """The keys of a submission ``watch_submissions`` saw (its ``keys``)."""
    keys = args[1] if len(args) > 1 else kwargs["keys"]
    return list(keys)


def submission_expr(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The expression of a submission ``watch_submissions`` saw (its ``expr``)."""
    return args[0] if args else kwargs["expr"]


def submit_again(client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Send a submission ``watch_submissions`` saw again, with its keys (the
    futures it makes are let go of: the caller's own hold them)."""
    original = _ORIGINAL.get("_graph_to_futures") or type(client)._graph_to_futures
    original(client, *args, **kwargs)


def keeping_on_reconnect(held: Callable[[Any], list[tuple[tuple[Any, ...], dict[str, Any]]]]) -> None:
    """Once per process: a ``Client`` that lost its scheduler's connection
    while running (``Client._reconnect``, from ``_handle_report``: it
    cancels every future, then connects again to the same address,
    dask/distributed #436) keeps the futures of the submissions
    ``held(client)`` gives (``watch_submissions``'s ``args, kwargs``):
    pending while it reconnects (their ``FutureState``, which the user's
    ``Future`` objects hold, taken out of ``client.futures`` before the
    cancel, reset, and put back), then sent again with their keys to the
    scheduler it connected to, whose answers finish them as they would have
    the first time. If it never connects (it closes), they are cancelled as
    the others were."""
    from distributed import Client

    if "_reconnect" in _ORIGINAL:
        return
    original = _ORIGINAL["_reconnect"] = Client._reconnect

    async def _reconnect(self: Any) -> None:
        try:
            again = held(self)
        except Exception:
            logger.exception("dask_coro: the submissions to send again not found")
            again = []
        kept: dict[Key, Any] = {}
        for args, kwargs in again:
            for key in submission_keys(args, kwargs):
                state = self.futures.pop(key, None)
                if state is not None:
                    state.reset()
                    kept[key] = state
        await original(self)
        if not kept:
            return
        if self.status != "running":
            for state in kept.values():
                state.cancel(
                    reason="scheduler-connection-lost",
                    msg="Client lost the connection to the scheduler and could not connect again.",
                )
            return
        for key, state in kept.items():
            self.futures.setdefault(key, state)
        for args, kwargs in again:
            submit_again(self, args, kwargs)

    Client._reconnect = keeping_contract(original, _reconnect)  # type: ignore[method-assign]
