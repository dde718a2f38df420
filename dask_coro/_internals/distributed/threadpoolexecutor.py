"""``distributed.threadpoolexecutor``: what a thread running a coroutine's
step holds of the worker's pool (``PoolSeat``, ``thread_state.executor``),
so ``secede()`` and ``rejoin()`` keep their meaning there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dask.typing import Key
from distributed.threadpoolexecutor import thread_state as pool_thread_state
from distributed.worker import thread_state


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


def seceded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
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
