"""Lanes: the threads a coroutine's steps run on, on a worker.

A body waiting in ``dask_coro.result`` is parked in a greenlet, and a
greenlet can only be resumed on the thread that made it. So every step of a
run with parked bodies must land on one thread, which distributed's thread
pool cannot promise (any of its threads takes the next job). A worker gets
``nthreads`` lanes, one thread each, beside its pool; a step runs on a lane
*while it holds a thread of the pool* (the gate, a job that waits for the
lane's): the pool still bounds how much user code runs at once, as for every
task (a 1-thread worker never runs two pieces of user code at the same time,
dask/distributed #1663), and the lane gives the step the thread its parked
bodies need. A run with nothing parked goes to the least busy lane.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any


class Lanes:
    """``n`` one-thread lanes, gated by ``pool`` (the worker's thread pool)."""

    def __init__(self, n: int, pool: concurrent.futures.Executor):
        if n < 1:
            raise ValueError(f"need at least one lane, got {n}")
        self.pool = pool
        self.lanes = [
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"dask-coro-lane-{i}")
            for i in range(n)
        ]
        self.busy = [0] * n  # steps queued or running, per lane
        self.pinned = [0] * n  # runs with parked bodies, per lane
        self._lock = threading.Lock()
        self._thread_ids: list[int | None] = [None] * n

    def pick(self) -> int:
        """The lane for a run with nothing parked: the least busy."""
        return min(range(len(self.lanes)), key=lambda i: (self.busy[i], self.pinned[i]))

    async def run(self, lane: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on ``lane``, holding a thread of the pool meanwhile."""
        with self._lock:
            self.busy[lane] += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.pool, self._gate, lane, fn, args)
        finally:
            with self._lock:
                self.busy[lane] -= 1

    def _gate(self, lane: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        return self.lanes[lane].submit(fn, *args).result()

    def close(self) -> None:
        for lane in self.lanes:
            lane.shutdown(wait=False, cancel_futures=True)
