"""Lanes: the threads a coroutine's steps run on, on a worker.

A body keeps its thread for its whole life, as a ``worker_client`` task
does: a sqlite3 connection or an ``RLock`` held across a yield works, and a
body parked in ``result()`` (a greenlet, which only the thread that made it
can resume) can be resumed. distributed's thread pool cannot promise that
(any of its threads takes the next job), so a worker gets lanes beside its
pool, one thread each, made as runs need them up to ``LANES_PER_THREAD``
per pool thread, and a run is pinned to one lane from its first step to its
last (``Lanes.pick``: one no run is pinned to while there are fewer, so a
body blocking its thread without seceding stalls no other; else the lane
with the fewest runs pinned to it).

A step runs on its lane *while it holds a thread of the pool* (a seat: a job
on the pool that holds its thread until the step ends): the pool still
bounds how much user code runs at once, as for every task (a 1-thread worker
never runs two pieces of user code at the same time, dask/distributed
#1663). The lane is taken first, the seat second, so a step waiting for its
lane holds no thread of the pool. The cost of pinning: a run whose lane is
busy waits for it even while another lane is idle (measured in
``benchmarks/RESULTS.md``).

On the lane the step looks like a pool thread running the task to
distributed (``thread_state``): ``distributed.secede()`` lets go of the seat
(and the task becomes long-running, as any secede does), ``rejoin()`` takes
one again, so ``worker_client()`` and a blocking ``compute()`` in a body
(which secedes, ``Client.get``) do not hold the pool's thread while they
wait. Such a step holds its lane meanwhile, as a seceded task holds its
thread: the lane is not given to new runs, and a new lane is made when every
lane is held so (lanes beyond the cap go when their last run ends).

Threads of the pool go to waiting steps by their tree's rank (``Seats``):
an older tree's step first, and one that waits for a thread past
``PATIENCE`` has the youngest tree's seated step pause at its next inline
call or yield, give its thread back and ask again behind it (docs/running.md,
fair progress between trees).

Each lane thread runs an asyncio event loop of its own, and every step runs
as a callback of that loop: an ``async def`` body may await asyncio
awaitables (``asyncio.sleep``, a stream, a future of this loop), which the
lane's loop runs while the body holds no seat, as a yield does; CPU work
between awaits never blocks the worker's own loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Any

from dask.typing import Key

from .._context import body_loops
from .._internals.distributed_private import PoolSeat, set_task_thread

#: Lanes a worker keeps per thread of its pool, at most (made as runs need
#: them; the pool still bounds the user code running at once).
LANES_PER_THREAD = 4


class Lane:
    """One thread running an event loop of its own; steps are its callbacks."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        body_loops.add(self.loop)
        self.runs = 0  # runs pinned here
        self.held = 0  # steps here that let go of their seat (seceded) and still run
        self.closed = False
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

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        """``fn(*args)`` as a callback of this lane's loop."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def job() -> None:
            if not done.set_running_or_notify_cancel():
                return
            try:
                done.set_result(fn(*args))
            except BaseException as e:  # a body may raise anything; the caller re-raises it
                done.set_exception(e)

        self.loop.call_soon_threadsafe(job)
        return done

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.call_soon_threadsafe(self.loop.stop)


class _Seat:
    """A thread of the pool held for a step: a job on the pool that waits
    until the step lets go of it (``leave``), as a task's own thread is held
    while it runs. Steps wait for seats in the order of their ``rank``
    (``Seats``)."""

    __slots__ = ("seats", "lane", "rank", "pause", "release", "got")

    def __init__(self, seats: Seats, lane: Lane, rank: Any, pause: Callable[[], None] | None):
        self.seats = seats
        self.lane = lane
        self.rank = rank
        self.pause = pause  # asks the step to give its seat back at its next inline call
        self.release: threading.Event | None = None
        self.got: threading.Event | None = None  # set once a pool thread serves us

    def take(self, started: threading.Event | None = None) -> None:
        """Hold a thread of the pool: wait for one, or, with ``started``,
        set it once one is held (``rejoin`` waits for it)."""
        self.release = threading.Event()
        self.got = started if started is not None else threading.Event()
        self.seats.want(self)
        if started is None:
            self.seats.wait(self)

    def start_seceded(self) -> None:
        """Run without a thread of the pool, as a step that let go of its
        seat (``leave``): ``done`` or ``join`` gives the count back."""
        self.lane.held += 1

    def leave(self) -> None:
        release = self.release
        if release is None:
            raise KeyError("seceded already")  # as threadpoolexecutor.secede says it
        self.release = None
        self.seats.left(self)
        release.set()
        self.lane.held += 1

    def join(self, started: threading.Event) -> None:
        if self.release is not None:  # rejoined without seceding: as the pool, wait for nothing
            started.set()
            return
        self.lane.held -= 1
        self.take(started)

    def done(self) -> None:
        release = self.release
        if release is None:
            self.lane.held -= 1
        else:
            self.release = None
            self.seats.left(self)
            release.set()


#: s a step waits for a thread of the pool before it asks a step of a
#: younger tree to give one back (a free thread takes a job at once; this
#: only saves a needless pause when the pool is slow to start it).
PATIENCE = 0.01


class Seats:
    """The threads of the pool, handed to waiting steps in the order of their
    rank (lowest first): each step that wants one submits one job to the
    pool, and a job that starts serves the best-ranked step waiting then, so
    a step of an older tree is never served after a younger tree's step
    that asked at the same time. A step that waited ``PATIENCE`` without
    being served asks the worst-ranked seated step of a younger tree (a
    higher rank) to pause: that step gives its seat back at its next inline
    call and asks for one again, behind the older step. Steps of one tree
    (equal ranks) never pause each other; ordinary tasks are never paused
    (they run as distributed runs them)."""

    def __init__(self, pool: concurrent.futures.Executor):
        self.pool = pool
        self._lock = threading.Lock()
        self._waiting: list[tuple[Any, int, _Seat]] = []  # a heap by (rank, order of asking)
        self._seated: dict[_Seat, None] = {}  # seats held by steps
        self._order = itertools.count()
        #: Pauses asked for (for tests and benchmarks).
        self.pauses = 0
        #: The worker is closing (``close``): no step waits for a seat.
        self.closed = False

    def want(self, seat: _Seat) -> None:
        with self._lock:
            if not self.closed:
                heapq.heappush(self._waiting, (seat.rank, next(self._order), seat))
        if self.closed:
            self._without_seat(seat)
            return
        try:
            self.pool.submit(self._serve)
        except RuntimeError:  # the pool is shut down: the worker is closing
            self.close()

    def close(self) -> None:
        """The worker is closing, and its pool will serve no more steps:
        every step waiting for a seat goes on without one, and so will any
        that asks later. A body's ``rejoin()`` after a secede would otherwise
        wait for ever for a pool thread (distributed's ``rejoin`` waits with
        no timeout), and its lane thread would outlive the worker."""
        with self._lock:
            self.closed = True
            waiting = [seat for _, _, seat in self._waiting]
            self._waiting.clear()
        for seat in waiting:
            self._without_seat(seat)

    @staticmethod
    def _without_seat(seat: _Seat) -> None:
        if seat.got is not None:
            seat.got.set()

    def _serve(self) -> None:
        # A job of the pool, on a pool thread: serve the best-ranked step
        # waiting now, and hold this thread until it lets go.
        with self._lock:
            if not self._waiting:  # let go without one at close
                return
            _, _, seat = heapq.heappop(self._waiting)
            self._seated[seat] = None
            release = seat.release
            got = seat.got
        assert release is not None and got is not None
        got.set()
        release.wait()

    def wait(self, seat: _Seat) -> None:
        got = seat.got
        assert got is not None
        if got.wait(PATIENCE):
            return
        self._preempt(seat)
        got.wait()

    def _preempt(self, seat: _Seat) -> None:
        """``seat``'s step still waits: ask the seated step of the youngest
        tree, if younger than ``seat``'s, to pause (one per waiting step)."""
        with self._lock:
            if seat.got is None or seat.got.is_set():
                return
            worst = None
            for other in self._seated:
                try:
                    if other.pause is not None and other.rank > seat.rank:
                        if worst is None or other.rank > worst.rank:
                            worst = other
                except TypeError:  # ranks that do not compare: neither is older
                    continue
            if worst is None:
                return
            self._seated.pop(worst)  # asked once: it gives its seat back soon
            self.pauses += 1
        worst.pause()  # type: ignore[misc]

    def left(self, seat: _Seat) -> None:
        with self._lock:
            self._seated.pop(seat, None)


class Lanes:
    """``n`` lanes to begin with, gated by ``pool`` (the worker's thread pool)."""

    def __init__(self, n: int, pool: concurrent.futures.Executor, name: str = "dask-coro-lane"):
        if n < 1:
            raise ValueError(f"need at least one lane, got {n}")
        self.n = n
        # Lanes kept for runs (beyond them, only for seceded steps): a run
        # gets a lane no other run is pinned to while there are fewer, so a
        # body blocking its thread without seceding (an Event.wait) stalls
        # no other body unless more than this many are alive at once.
        self.cap = n * LANES_PER_THREAD
        self.pool = pool
        self.seats = Seats(pool)
        self.name = name
        self._made = 0
        self.lanes = [self._lane() for _ in range(n)]

    def _lane(self) -> Lane:
        lane = Lane(f"{self.name}-{self._made}")
        self._made += 1
        return lane

    def pick(self) -> Lane:
        """The lane for a new run, pinned there until ``unpin``: among those
        no seceded step holds, one no run is pinned to, else a new one while
        there are fewer than ``cap``, else the one with the fewest runs; a
        new one if every lane is held. (On the event loop only.)"""
        free = [lane for lane in self.lanes if not lane.held]
        lane = min(free, key=lambda x: x.runs) if free else None
        if lane is None or (lane.runs and len(self.lanes) < self.cap):
            lane = self._lane()
            self.lanes.append(lane)
        lane.runs += 1
        return lane

    def unpin(self, lane: Lane) -> None:
        """A run pinned to ``lane`` ended; a lane beyond ``cap`` (made for
        seceded steps) goes with its last run."""
        lane.runs -= 1
        if not lane.runs and not lane.held and len(self.lanes) > self.cap and lane in self.lanes:
            self.lanes.remove(lane)
            lane.close()

    async def run(
        self,
        lane: Lane,
        key: Key,
        start: float,
        fn: Callable[..., Any],
        *args: Any,
        rank: Any = (),
        pause: Callable[[], None] | None = None,
        urgent: bool = False,
    ) -> Any:
        """``fn(*args)`` on ``lane`` as a step of task ``key`` (started at
        ``start``), holding a thread of the pool meanwhile: served in the
        order of ``rank`` among the steps waiting for one (``Seats``);
        ``pause()`` (called from another thread) asks the step to give its
        thread back to a step of a lower rank. An ``urgent`` step (a body
        told its deadline passed) does not wait for a thread of the pool: it
        starts as a seceded step, one thread over the pool's size while it
        runs, as a seceded task's thread is (a deadline that waited for a
        busy pool would not be one)."""
        return await asyncio.wrap_future(
            lane.submit(self._seated, lane, key, start, fn, args, rank, pause, urgent)
        )

    def _seated(
        self,
        lane: Lane,
        key: Key,
        start: float,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        rank: Any,
        pause: Callable[[], None] | None,
        urgent: bool = False,
    ) -> Any:
        seat = _Seat(self.seats, lane, rank, pause)
        if urgent:
            seat.start_seceded()
        else:
            seat.take()
        set_task_thread(key, start, PoolSeat(seat.leave, seat.join))
        try:
            return fn(*args)
        finally:
            set_task_thread(None)
            seat.done()

    def close(self) -> None:
        self.seats.close()
        for lane in self.lanes:
            lane.close()
