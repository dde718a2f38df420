"""``distributed.worker``: the ``Worker`` object (its plugins, executors,
data, the batched stream to the scheduler, its status), the state of the
thread a task runs in (``thread_state``, ``_worker_cvar``), and which
servers this process runs (``Worker._instances``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from dask.typing import Key
from distributed.core import Status
from distributed.worker import _worker_cvar, thread_state


def thread_task_key() -> Key | None:
    """The key distributed set for the task running in this thread
    (``distributed.worker._run_task`` sets ``thread_state.key``), or None."""
    return getattr(thread_state, "key", None)


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


def store_own_data(worker: Any, data: dict[Key, Any]) -> None:
    """Put ``data`` in the worker's memory as ``Client.scatter`` does from
    inside a task (``Worker.update_data``: an ``UpdateDataEvent``, which
    tells the scheduler nothing; ``Scheduler.update_data`` does)."""
    worker.update_data(data=data, stimulus_id="dask-coro-stream-emit")


def fast_memory_value(worker: Any, key: Key) -> Any:
    """The value of ``key`` if it is in the worker's fast (in-memory) store,
    without reading spilled data back (``Worker.data.fast`` of a SpillBuffer)."""
    data = worker.data
    return data.fast.get(key) if hasattr(data, "fast") else data.get(key)


def send_on_worker_stream(worker: Any, msg: dict[str, Any]) -> None:
    """Send ``msg`` on the worker's batched stream to the scheduler, ordered
    with its task-finished messages (``Worker.batched_stream``)."""
    worker.batched_stream.send(msg)


def scheduler_stream_open(worker: Any) -> bool:
    """Whether the worker's stream to its scheduler is up
    (``Worker.batched_stream``, whose comm closes when the scheduler goes;
    ``Worker.handle_scheduler`` then closes the worker)."""
    stream = getattr(worker, "batched_stream", None)
    comm = getattr(stream, "comm", None)
    return comm is not None and not comm.closed()


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
