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

Threads of the pool are shared fairly between trees (``Seats``): a waiting
step of the tree that has had the least of them for its weight is served
first, and one that waits past ``PATIENCE`` has the steps that held their
threads for a time slice pause at their next inline call or yield, give
their threads back and ask again (docs/running.md, fair progress between
trees).

Each lane thread runs an asyncio event loop of its own, and every step runs
as a callback of that loop: an ``async def`` body may await asyncio
awaitables (``asyncio.sleep``, a stream, a future of this loop), which the
lane's loop runs while the body holds no seat, as a yield does; CPU work
between awaits never blocks the worker's own loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from dask.typing import Key

from .._context import body_loops
from .._internals.distributed.threadpoolexecutor import PoolSeat, set_task_thread

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
    while it runs. Steps wait for seats in their tree's fair order
    (``Seats``)."""

    __slots__ = (
        "seats", "lane", "key", "tree", "weight", "pause", "release", "got", "order", "since", "pausing", "over",
    )

    def __init__(
        self,
        seats: Seats,
        lane: Lane,
        key: str,
        tree: Any,
        weight: float,
        pause: Callable[[], None] | None,
        over: bool = False,
    ):
        self.seats = seats
        self.lane = lane
        self.key = key  # the task's, as a string
        self.tree = tree  # the tree (its root's key) whose share the step uses
        self.weight = weight  # the tree's weight (``weight_of``)
        self.pause = pause  # asks the step to give its seat back at its next inline call
        self.release: threading.Event | None = None
        self.got: threading.Event | None = None  # set once a pool thread serves us
        self.order = 0  # when it asked (``Seats``: first come among equals)
        self.since = 0.0  # when it was seated
        self.pausing = False  # asked to pause, not yet given back
        # Its task seceded: distributed counts it as holding no thread, so a
        # thread it holds is one more than distributed sees (``Seats.over``).
        self.over = over

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
        self.over = True  # rejoined: distributed still counts the task seceded
        self.take(started)

    def done(self) -> None:
        release = self.release
        if release is None:
            self.lane.held -= 1
        else:
            self.release = None
            self.seats.left(self)
            release.set()


#: s a step waits for a thread of the pool before it asks a seated step to
#: give one back, and between two such asks (a free thread takes a job at
#: once; this only saves a needless pause when the pool is slow to start it).
PATIENCE = 0.01

#: s a step holds its thread before a waiting step of a tree that had no
#: more of this worker's threads than its own may ask it to pause: the time
#: slice (Go preempts a goroutine after 10 ms; here a pause costs a trip
#: through the event loop, about 0.2 ms).
SLICE = 0.02

#: A tree's weight is ``2 ** priority`` (its root's ``dask.annotate(priority=...)``),
#: the priority bounded to this many steps either way.
MAX_PRIORITY = 20


def weight_of(priority: Any) -> float:
    """The share a tree of user priority ``priority`` gets against a tree of
    priority 0: twice as much for each step up, half for each step down."""
    try:
        p = max(-MAX_PRIORITY, min(MAX_PRIORITY, float(priority)))
    except (TypeError, ValueError):
        p = 0.0
    return 2.0**p


class _Share:
    """One tree's use of this worker's threads: its virtual time (seconds
    of threads held, divided by its weight) and its steps seated or waiting."""

    __slots__ = ("vtime", "weight", "seated", "waiting")

    def __init__(self, vtime: float, weight: float):
        self.vtime = vtime
        self.weight = weight
        self.seated = 0
        self.waiting = 0


class Seats:
    """The threads of the pool, shared fairly between trees: each step that
    wants one submits one job to the pool, and a job that starts serves the
    waiting step of the tree that has had the least of this worker's threads
    for its weight (its virtual time, as Linux's CFS and stride scheduling
    keep one per task), first come first served within a tree. A tree that
    arrives, or comes back after holding and wanting none, starts at the
    least virtual time of the trees active then (CFS's ``min_vruntime``): it
    is served next, and has no credit for the time it was away.

    A step that waited ``PATIENCE`` without being served asks the seated
    steps to pause that have held their threads for at least ``SLICE`` and
    whose trees' virtual times are not below the waiting step's tree's (a
    step of the same tree too: a parent woken while a sibling's chain runs
    gets the thread at the chain's next inline call). Each one asked gives
    its seat back at its next inline call or yield, and asks for one again:
    the first to get there serves the waiting step. One round of asks at a
    time per waiting step; ordinary tasks are never paused (they run as
    distributed runs them). ``preempt_for`` does the same for a task
    waiting in the worker's ready queue (``runtime/worker.py``)."""

    def __init__(self, pool: concurrent.futures.Executor):
        self.pool = pool
        self._lock = threading.Lock()
        self._waiting: list[_Seat] = []  # in the order of asking
        self._seated: dict[_Seat, None] = {}  # seats held by steps
        self._shares: dict[Any, _Share] = {}  # trees with a step seated or waiting
        self._floor = 0.0  # the least virtual time of the active trees, as last seen
        self._order = itertools.count()
        # A waiting step (None: the worker's ready queue) -> the steps it asked to pause.
        self._asked: dict[_Seat | None, list[_Seat]] = {}
        #: Pauses asked for (for tests and benchmarks).
        self.pauses = 0
        #: The worker is closing (``close``): no step waits for a seat.
        self.closed = False
        #: Threads held by steps of tasks that seceded (``_Seat.over``), and
        #: who hears when that changes (from any thread): distributed counts
        #: those threads free, and the worker tells the scheduler.
        self.over = 0
        self.on_over: Callable[[], None] | None = None

    # -- shares (under the lock) ---------------------------------------------

    def _share(self, seat: _Seat) -> _Share:
        """``seat``'s tree's share, made or made active: at least the floor
        (the least virtual time of the active trees), so a tree that held and
        wanted nothing for a while has no credit for it (CFS places a waking
        task so); a tree paused a moment ago keeps what it had."""
        if not self._raise_floor(time.monotonic()):
            self._shares.clear()  # nobody to be fair to: start afresh
        for tree in [t for t, sh in self._shares.items() if not sh.seated and not sh.waiting]:
            if self._shares[tree].vtime <= self._floor:
                del self._shares[tree]  # idle, at the floor or below: nothing to remember
        share = self._shares.get(seat.tree)
        if share is None:
            share = self._shares[seat.tree] = _Share(self._floor, seat.weight)
        elif not share.seated and not share.waiting:
            share.vtime = max(share.vtime, self._floor)
        return share

    def _raise_floor(self, now: float) -> bool:
        """The floor up to the least virtual time of the active trees (those
        with a step seated or waiting); whether there is one."""
        active = [t for t, sh in self._shares.items() if sh.seated or sh.waiting]
        if active:
            self._floor = max(self._floor, min(self._vtime(t, now) for t in active))
        return bool(active)

    def _vtime(self, tree: Any, now: float) -> float:
        """``tree``'s virtual time, with what its seated steps hold so far."""
        share = self._shares.get(tree)
        if share is None:
            return self._floor
        held = sum(now - s.since for s in self._seated if s.tree == tree) if share.seated else 0.0
        return share.vtime + held / share.weight

    # -- steps ---------------------------------------------------------------

    def want(self, seat: _Seat) -> None:
        with self._lock:
            if not self.closed:
                seat.order = next(self._order)
                self._share(seat).waiting += 1
                self._waiting.append(seat)
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
            waiting = list(self._waiting)
            self._waiting.clear()
            self._asked.clear()
            for seat in waiting:
                share = self._shares.get(seat.tree)
                if share is not None:
                    share.waiting -= 1
        for seat in waiting:
            self._without_seat(seat)

    @staticmethod
    def _without_seat(seat: _Seat) -> None:
        if seat.got is not None:
            seat.got.set()

    def _next(self, now: float) -> _Seat:
        """The waiting step to serve: its tree's virtual time least, then the
        first to ask (under the lock, with one waiting at least)."""
        vtimes = {tree: self._vtime(tree, now) for tree in {s.tree for s in self._waiting}}
        self._raise_floor(now)
        return min(self._waiting, key=lambda s: (vtimes[s.tree], s.order))

    def _serve(self) -> None:
        # A job of the pool, on a pool thread: serve the step due now, and
        # hold this thread until it lets go.
        with self._lock:
            if not self._waiting:  # let go without one at close
                return
            seat = self._next(time.monotonic())
            self._waiting.remove(seat)
            share = self._shares[seat.tree]
            share.waiting -= 1
            share.seated += 1
            seat.since = time.monotonic()
            self._seated[seat] = None
            self._asked.pop(seat, None)
            release = seat.release
            got = seat.got
            if seat.over:
                self.over += 1
        assert release is not None and got is not None
        if seat.over and self.on_over is not None:
            self.on_over()
        got.set()
        release.wait()

    def wait(self, seat: _Seat) -> None:
        got = seat.got
        assert got is not None
        while not got.wait(PATIENCE):
            self._preempt(seat.tree, seat)

    def preempt_for(self, tree: Any, keys: set[str]) -> list[str]:
        """A task of ``tree`` waits in the worker's ready queue for a thread
        slot: ask the seated steps of other trees, of tasks in ``keys`` (those
        holding a slot), to pause as ``wait`` would for a step of ``tree``;
        the keys of the steps asked. A task of the same tree waits: its tree
        has the threads already, and a pause would only trade one of its
        steps for another."""
        return self._preempt(tree, None, keys)

    def _preempt(self, tree: Any, seat: _Seat | None, keys: set[str] | None = None) -> list[str]:
        """Ask the seated steps due to pause for a step (``seat``) or task of
        ``tree``: each one held at least ``SLICE``, its tree's virtual time
        not below ``tree``'s (with ``keys``, only steps of another tree, of
        tasks in ``keys``); the keys of the steps asked. Every such step is
        asked, not one: a step gives its seat back only at its next inline
        call or yield, so the first of them to get there serves the waiting
        one (a wait for the nearest of their leaves' ends, not for one
        leaf's whole length), and the others take a seat again at once
        unless a step due more waits. No more asks while one asked still
        holds its seat."""
        with self._lock:
            if seat is not None and (seat.got is None or seat.got.is_set()):
                return []
            if any(s in self._seated and s.pausing for s in self._asked.get(seat, ())):
                return []  # one asked has not given its seat back yet
            now = time.monotonic()
            mine = self._vtime(tree, now)
            victims = []
            for other in self._seated:
                if other.pause is None or other.pausing or now - other.since < SLICE:
                    continue
                if keys is not None and (other.tree == tree or other.key not in keys):
                    continue
                if self._vtime(other.tree, now) < mine:
                    continue
                victims.append(other)
            if not victims:
                return []
            for victim in victims:
                victim.pausing = True
            self._asked[seat] = victims
            self.pauses += len(victims)
        for victim in victims:
            victim.pause()  # type: ignore[misc]
        return [victim.key for victim in victims]

    def left(self, seat: _Seat) -> None:
        with self._lock:
            if seat not in self._seated:
                return  # never seated (the worker closed), or given back already
            del self._seated[seat]
            seat.pausing = False
            share = self._shares.get(seat.tree)
            if share is not None:
                share.seated -= 1
                share.vtime += (time.monotonic() - seat.since) / share.weight
            if seat.over:
                self.over -= 1
        if seat.over and self.on_over is not None:
            self.on_over()

    def busy(self) -> bool:
        """Whether a step holds a thread of the pool here (cheap; no lock)."""
        return bool(self._seated)

    def behind(self) -> frozenset[Any]:
        """The trees furthest behind their share (the least virtual time),
        when other trees here are ahead of them; none when one tree alone,
        or every tree alike, holds or wants threads here. Their calls stay
        inline, on the threads they hold (``_KeyWatcher._spread``): a call
        handed out waits for a thread where other trees' steps run leaves,
        and its parent waits for it."""
        with self._lock:
            now = time.monotonic()
            vtimes = {t: self._vtime(t, now) for t, sh in self._shares.items() if sh.seated or sh.waiting}
        if len(vtimes) < 2:
            return frozenset()
        low = min(vtimes.values())
        behind = frozenset(t for t, v in vtimes.items() if v <= low)
        return behind if len(behind) < len(vtimes) else frozenset()


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
        tree: Any = None,
        weight: float = 1.0,
        pause: Callable[[], None] | None = None,
        urgent: bool = False,
        over: bool = False,
    ) -> Any:
        """``fn(*args)`` on ``lane`` as a step of task ``key`` (started at
        ``start``), holding a thread of the pool meanwhile: served in the
        fair order of ``tree`` (its weight ``weight``) among the steps
        waiting for one (``Seats``); ``pause()`` (called from another
        thread) asks the step to give its thread back at its next inline
        call. An ``urgent`` step (a body told its deadline passed) does not
        wait for a thread of the pool: it starts as a seceded step, one
        thread over the pool's size while it runs, as a seceded task's
        thread is (a deadline that waited for a busy pool would not be one).
        ``over``: the task seceded (``_Seat.over``)."""
        return await asyncio.wrap_future(
            lane.submit(self._seated, lane, key, start, fn, args, tree, weight, pause, urgent, over)
        )

    def _seated(
        self,
        lane: Lane,
        key: Key,
        start: float,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        tree: Any,
        weight: float,
        pause: Callable[[], None] | None,
        urgent: bool = False,
        over: bool = False,
    ) -> Any:
        seat = _Seat(self.seats, lane, str(key), str(key) if tree is None else tree, weight, pause, over)
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
