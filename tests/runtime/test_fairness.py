"""Fair progress between coroutine trees on one worker (docs/running.md,
"Threads: lanes"): a step of an older tree waiting for a thread of the pool
is served before a younger tree's, and a younger tree's step running calls
inline gives its thread back at its next inline call.

gen_cluster workers share this process: bodies signal each other with
``threading.Event`` objects in module state. No timing assertions: each
test waits on conditions, and the outcome (who saw whom end) is decided by
the order of events.
"""

from __future__ import annotations

import threading
import time

import dask
import pytest
from distributed.utils_test import async_poll_for, gen_cluster

import dask_coro
from dask_coro import coroutine

pytestmark = pytest.mark.inline

FLAGS: dict[str, threading.Event] = {}
TICKS: list[int] = []


def gate() -> int:
    """A plain task that holds its thread until the test opens it."""
    FLAGS["open"].wait(60)
    return 1


@coroutine
def older(where):
    with dask.annotate(workers=[where]):
        # Waits on the cluster: seceded, its thread is free meanwhile.
        x = yield dask.delayed(gate, pure=False)()
    FLAGS["older-done"].set()
    return x + 1


@coroutine
def tick():
    TICKS.append(1)
    time.sleep(0.005)
    return FLAGS["older-done"].is_set()


@coroutine
def younger(n):
    # One step: every call runs inline on the thread the step holds.
    for i in range(n):
        if (yield tick()):
            return i
    return None


@gen_cluster(client=True, nthreads=[("", 1), ("", 1)], timeout=90)
async def test_older_tree_resumes_while_a_younger_one_runs_inline(c, s, a, b):
    """The issue's starvation on one thread: an older tree waits for a child
    while a younger tree takes the thread and runs thousands of calls inline
    in one step. Once the child is done, the older tree gets the thread back
    at the younger tree's next inline call (before, it waited for the
    younger tree's whole step), so the younger tree sees it end."""
    FLAGS.update({"open": threading.Event(), "older-done": threading.Event()})
    TICKS.clear()
    fo = c.compute(older(b.address), workers=[a.address])
    await async_poll_for(lambda: a.state.tasks.get(fo.key) is not None
                         and a.state.tasks[fo.key].state == "long-running", timeout=30)
    fy = c.compute(younger(2_000), workers=[a.address])
    await async_poll_for(lambda: len(TICKS) > 3, timeout=30)
    FLAGS["open"].set()
    assert await fo == 2
    seen = await fy
    assert seen is not None, "the older tree ended only after the younger one's whole step"
    pauses = a.plugins["dask-coro-key-watcher"].lanes.seats.pauses
    assert pauses >= 1


STEPS: list[str] = []


@coroutine
def leaf_step(name, seconds):
    STEPS.append(name)
    time.sleep(seconds)
    return 1


@coroutine
def strategy(name, steps, seconds):
    x = 0
    for _ in range(steps):  # one step of the body: every call runs inline
        x += yield leaf_step(name, seconds)
    return name


@coroutine
def first_of(slow_on, fast_on):
    with dask_coro.group() as g:
        with dask.annotate(workers=[slow_on]):
            g.spawn(strategy("slow", 40, 0.05))
        with dask.annotate(workers=[fast_on]):
            g.spawn(strategy("fast", 2, 0.01))
        _, name = yield g.next()
        return name, STEPS.count("slow")


@gen_cluster(client=True, nthreads=[("", 1), ("", 1)], timeout=90)
async def test_first_of_does_not_wait_for_the_losers_inline_chain(c, s, a, b):
    """The race of docs/groups.md on 1-thread workers, the slow strategy on
    its parent's worker: its chain of 40 inline calls holds the only thread
    there. The parent, woken by next() once the fast one answers, gets the
    thread at the chain's next inline call (the same tree's step held it a
    time slice) instead of after all 40 calls; plain Dask's
    ``wait(FIRST_COMPLETED)`` in a ``worker_client`` task answers as soon."""
    STEPS.clear()
    name, slow_steps = await c.compute(first_of(a.address, b.address), workers=[a.address])
    assert name == "fast"
    assert slow_steps < 40, "the parent resumed only after the loser's whole chain"
    assert a.plugins["dask-coro-key-watcher"].lanes.seats.pauses >= 1


@coroutine
def chain(name, n, stop_on):
    """One step: ``n`` calls inline, ended early once ``stop_on`` is set."""
    done = 0
    for _ in range(n):
        done += yield leaf_step(name, 0.005)
        if FLAGS[stop_on].is_set():
            break
    return done


@coroutine
def small_tree():
    FLAGS["small-ran"].set()
    a, b = yield [leaf_step("small", 0.001), leaf_step("small", 0.001)]
    return a + b


@gen_cluster(client=True, nthreads=[("", 2)], timeout=90)
async def test_a_root_queued_behind_inline_chains_gets_a_slot(c, s, a):
    """Every thread slot of the worker is held by a task of one tree running
    a long chain of inline calls (never seceding: it never waits). A new
    root arrives and waits in the worker's ready queue; at a chain's next
    inline call after a time slice, the chain gives its slot up (it
    secedes) and the root runs, while the chains still have most of their
    calls to make. Before, the root waited for a whole chain (seconds)."""
    FLAGS.update({"small-ran": threading.Event(), "never": threading.Event()})
    STEPS.clear()
    wide = [c.compute(chain("wide", 400, "small-ran")) for _ in range(2)]
    await async_poll_for(lambda: STEPS.count("wide") >= 4, timeout=30)
    assert len(a.state.executing) == 2, "both slots run the chains"
    assert await c.compute(small_tree()) == 2
    calls = await c.gather(wide)
    assert sum(calls) < 2 * 400, "the root waited for a whole chain"
    watcher = a.plugins["dask-coro-key-watcher"]
    assert watcher.lanes.seats.pauses >= 1
    # The chain paused for the root let the root's first step ask for the
    # thread it gave back before asking again itself: else it took it back
    # at once, and the root waited for a second pause.
    assert watcher.yields["asked"] >= 1, watcher.yields


@gen_cluster(client=True, nthreads=[("", 1)], timeout=90)
async def test_a_trees_share_of_the_threads_grows_with_its_priority(c, s, a):
    """Two trees of long inline chains on one thread, one at priority 2: its
    weight is 4 times the other's (``2 ** priority``), so it makes several
    times as many calls while both run (a step is paused a time slice after
    a waiting step's tree has had less than its share)."""
    FLAGS.update({"stop": threading.Event()})
    STEPS.clear()
    low = c.compute(chain("low", 10_000, "stop"))
    with dask.annotate(priority=2):
        high = c.compute(chain("high", 10_000, "stop"))
    await async_poll_for(lambda: STEPS.count("high") + STEPS.count("low") >= 300, timeout=60)
    FLAGS["stop"].set()
    await c.gather([low, high])
    # Counted from the moment both had started: the low tree ran alone before.
    first_high = STEPS.index("high")
    after = STEPS[first_high:]
    assert after.count("high") > 2 * after.count("low") > 0, (after.count("high"), after.count("low"))


@coroutine
def resumes_and_holds():
    # Waits on the cluster (it secedes), then holds its thread again in a
    # step of a seceded task, which distributed counts as holding none.
    x = yield dask.delayed(lambda: 1, pure=False)()
    FLAGS["holding"].set()
    FLAGS["release"].wait(60)
    return x


@gen_cluster(client=True, nthreads=[("", 1)], timeout=60)
async def test_a_thread_a_resumed_run_holds_is_not_counted_idle(c, s, a):
    """A run that waited secedes for good (distributed has no way back to a
    slot); its later steps hold a thread all the same. The scheduler hears
    of it and does not count that thread idle: counted idle, it made other
    runs hand their calls out to a worker with no thread free, where they
    queued behind those steps (a small tree's calls waited out a wide
    tree's chains)."""
    from dask_coro.runtime.scheduler import NAME

    FLAGS.update({"holding": threading.Event(), "release": threading.Event()})
    f = c.compute(resumes_and_holds())
    await async_poll_for(lambda: FLAGS["holding"].is_set(), timeout=30)
    assert s.tasks[f.key] in s.workers[a.address].long_running
    await async_poll_for(lambda: NAME in s.plugins, timeout=30)
    plugin = s.plugins[NAME]
    await async_poll_for(lambda: plugin.handle_idle() == 0, timeout=10)
    assert plugin.busy == {a.address: 1}
    FLAGS["release"].set()
    assert await f == 1
    await async_poll_for(lambda: plugin.busy == {} and plugin.handle_idle() == 1, timeout=10)


def test_a_waiting_step_asks_every_step_due_a_pause_and_the_first_to_stop_serves_it():
    """No cluster: a pool of 2 threads, both held by steps of a wide tree
    for longer than a time slice. A step of a small tree waits: both are
    asked to pause (each gives its thread back only at its next inline
    call, so the waiting step is served by whichever gets there first, not
    by the one picked), and not asked again while they still hold them.
    The first to give its thread back serves the small tree's step."""
    from concurrent.futures import ThreadPoolExecutor

    from dask_coro.runtime.lanes import SLICE, Seats, _Seat

    asked = []
    with ThreadPoolExecutor(2) as pool:
        seats = Seats(pool)
        wide = [_Seat(seats, None, f"wide-{i}", "wide", 1.0, lambda i=i: asked.append(i)) for i in range(2)]
        small = _Seat(seats, None, "small-0", "small", 1.0, lambda: asked.append("small"))
        try:
            for seat in wide:
                seat.take()
            time.sleep(SLICE * 2)
            small.release, small.got = threading.Event(), threading.Event()
            seats.want(small)
            assert sorted(seats._preempt("small", small)) == ["wide-0", "wide-1"]
            assert sorted(asked) == [0, 1] and seats.pauses == 2
            assert seats._preempt("small", small) == []  # both still hold their threads
            wide[1].done()  # the nearer inline call: its thread goes to the small tree
            assert small.got.wait(10)
        finally:
            for seat in [*wide, small]:
                if seat.release is not None:
                    seat.done()


def test_the_trees_behind_their_share_are_named_while_another_is_ahead():
    """No cluster: ``Seats.behind`` names the trees with the least virtual
    time, only while another tree here is ahead of them: not for one tree
    alone, nor for trees alike."""
    from concurrent.futures import ThreadPoolExecutor

    from dask_coro.runtime.lanes import Seats, _Seat

    with ThreadPoolExecutor(2) as pool:
        seats = Seats(pool)
        wide = _Seat(seats, None, "wide-0", "wide", 1.0, None)
        small = _Seat(seats, None, "small-0", "small", 1.0, None)
        try:
            assert seats.behind() == frozenset()
            wide.take()
            assert seats.behind() == frozenset()  # one tree alone
            time.sleep(0.05)
            small.take()  # arrives at the least virtual time
            assert seats.behind() == frozenset({"small"})
            wide.done()
            assert seats.behind() == frozenset()  # the small tree alone again
        finally:
            for seat in (wide, small):
                if seat.release is not None:
                    seat.done()


def holds(seconds_max):
    """A body without a yield: its one step holds a thread of the pool
    until the other tree is done."""
    FLAGS["holding"].set()
    FLAGS["other-done"].wait(seconds_max)
    return 1


@coroutine
def where_leaf():
    from distributed import get_worker

    time.sleep(0.02)
    return get_worker().address


@coroutine
def small():
    # 20 calls of 20 ms inline: the scheduler's count of idle threads
    # (pushed at most every 20 ms) comes in while they run.
    xs = yield [where_leaf() for _ in range(20)]
    FLAGS["other-done"].set()
    return xs


@gen_cluster(client=True, nthreads=[("", 2), ("", 2)], timeout=90)
async def test_a_tree_behind_its_share_keeps_its_calls_inline_while_another_is_ahead(c, s, a, b):
    """Worker b's threads are idle. Alone on a, a small tree hands calls out
    to them. Beside a tree that holds a thread of a and is ahead of its
    share, the same tree keeps every call on the thread it holds
    (``Seats.behind``): a call handed out waited for a thread where the
    other tree's steps run leaves, and its parent for another (the wide-first
    rounds of benchmarks/bench_fairness.py)."""
    FLAGS.update({"other-done": threading.Event(), "holding": threading.Event()})
    with dask.annotate(workers=[a.address]):
        alone = await c.compute(small())
    assert b.address in alone, alone
    FLAGS["other-done"] = threading.Event()
    with dask.annotate(workers=[a.address]):
        wide = c.compute(coroutine(holds)(30))
    await async_poll_for(lambda: FLAGS["holding"].is_set(), timeout=30)
    with dask.annotate(workers=[a.address]):
        beside = await c.compute(small())
    assert set(beside) == {a.address}, beside
    assert await wide == 1
