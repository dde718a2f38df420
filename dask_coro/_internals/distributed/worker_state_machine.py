"""``distributed.worker_state_machine``: the worker's ``WorkerState`` and its
``TaskState`` (a task's state, priority, annotations, resources), and the
events a coroutine sends it (seceding from the event loop, releasing keys,
lending and taking back resources).
"""

from __future__ import annotations

from dataclasses import dataclass
from time import time
from typing import Any

from dask.typing import Key
from distributed.worker_state_machine import SecedeEvent, StateMachineEvent, WorkerState


def worker_task_annotations(worker: Any, key: Key) -> dict[str, Any]:
    """The annotations the scheduler sent with ``key`` to this worker
    (``WorkerTaskState.annotations``, from the compute-task message), or {}."""
    ts = worker.state.tasks.get(key)
    return dict(ts.annotations or {}) if ts is not None else {}


def worker_task_function(worker: Any, key: Key) -> Any:
    """The function of ``key``'s task on this worker (``WorkerTaskState.run_spec``,
    a ``dask.Task``: its ``func``), or None (unknown key, no run_spec)."""
    ts = worker.state.tasks.get(key)
    return getattr(getattr(ts, "run_spec", None), "func", None)


def worker_task_gives_data(worker: Any, key: Key) -> bool:
    """Whether ``key``'s task on this worker only gives a value its graph
    carried (its ``run_spec`` a ``DataNode``): nothing was computed."""
    from ..dask_private import DataNode

    ts = worker.state.tasks.get(key)
    return ts is not None and isinstance(ts.run_spec, DataNode)


def worker_task_error(worker: Any, key: Key) -> BaseException | None:
    """The error ``key``'s task raised on this worker, if it is in state
    ``error`` there (``WorkerTaskState.exception``: a ``Serialize`` of the
    bytes this worker pickled it to, ``distributed.core.error_message``),
    else None."""
    from distributed.protocol.pickle import loads

    ts = worker.state.tasks.get(key)
    if ts is None or ts.state != "error" or ts.exception is None:
        return None
    error = getattr(ts.exception, "data", None)
    if isinstance(error, bytes):
        try:
            error = loads(error)
        except Exception:
            return None
    return error if isinstance(error, BaseException) else None


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


def worker_free_slots(worker: Any) -> int:
    """Thread slots of the worker's state machine no executing task takes
    (a seceded task is ``long_running`` and takes none), as
    ``WorkerState._ensure_computing`` counts them."""
    state = worker.state
    return state.nthreads - len(state.executing)


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


def fetch_only_from_here_missing(worker: Any, who_has: dict[Key, Any], stimulus_id: str) -> None:
    """Before a ``compute-task`` with ``who_has``: a dependency this worker
    is fetching, which the message says only this worker holds, is made
    ``missing`` first, as ``RefreshWhoHasEvent`` does
    (``WorkerState._handle_refresh_who_has``). It happens when this worker
    released its copy on its own (worker release) and the other holder was
    lost before the scheduler heard: ``WorkerState._handle_compute_task``
    then drops this worker from ``who_has`` (``_update_who_has``) and leaves
    the dependency in ``fetch`` with no holder, where nothing fetches it
    (distributed's validation raises ``InvalidTaskState``). ``missing`` asks
    the scheduler again (``find_missing``), which by then has the release
    and computes the key again."""
    from distributed.worker_state_machine import RefreshWhoHasEvent

    here = worker.address
    tasks = worker.state.tasks
    gone = [
        k
        for k, holders in who_has.items()
        if (ts := tasks.get(k)) is not None and ts.state == "fetch" and not set(holders) - {here}
    ]
    if gone:
        worker.handle_stimulus(RefreshWhoHasEvent(who_has={k: [] for k in gone}, stimulus_id=stimulus_id))


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
