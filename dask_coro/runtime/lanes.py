"""Lanes: the threads a coroutine's steps run on, on a worker.

A body keeps its thread for its whole life, as a ``worker_client`` task
does: a sqlite3 connection or an ``RLock`` held across a yield works, and a
body parked in ``result()`` (a greenlet, which only the thread that made it
can resume) can be resumed. distributed's thread pool cannot promise that
(any of its threads takes the next job), so a worker gets lanes beside its
pool, ``nthreads`` of them to begin with, one thread each, and a run is
pinned to one lane from its first step to its last (``Lanes.pick``: the
lane with the fewest runs pinned to it).

A step runs on its lane *while it holds a thread of the pool* (a seat: a job
on the pool that holds its thread until the step ends): the pool still
bounds how much user code runs at once, as for every task (a 1-thread worker
never runs two pieces of user code at the same time, dask/distributed
#1663). The lane is taken first (its turn, on the worker's loop: one step in
flight per lane), the seat second, so a step waiting for its lane holds no
thread of the pool; the pool's thread, once it has one, hands the step to
the lane's loop, and hands the outcome back to the worker's loop as it lets
go (four thread wake-ups a step, as before lanes were pinned). The cost of pinning: a run whose lane is
busy waits for it even while another lane is idle (measured in
``benchmarks/RESULTS.md``).

On the lane the step looks like a pool thread running the task to
distributed (``thread_state``): ``distributed.secede()`` lets go of the seat
(and the task becomes long-running, as any secede does), ``rejoin()`` takes
one again, so ``worker_client()`` and a blocking ``compute()`` in a body
(which secedes, ``Client.get``) do not hold the pool's thread while they
wait. Such a step holds its lane meanwhile, as a seceded task holds its
thread: the lane is not given to new runs, and a new lane is made when every
lane is held so (such lanes go when their last run ends).

Each lane thread runs an asyncio event loop of its own, and every step runs
as a callback of that loop: an ``async def`` body may await asyncio
awaitables (``asyncio.sleep``, a stream, a future of this loop), which the
lane's loop runs while the body holds no seat, as a yield does; CPU work
between awaits never blocks the worker's own loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import Any

from dask.typing import Key

from .._internals.distributed_private import PoolSeat, set_task_thread


class Lane:
    """One thread running an event loop of its own; steps are its callbacks."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.runs = 0  # runs pinned here
        self.held = 0  # steps here that let go of their seat (seceded) and still run
        self.closed = False
        # One step in flight at a time (taken on the worker's loop): a seat
        # is asked for only when the lane is free, so none waits for it.
        self.turn = asyncio.Lock()
        self.seat: _Seat | None = None  # the seat of the step running here
        # thread_state.executor while a step runs here (one per lane: secede
        # and rejoin act on the step's seat).
        self.executor = PoolSeat(self._leave, self._join)
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                for task in asyncio.all_tasks(self.loop):
                    task.cancel()
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    def _leave(self) -> None:
        seat = self.seat
        if seat is None:
            raise KeyError("no step runs here")
        seat.leave()

    def _join(self, started: threading.Event) -> None:
        seat = self.seat
        if seat is None:
            started.set()
            return
        seat.join(started)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.call_soon_threadsafe(self.loop.stop)


class _Seat:
    """A thread of the pool held for a step: a job on the pool that holds its
    thread until the step lets go of it (``leave``) or ends (``done``), as a
    task's own thread is held while it runs. The step's outcome goes back to
    the worker's loop from the pool's thread as it lets go (as a task's does),
    or from the lane if the step let go of its seat before it ended."""

    __slots__ = ("pool", "lane", "settle", "release", "box")

    def __init__(
        self,
        pool: concurrent.futures.Executor,
        lane: Lane,
        settle: Callable[[Any, BaseException | None], None],
    ):
        self.pool = pool
        self.lane = lane
        self.settle = settle
        self.release: threading.Event | None = None
        self.box: list[Any] = []  # the outcome, for the seat held at the end

    def take(self, then: Callable[[], Any]) -> None:
        """Ask the pool for a thread; ``then()`` runs on it once it has one."""
        release = self.release = threading.Event()
        box = self.box = []
        settle = self.settle

        def seat() -> None:
            then()
            release.wait()
            if box:
                settle(*box)

        self.pool.submit(seat)

    def leave(self) -> None:
        release = self.release
        if release is None:
            raise KeyError("seceded already")  # as threadpoolexecutor.secede says it
        self.release = None
        release.set()
        self.lane.held += 1

    def join(self, started: threading.Event) -> None:
        if self.release is not None:  # rejoined without seceding: as the pool, wait for nothing
            started.set()
            return
        self.lane.held -= 1
        self.take(started.set)

    def done(self, result: Any, error: BaseException | None) -> None:
        release = self.release
        if release is None:  # seceded, not rejoined: no seat to hand the outcome to
            self.lane.held -= 1
            self.settle(result, error)
        else:
            self.release = None
            self.box.append(result)
            self.box.append(error)
            release.set()


class Lanes:
    """``n`` lanes to begin with, gated by ``pool`` (the worker's thread pool)."""

    def __init__(self, n: int, pool: concurrent.futures.Executor, name: str = "dask-coro-lane"):
        if n < 1:
            raise ValueError(f"need at least one lane, got {n}")
        self.n = n
        self.pool = pool
        self.name = name
        self._made = 0
        self.lanes = [self._lane() for _ in range(n)]

    def _lane(self) -> Lane:
        lane = Lane(f"{self.name}-{self._made}")
        self._made += 1
        return lane

    def pick(self) -> Lane:
        """The lane for a new run, pinned there until ``unpin``: the one with
        the fewest runs among those no seceded step holds; a new one if every
        lane is held so. (On the event loop only.)"""
        free = [lane for lane in self.lanes if not lane.held]
        if not free:
            lane = self._lane()
            self.lanes.append(lane)
        else:
            lane = min(free, key=lambda x: x.runs)
        lane.runs += 1
        return lane

    def unpin(self, lane: Lane) -> None:
        """A run pinned to ``lane`` ended; a lane beyond the first ``n`` goes
        with its last run."""
        lane.runs -= 1
        if not lane.runs and not lane.held and len(self.lanes) > self.n and lane in self.lanes:
            self.lanes.remove(lane)
            lane.close()

    async def run(
        self, lane: Lane, key: Key, start: float, fn: Callable[..., Any], *args: Any
    ) -> Any:
        """``fn(*args)`` on ``lane`` as a step of task ``key`` (started at
        ``start``), holding a thread of the pool meanwhile: once the lane is
        ours, the pool's thread, when it comes, hands the step to the lane."""
        async with lane.turn:
            done: concurrent.futures.Future[Any] = concurrent.futures.Future()
            seat = _Seat(self.pool, lane, functools.partial(_settle, done))

            def step() -> None:
                lane.seat = seat
                set_task_thread(key, start, lane.executor)
                try:
                    result = fn(*args)
                except BaseException as e:  # a body may raise anything; re-raised below
                    set_task_thread(None)
                    lane.seat = None
                    seat.done(None, e)
                else:
                    set_task_thread(None)
                    lane.seat = None
                    seat.done(result, None)

            seat.take(lambda: lane.loop.call_soon_threadsafe(step))
            return await asyncio.wrap_future(done)

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()


def _settle(
    done: concurrent.futures.Future[Any], result: Any, error: BaseException | None
) -> None:
    """The step's outcome, to the worker's loop (``asyncio.wrap_future``)."""
    try:
        if error is None:
            done.set_result(result)
        else:
            done.set_exception(error)
    except concurrent.futures.InvalidStateError:
        pass  # the worker's loop stopped waiting (the worker is closing)
