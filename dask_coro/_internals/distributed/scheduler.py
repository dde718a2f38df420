"""``distributed.scheduler``: the ``Scheduler``'s plugins, streams to its
workers, and its ``TaskState``, ``WorkerState`` and ``ClientState``
(transitions, resources, suspicion, idle threads).
"""

from __future__ import annotations

import math
from typing import Any

from dask.typing import Key
from distributed.comm import CommClosedError
from distributed.core import Status, error_message

from ..dask_private import Alias
from .batched import flush_stream


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


def idle_threads(scheduler: Any, busy: dict[str, int] | None = None, at: dict[str, int] | None = None) -> int:
    """Free threads on running workers, less the tasks already waiting for one.

    A seceded (long-running) task holds no thread, as in distributed's own
    ``_task_slots_available``; ``busy`` (worker address -> threads) are the
    threads of a worker that such tasks took again without telling
    distributed (a coroutine's step after it seceded), taken off its free
    ones. With queuing on (finite ``Scheduler.WORKER_SATURATION``),
    ``Scheduler.idle_task_count`` holds exactly the workers that have a free
    slot; else look at them all. ``at``: ``idle_by_worker``'s answer, if
    the caller has it already."""
    if at is None:
        at = idle_by_worker(scheduler, busy)
    return max(0, sum(at.values()) - len(scheduler.queued) - len(scheduler.unrunnable))


def idle_by_worker(scheduler: Any, busy: dict[str, int] | None = None) -> dict[str, int]:
    """The free threads of each running worker that has any, counted as
    ``idle_threads`` counts them (before the tasks waiting for one)."""
    if math.isinf(scheduler.WORKER_SATURATION):
        workers = scheduler.workers.values()
    else:
        workers = scheduler.idle_task_count
    busy = busy or {}
    out: dict[str, int] = {}
    for ws in workers:
        if ws.status == Status.running:
            used = len(ws.processing) - len(ws.long_running) + busy.get(ws.address, 0)
            if ws.nthreads > used:
                out[ws.address] = ws.nthreads - used
    return out


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
