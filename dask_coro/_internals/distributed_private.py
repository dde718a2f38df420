"""Every use of distributed's private or undocumented API, in one place.

Checked against distributed 2026.8.0. Each function names what it relies on;
``tests/test_internals.py`` pins each assumption against the installed
distributed, so a release that changes one fails a named test instead of
hanging somewhere. Only the adapters (runners, plugins) import this module:
importing it imports distributed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import heapq
import math
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import monotonic, time
from typing import Any

from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.typing import Key
from dask.utils import parse_timedelta
from distributed.comm import CommClosedError
from distributed.core import PooledRPCCall, Status, error_message
from distributed.threadpoolexecutor import thread_state as pool_thread_state
from distributed.utils import iscoroutinefunction
from distributed.worker import _worker_cvar, thread_state
from distributed.worker_state_machine import SecedeEvent, StateMachineEvent, WorkerState

from .dask_private import Alias

# -- worker ------------------------------------------------------------------


def worker_task_annotations(worker: Any, key: Key) -> dict[str, Any]:
    """The annotations the scheduler sent with ``key`` to this worker
    (``WorkerTaskState.annotations``, from the compute-task message), or {}."""
    ts = worker.state.tasks.get(key)
    return dict(ts.annotations or {}) if ts is not None else {}


def worker_task_state(worker: Any, key: Key) -> str | None:
    """The state of ``key`` in the worker's state machine, or None if the
    worker does not know it (``Worker.state.tasks``, a dict of TaskState)."""
    ts = worker.state.tasks.get(key)
    return None if ts is None else ts.state


def worker_next_ready(worker: Any) -> Key | None:
    """The key of the task the worker would start next when a thread slot
    frees (``WorkerState._next_ready_task``: the best of ``ready`` and
    ``constrained``, by priority), or None if none waits."""
    state = worker.state
    best = None
    for queue in (state.ready, state.constrained):
        if queue:
            ts = queue.peek()
            if best is None or ts.priority < best.priority:
                best = ts
    return None if best is None else best.key


def worker_slots_full(worker: Any) -> bool:
    """Whether every thread slot of the worker's state machine is taken by
    an executing task (``WorkerState._ensure_computing`` starts a ready task
    only while ``len(executing) < nthreads``; a seceded task is
    ``long_running`` and takes none)."""
    state = worker.state
    return len(state.executing) >= state.nthreads


def worker_task_priority(worker: Any, key: Key) -> tuple[Any, ...]:
    """The priority the scheduler gave ``key`` (``TaskState.priority`` on the
    worker is the scheduler's, from ``ComputeTaskEvent.priority``, plus the
    worker's own generation, a count down by arrival, which we leave off);
    ``()`` if the worker does not know it."""
    ts = worker.state.tasks.get(key)
    if ts is None or not ts.priority:
        return ()
    return tuple(ts.priority[:-1])


def worker_knows(worker: Any, key: Key) -> bool:
    """Whether ``key`` is still in the worker's state machine (it is popped
    when the key leaves the worker)."""
    return key in worker.state.tasks


def async_tasks_executing(worker: Any) -> list[Key]:
    """Keys of the async tasks (``Task.is_coro``) executing on ``worker``:
    ``Worker.active_keys`` and each task's ``run_spec``."""
    out = []
    for k in worker.active_keys:
        ts = worker.state.tasks.get(k)
        if ts is not None and ts.run_spec is not None and getattr(ts.run_spec, "is_coro", False):
            out.append(k)
    return out


def thread_task_key() -> Key | None:
    """The key distributed set for the task running in this thread
    (``distributed.worker._run_task`` sets ``thread_state.key``), or None."""
    return getattr(thread_state, "key", None)


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


class PoolSeat:
    """What a coroutine step on a lane thread holds of the worker's pool, as
    ``thread_state.executor`` of that thread: the part of distributed's
    ``ThreadPoolExecutor`` that ``distributed.threadpoolexecutor.secede`` and
    ``rejoin`` use, so ``distributed.secede()``, ``rejoin()``,
    ``worker_client()`` and a blocking ``Client.get`` (which secedes when
    ``thread_state.key`` is set) keep their meaning in a body.

    ``secede`` removes the thread from ``executor._threads`` (``KeyError`` if
    it is not there: ``worker_client`` reads that as "seceded already") and
    calls ``_adjust_thread_count``; ``rejoin`` appends ``(thread, event)`` to
    ``_rejoin_list`` under ``_rejoin_lock``, calls ``submit(lambda: None)``
    and waits for ``event``. Here ``leave()`` is called for the first and
    ``join(event)`` for the second: the caller lets go of its pool thread, or
    takes one again and sets ``event`` once it has it."""

    def __init__(self, leave: Callable[[], None], join: Callable[[Any], None]):
        self._threads = _SeatThreads(leave)
        self._rejoin_lock = threading.Lock()
        self._rejoin_list = _SeatRejoins(join)

    def _adjust_thread_count(self) -> None:
        pass  # the pool makes a thread for the seat let go of by itself

    def submit(self, fn: Callable[[], Any]) -> None:
        fn()  # rejoin's wake-up call of the pool: nothing to wake here


class _SeatThreads:
    def __init__(self, leave: Callable[[], None]):
        self.leave = leave

    def remove(self, thread: Any) -> None:
        self.leave()  # raises KeyError when the seat is not held


class _SeatRejoins(list[Any]):
    def __init__(self, join: Callable[[Any], None]):
        super().__init__()
        self.join = join

    def append(self, item: Any) -> None:
        _thread, event = item
        self.join(event)


def in_coroutine_step() -> bool:
    """Whether this thread runs a coroutine's step holding a seat of the
    worker's pool (``set_task_thread`` gave it a ``PoolSeat``)."""
    return type(getattr(pool_thread_state, "executor", None)) is PoolSeat


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
        return _seceded(next_, self)

    __next__._dask_coro_seceding = True  # type: ignore[attr-defined]
    as_completed.__next__ = __next__  # type: ignore[method-assign]


def _seceded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` seceded from the worker's pool, unless this
    thread seceded already (``worker_client``, a blocking compute)."""
    from distributed import rejoin, secede

    try:
        secede()
    except KeyError:  # seceded already
        return fn(*args, **kwargs)
    try:
        return fn(*args, **kwargs)
    finally:
        rejoin()


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
            return _seceded(lambda: sync(func, *args, asynchronous=asynchronous, **kwargs))
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
        return _seceded(lambda: answered(None if deadline is None else max(0.0, deadline - monotonic())))

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


def set_task_thread(key: Key | None, start_time: float = 0.0, seat: PoolSeat | None = None) -> None:
    """Make this thread look like one of the worker's pool threads running
    task ``key`` to distributed, or, with None, like no task's:
    ``thread_state.key`` and ``start_time`` (``distributed.utils.thread_state``,
    as ``distributed.worker._run_task`` sets them) and the pool's own
    ``thread_state.executor`` (``distributed.threadpoolexecutor.thread_state``,
    as its ``_worker`` sets it)."""
    if key is None:
        thread_state.__dict__.pop("key", None)
        thread_state.__dict__.pop("start_time", None)
        pool_thread_state.__dict__.pop("executor", None)
        return
    thread_state.key = key
    thread_state.start_time = start_time
    pool_thread_state.executor = seat


def secede_from_loop(worker: Any, key: Key, compute_duration: float) -> None:
    """Turn executing task ``key`` into a long-running one, as
    ``distributed.secede()`` does from a thread, but from the event loop: the
    ``SecedeEvent`` frees its slot on worker and scheduler
    (``WorkerState._handle_secede``); there is no thread to hand back."""
    worker.handle_stimulus(
        SecedeEvent(
            key=key,
            compute_duration=compute_duration,
            stimulus_id=f"dask-coro-secede-{time()}",
        )
    )


# A waiting coroutine's resources (resources/worker.py). distributed counts a
# running task's resources as ``WorkerState.available_resources`` less the
# ``resource_restrictions`` of every task in ``executing | long_running``
# (``WorkerState._validate_resources``): ``_ensure_computing`` subtracts them
# when a task starts, ``_execute_done_common`` adds back whatever
# ``ts.resource_restrictions`` says when it ends. Lending moves a long-running
# task's restrictions into ``available_resources`` and empties them, so the
# sum holds at every step and a task that ends while they are lent gives back
# nothing; taking moves them back. Both are events of the worker's state
# machine, so the transitions they allow (a constrained task that may now
# start) are carried out at once, as for any stimulus.


@dataclass
class CoroResourcesLentEvent(StateMachineEvent):
    """A waiting coroutine gives back its task's resources."""

    __slots__ = ("key",)
    key: Key


@dataclass
class CoroResourcesTakenEvent(StateMachineEvent):
    """A coroutine takes back the resources it lent, before its body goes on."""

    __slots__ = ("key", "resources")
    key: Key
    resources: dict[str, float]


def _handle_resources_lent(state: Any, ev: CoroResourcesLentEvent) -> Any:
    ts = state.tasks.get(ev.key)
    if ts is None or ts.state != "long-running" or not ts.resource_restrictions:
        return {}, []
    for resource, needed in ts.resource_restrictions.items():
        state.available_resources[resource] += needed
    ts.resource_restrictions = {}
    return state._ensure_computing()  # a constrained task may start now


def _handle_resources_taken(state: Any, ev: CoroResourcesTakenEvent) -> Any:
    ts = state.tasks.get(ev.key)
    if ts is None or ts not in state.long_running or ts.resource_restrictions:
        return {}, []  # ended, or cancelled meanwhile: nothing to take
    for resource, needed in ev.resources.items():
        state.available_resources[resource] -= needed
    ts.resource_restrictions = dict(ev.resources)
    return {}, []


# ``WorkerState._handle_event`` is a ``functools.singledispatchmethod`` over
# the event's class, as ``WorkerState.handle_stimulus`` calls it.
_dispatch: Any = WorkerState._handle_event
_dispatch.register(CoroResourcesLentEvent, _handle_resources_lent)
_dispatch.register(CoroResourcesTakenEvent, _handle_resources_taken)


def task_resources(worker: Any, key: Key) -> dict[str, float]:
    """What the long-running task ``key`` holds of the worker's resources
    (``TaskState.resource_restrictions``); empty if none, or not long-running."""
    ts = worker.state.tasks.get(key)
    if ts is None or ts.state != "long-running":
        return {}
    return dict(ts.resource_restrictions or {})


def task_run_id_priority(worker: Any, key: Key) -> tuple[int, tuple[Any, ...]] | None:
    """The run id of task ``key`` on this worker (``TaskState.run_id``, which
    the scheduler checks on each message about it) and its priority
    (``TaskState.priority``: lower runs first); None if the worker forgot it."""
    ts = worker.state.tasks.get(key)
    if ts is None:
        return None
    return ts.run_id, tuple(ts.priority or ())


def available_resources(worker: Any) -> dict[str, float]:
    """The worker's resources no running task holds (``WorkerState.available_resources``)."""
    return dict(worker.state.available_resources)


def total_resources(worker: Any) -> dict[str, float]:
    """The resources the worker was started with (``WorkerState.total_resources``)."""
    return dict(worker.state.total_resources)


def lend_resources(worker: Any, key: Key) -> dict[str, float]:
    """Give back what the long-running task ``key`` holds of the worker's
    resources (``CoroResourcesLentEvent``); what it gave back, or empty."""
    lent = task_resources(worker, key)
    if lent:
        worker.handle_stimulus(CoroResourcesLentEvent(key=key, stimulus_id=f"dask-coro-lend-{time()}"))
    return lent


def take_resources(worker: Any, key: Key, resources: dict[str, float]) -> bool:
    """Take ``resources`` back for the long-running task ``key`` if the worker
    has them free (``CoroResourcesTakenEvent``); whether it did."""
    state = worker.state
    ts = state.tasks.get(key)
    if ts is None or ts.state != "long-running" or ts.resource_restrictions:
        return False
    if any(state.available_resources.get(r, 0) < n for r, n in resources.items()):
        return False
    worker.handle_stimulus(
        CoroResourcesTakenEvent(key=key, resources=dict(resources), stimulus_id=f"dask-coro-take-{time()}")
    )
    return True


def worker_plugin(worker: Any, name: str) -> Any:
    """The worker plugin registered as ``name``, or None (``Worker.plugins``)."""
    return worker.plugins.get(name)


def add_worker_plugin_now(worker: Any, name: str, factory: Callable[[], Any]) -> Any:
    """The plugin ``name``, added synchronously if missing. ``Worker.plugins``
    is the dict ``WorkerState._notify_plugins`` reads; ``Worker.plugin_add``
    is a coroutine and would replace an existing plugin."""
    plugin = worker.plugins.get(name)
    if plugin is None:
        plugin = worker.plugins[name] = factory()
    return plugin


def default_executor(worker: Any) -> Any:
    """The thread pool the worker runs tasks on (``Worker.executors``)."""
    return worker.executors["default"]


@contextlib.contextmanager
def as_worker(worker: Any) -> Iterator[None]:
    """``get_worker()`` answers ``worker`` here, as inside a task
    (``Worker.execute`` sets the ``_worker_cvar`` ContextVar)."""
    token = _worker_cvar.set(worker)
    try:
        yield
    finally:
        _worker_cvar.reset(token)


def worker_is_closing(worker: Any) -> bool:
    return worker.status in (Status.closing, Status.closing_gracefully, Status.closed)


def worker_dependent_states(worker: Any, key: Key) -> list[str]:
    """The states of the tasks of this worker that depend on ``key``
    (``TaskState.dependents`` in ``Worker.state``)."""
    ts = worker.state.tasks.get(key)
    return [] if ts is None else [d.state for d in ts.dependents]


def release_own_keys(worker: Any, keys: list[Key], stimulus_id: str) -> None:
    """Release ``keys`` here as ``free-keys`` from the scheduler would
    (``FreeKeysEvent`` through ``Worker.handle_stimulus``); the memory ->
    released transition tells the scheduler (``ReleaseWorkerDataMsg``, op
    ``release-worker-data``, with this stimulus_id)."""
    from distributed.worker_state_machine import FreeKeysEvent

    worker.handle_stimulus(FreeKeysEvent(keys=keys, stimulus_id=stimulus_id))


def store_own_data(worker: Any, data: dict[Key, Any]) -> None:
    """Put ``data`` in the worker's memory as ``Client.scatter`` does from
    inside a task (``Worker.update_data``: an ``UpdateDataEvent``, which
    tells the scheduler nothing; ``Scheduler.update_data`` does)."""
    worker.update_data(data=data, stimulus_id="dask-coro-stream-emit")


def future_in_memory(client: Any, key: Key) -> Any:
    """A ``Future`` of ``client`` for ``key``, which another client's task
    put in memory: finished already, so ``Client.gather`` asks who has it
    (``Future.__init__``'s ``state`` runs the client's handler for that
    state, ``Client._handle_key_in_memory``; the scheduler is not told that
    this client wants the key)."""
    from distributed import Future

    return Future(key, client, state="memory")  # type: ignore[arg-type]


def fast_memory_value(worker: Any, key: Key) -> Any:
    """The value of ``key`` if it is in the worker's fast (in-memory) store,
    without reading spilled data back (``Worker.data.fast`` of a SpillBuffer)."""
    data = worker.data
    return data.fast.get(key) if hasattr(data, "fast") else data.get(key)


def local_data(worker: Any, keys: list[Key]) -> list[Any] | None:
    """The values of ``keys`` if every one is in memory on this worker (its
    state machine's task in state ``memory``, the value in ``Worker.data``,
    spilled or not), else None. Call on the worker's event loop, which owns
    ``Worker.data``."""
    tasks = worker.state.tasks
    data = worker.data
    out = []
    for k in keys:
        ts = tasks.get(k)
        if ts is None or ts.state != "memory":
            return None
        try:
            out.append(data[k])
        except KeyError:
            return None
    return out


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


def send_on_worker_stream(worker: Any, msg: dict[str, Any]) -> None:
    """Send ``msg`` on the worker's batched stream to the scheduler, ordered
    with its task-finished messages (``Worker.batched_stream``)."""
    worker.batched_stream.send(msg)


# -- client ------------------------------------------------------------------


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


def flush_stream(stream: Any) -> None:
    """Have a ``BatchedSend`` send what it holds on the event loop's next
    turn. ``BatchedSend._background_send`` sends a message at once only when
    the stream sent nothing in the last ``interval``; otherwise it waits for
    ``next_deadline``, the end of the interval that began with the last batch.
    Clearing the deadline and waking the sender sends now (one batch more);
    the order of messages is kept. Call on the stream's event loop."""
    if stream is None or stream.comm is None or not stream.buffer:
        return
    stream.next_deadline = None
    stream.waker.set()


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


# -- scheduler ---------------------------------------------------------------


def add_handlers(
    server: Any,
    rpc: dict[str, Callable[..., Any]] | None = None,
    stream: dict[str, Callable[..., Any]] | None = None,
) -> None:
    """Answer RPCs (``Server.handlers``) and batched-stream messages
    (``Server.stream_handlers``) of these names."""
    server.handlers.update(rpc or {})
    if stream:
        server.stream_handlers.update(stream)


def keeping_contract(original: Callable[..., Any], wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper``, which stands in for ``original`` (a handler or a method
    of distributed), made to look like it to distributed: the same signature
    (``inspect.signature`` follows ``__wrapped__``), name and docstring.

    distributed decides how to call a handler by inspecting it:
    ``Server.handle_comm`` passes the comm if its first parameter is named
    ``comm`` (``distributed.core._expects_comm``) and passes the asking side's
    ``serializers`` back in only if it has that keyword
    (``distributed.utils.has_keyword``); ``Server.handle_stream`` awaits a
    stream handler only if it is a coroutine function
    (``distributed.utils.iscoroutinefunction``). A wrapper taking
    ``**kwargs`` would hide ``serializers``, and a client that refuses pickle
    would get its results pickled. So the signature is the original's, and a
    wrapper that is not async where the original is (or the reverse) is
    refused. ``updated=()``: the original's attributes (another wrapper's
    mark) are not copied onto this one."""
    if _is_async(wrapper) != _is_async(original):
        raise TypeError(
            f"{wrapper!r} stands in for {original!r}: both must be coroutine functions, or neither"
        )
    return functools.update_wrapper(wrapper, original, updated=())


def _is_async(f: Callable[..., Any]) -> bool:
    return bool(iscoroutinefunction(f))


def _wrap_handler(table: dict[str, Any], op: str, wrap: Callable[[Any], Any], mark: str) -> None:
    """Replace ``table[op]`` by ``wrap(table[op])``, once (``mark`` names the
    attribute that says it is wrapped already), keeping the handler's
    contract (``keeping_contract``)."""
    handler = table.get(op)
    if handler is None or getattr(handler, mark, False):
        return
    wrapped = keeping_contract(handler, wrap(handler))
    setattr(wrapped, mark, True)
    table[op] = wrapped


def wrap_stream_handler(server: Any, op: str, wrap: Callable[[Any], Any], mark: str) -> None:
    """Replace the stream handler of ``op`` (``Server.stream_handlers``) by
    ``wrap(handler)``, once."""
    _wrap_handler(server.stream_handlers, op, wrap, mark)


def wrap_rpc_handler(server: Any, op: str, wrap: Callable[[Any], Any], mark: str) -> None:
    """Replace the RPC handler of ``op`` (``Server.handlers``) by
    ``wrap(handler)``, once."""
    _wrap_handler(server.handlers, op, wrap, mark)


def worker_of_this_process() -> Any:
    """The one ``Worker`` this process runs, or None (none, or several as in
    an in-process cluster): ``Worker._instances``, a WeakSet of every Worker
    made in the process, closed ones included."""
    from distributed.worker import Worker

    live = [w for w in list(Worker._instances) if w.status not in (Status.closed, Status.closing)]
    return live[0] if len(live) == 1 else None


def process_role() -> str:
    """Which process this is, for an error message: "worker <address>", "the
    scheduler <address>", else "process <pid>" (``Worker._instances`` and
    ``Scheduler._instances``, WeakSets of the servers made in the process)."""
    import os

    from distributed import Scheduler

    worker = worker_of_this_process()
    if worker is not None:
        return f"worker {worker.address}"
    schedulers = [s for s in list(Scheduler._instances) if s.status not in (Status.closed, Status.closing)]
    if len(schedulers) == 1:
        return f"the scheduler {schedulers[0].address}"
    return f"process {os.getpid()}"


def scheduler_plugin(scheduler: Any, name: str) -> Any:
    """The scheduler plugin of that name, or None (``Scheduler.plugins``)."""
    return scheduler.plugins.get(name)


def store_worker_plugin(scheduler: Any, name: str, pickled: bytes) -> None:
    """Give every worker joining from now on this worker plugin
    (``Scheduler.worker_plugins``, sent by ``Scheduler.add_worker``)."""
    scheduler.worker_plugins[name] = pickled


def send_to_worker(scheduler: Any, worker: str, msg: dict[str, Any], now: bool = False) -> bool:
    """Send ``msg`` on the scheduler's batched stream to ``worker``
    (``Scheduler.stream_comms``, a ``BatchedSend``, which batches over 5 ms);
    with ``now``, on the loop's next turn even if the stream sent a batch less
    than 5 ms ago (``flush_stream``). False if it has none or it is closed
    (the worker is going). The worker must have a stream handler for
    ``msg["op"]``: an op it has none for closes the stream."""
    stream = scheduler.stream_comms.get(worker)
    if stream is None:
        return False
    try:
        stream.send(msg)
    except CommClosedError:
        return False
    if now:
        flush_stream(stream)
    return True


def processing_task(scheduler: Any, key: Key, worker: str, run_id: int) -> tuple[Any, Any] | None:
    """The ``TaskState`` of ``key`` and the ``WorkerState`` it is processing
    on, if that is ``worker`` and its run is ``run_id`` (a message of an
    older run is stale, as ``Scheduler.handle_long_running`` checks)."""
    ts = scheduler.tasks.get(key)
    if ts is None or ts.processing_on is None:
        return None
    ws = ts.processing_on
    if ws.address != worker or ts.run_id != run_id:
        return None
    return ts, ws


def count_resources(scheduler: Any, ws: Any, resources: dict[str, float], used: bool) -> None:
    """Count ``resources`` as used on ``ws`` (or, with ``used`` false, as
    given back): ``WorkerState.used_resources``, which
    ``Scheduler.acquire_resources`` adds to when a task starts processing
    there and ``release_resources`` subtracts from when it leaves (read by
    the dashboard only: placement reads the totals, ``ws.resources``). Only
    while ``ws`` is still the scheduler's worker of its address."""
    if scheduler.workers.get(ws.address) is not ws:
        return
    sign = 1 if used else -1
    for resource, needed in resources.items():
        ws.used_resources[resource] = ws.used_resources.get(resource, 0) + sign * needed


def used_resources(scheduler: Any, worker: str) -> dict[str, float]:
    """``WorkerState.used_resources`` of ``worker``."""
    return dict(scheduler.workers[worker].used_resources)


def idle_threads(scheduler: Any) -> int:
    """Free threads on running workers, less the tasks already waiting for one.

    A seceded (long-running) task holds no thread, as in distributed's own
    ``_task_slots_available``. With queuing on (finite
    ``Scheduler.WORKER_SATURATION``), ``Scheduler.idle_task_count`` holds
    exactly the workers that have a free slot; else look at them all."""
    if math.isinf(scheduler.WORKER_SATURATION):
        workers = scheduler.workers.values()
    else:
        workers = scheduler.idle_task_count
    free = 0
    for ws in workers:
        if ws.status == Status.running:
            free += max(0, ws.nthreads - (len(ws.processing) - len(ws.long_running)))
    return max(0, free - len(scheduler.queued) - len(scheduler.unrunnable))


def fail_task(scheduler: Any, key: Key, error: BaseException, stimulus_id: str) -> None:
    """Make ``key`` erred with ``error`` as if it had raised it
    (``Scheduler.transition(key, "erred", ...)`` with ``error_message``)."""
    msg = error_message(error)
    recs = scheduler.transition(
        key,
        "erred",
        stimulus_id,
        cause=key,
        exception=msg["exception"],
        traceback=msg["traceback"],
        exception_text=msg["exception_text"],
        traceback_text=msg["traceback_text"],
    )
    scheduler.transitions(recs, stimulus_id)


def forget_if_unused(scheduler: Any, key: Key, stimulus_id: str) -> bool:
    """Forget a released task nothing depends on, waits for or wants;
    answers whether it was."""
    ts = scheduler.tasks.get(key)
    if ts is None or ts.state != "released" or ts.dependents or ts.who_wants or ts.waiters:
        return False
    scheduler.transitions({key: "forgotten"}, stimulus_id)
    return True


def alias_task(s: Any, ts: Any, target: Any, stimulus_id: str) -> str | None:
    """Make task ``ts`` (a parked promise, ``no-worker``, or one already
    waiting on an earlier target) an alias of ``target``: its run_spec becomes
    ``Alias(ts -> target)`` and ``target`` its only dependency. Returns an
    error text, or None.

    The only function that edits scheduler TaskState fields directly
    (``run_spec``, ``resource_restrictions``, ``dependencies``/``dependents``,
    ``waiting_on``/``waiters``); run it with ``distributed.scheduler.validate``
    on in tests.
    """
    if ts.state not in ("no-worker", "waiting"):
        return f"cannot re-point it in state {ts.state!r}"
    if target.state == "erred" and ts.state == "waiting":
        return f"its new target {target.key!r} has already failed"
    ts.run_spec = Alias(ts.key, target.key)
    ts.resource_restrictions = None
    if ts.annotations:
        ts.annotations.pop("resources", None)
    if ts.state == "no-worker":
        ts.add_dependency(target)
        if target.state == "erred":
            blame = target.exception_blame or target
            recs = s.transition(
                ts.key,
                "erred",
                stimulus_id,
                cause=blame.key,
                exception=blame.exception,
                traceback=blame.traceback,
                exception_text=blame.exception_text,
                traceback_text=blame.traceback_text,
            )
        else:
            # no-worker -> released -> waiting: Scheduler._propagate_released
            # recommends "waiting" because the promise has waiters or is wanted,
            # and _transition_released_waiting waits for the new dependency.
            recs = s.transition(ts.key, "released", stimulus_id)
            if recs.get(ts.key) != "waiting":
                recs[ts.key] = "waiting"
        s.transitions(recs, stimulus_id)
        return None
    # "waiting" on the previous target: move the one dependency edge. The old
    # target is not released here; once done, it is released like any result
    # nobody waits for (Scheduler._add_to_memory).
    for dts in list(ts.dependencies):
        ts.dependencies.discard(dts)
        dts.dependents.discard(ts)
        if dts.waiters:
            dts.waiters.discard(ts)
    ts.waiting_on = None
    ts.add_dependency(target)
    recs = {}
    if target.who_has:
        recs[ts.key] = "processing"
    else:
        ts.waiting_on = {target}
        if target.waiters is None:
            target.waiters = set()
        target.waiters.add(ts)
        if target.state == "released":
            recs[target.key] = "waiting"
    s.transitions(recs, stimulus_id)
    return None


def queue_entries(scheduler: Any) -> int:
    """How many entries the heap of the scheduler's queue holds, stale ones
    included (``Scheduler.queued``, a ``HeapSet``: ``_heap``)."""
    return len(scheduler.queued._heap)


def drop_stale_queue_entries(scheduler: Any) -> int:
    """Rebuild the heap of the scheduler's queue with the entries whose task
    is the very ``TaskState`` in the queue; the number dropped.

    ``distributed.collections.HeapSet`` keeps a set (``_data``) and a heap of
    weak references (``_heap``); ``discard`` removes a task from the set
    only, and ``peek`` skips heap entries whose object is not in the set.
    TaskStates compare by key, so a forgotten TaskState still alive, whose
    key is queued again as a new TaskState, is found "in" the set: ``peek``
    hands back the forgotten object (dask/distributed #7504).
    ``Scheduler.stimulus_queue_slots_maybe_opened`` then transitions the key
    (the new task, correctly), but under ``distributed.scheduler.validate``
    asserts the peeked object's state first. O(queue)."""
    q = scheduler.queued
    ids = {id(ts) for ts in q._data}
    heap = [entry for entry in q._heap if id(entry[2]()) in ids]
    dropped = len(q._heap) - len(heap)
    if dropped:
        heapq.heapify(heap)
        q._heap = heap
        q._sorted = False
    return dropped


def adjust_suspicion(ts: Any, by: int, prefix: int = 0) -> None:
    """Change the count ``Scheduler.remove_worker`` keeps of how many lost
    workers a task was processing on (``TaskState.suspicious``, checked
    against ``allowed-failures`` right after it adds one; it may go below
    zero, as a credit) and its prefix's (``TaskPrefix.suspicious``, kept
    at zero or more)."""
    ts.suspicious += by
    if prefix:
        ts.prefix.suspicious = max(0, ts.prefix.suspicious + prefix)


def drop_client_state(scheduler: Any, client: str) -> None:
    """Forget a scheduler-side client that holds no key any more
    (``Scheduler.client_desires_keys`` made its ``ClientState`` on first use,
    as for ``Variable`` and ``Queue``; nothing removes it)."""
    cs = scheduler.clients.get(client)
    if cs is not None and not cs.wants_what:
        del scheduler.clients[client]


def scheduler_stream_open(worker: Any) -> bool:
    """Whether the worker's stream to its scheduler is up
    (``Worker.batched_stream``, whose comm closes when the scheduler goes;
    ``Worker.handle_scheduler`` then closes the worker)."""
    stream = getattr(worker, "batched_stream", None)
    comm = getattr(stream, "comm", None)
    return comm is not None and not comm.closed()


# -- scheduler dashboard -------------------------------------------------------


def dashboard_prefix(scheduler: Any) -> str | None:
    """The URL prefix (``""`` or ``"/<prefix>"``) of the scheduler's Bokeh
    dashboard, or None if it has none. ``distributed.dashboard.scheduler.connect``
    adds a ``BokehTornado`` to ``Scheduler.http_application`` (a
    ``RoutingApplication``, its ``applications`` list) only when the dashboard
    is on and bokeh imports; the Bokeh app's ``prefix`` is the scheduler's
    ``http_prefix``. Without bokeh imported there is no such app."""
    tornado_module = sys.modules.get("bokeh.server.tornado")
    app = getattr(scheduler, "http_application", None)
    if tornado_module is None or app is None:
        return None
    for sub in getattr(app, "applications", ()):
        if isinstance(sub, tornado_module.BokehTornado):
            return str(sub.prefix)
    return None


def add_http_routes(scheduler: Any, routes: list[tuple[str, Any, dict[str, Any]]]) -> None:
    """Serve these tornado routes on the scheduler's HTTP server, beside the
    dashboard (``Scheduler.http_application``, a tornado ``Application``:
    ``add_handlers`` takes effect for the next request)."""
    scheduler.http_application.add_handlers(r".*", routes)


def add_dashboard_page(scheduler: Any, page: str) -> None:
    """List ``page`` in the navigation bar of the dashboard's pages, before
    "info". ``distributed.dashboard.scheduler.template_variables`` is memoized
    per scheduler; every Bokeh page's template variables are a shallow copy of
    its answer (``BokehApplication``'s ``extra``), so they share its ``pages``
    list, which ``http/templates/base.html`` reads at each page load."""
    from distributed.dashboard.scheduler import template_variables

    pages = template_variables(scheduler)["pages"]
    if page not in pages:
        pages.insert(pages.index("info") if "info" in pages else len(pages), page)


_DASHBOARD_PAGE = '{% extends "base.html" %}{% block content %}{{ content }}{% endblock %}'


def render_dashboard_page(scheduler: Any, content: str) -> str:
    """A page in the dashboard's frame: distributed's ``http/templates/base.html``
    (its navigation bar, stylesheet and icons, by relative URLs) rendered with
    jinja2 as the Bokeh pages are (``distributed.dashboard.components.scheduler.env``,
    no autoescape), ``content`` (HTML) in its ``content`` block."""
    from distributed.dashboard.components.scheduler import env
    from distributed.dashboard.scheduler import template_variables

    return str(env.from_string(_DASHBOARD_PAGE).render(**template_variables(scheduler), content=content))
