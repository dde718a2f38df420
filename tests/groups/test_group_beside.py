"""Children of a group run beside their parent (``runtime/beside.py``): a
small ``async def`` child on a worker runs on the parent's worker without a
task of its own. Completion order, no thread held while it awaits, the
cancellation contract (leaving the block, ``aclose()``, a deadline, the
parent cancelled), its errors, the cluster work it waits for, and a group
of its own; the same programs with the children as tasks, and as plain
Dask, agree."""

from __future__ import annotations

import asyncio
import threading
import time

import dask
import pytest
from bodies import cleared, inc
from distributed import SchedulerPlugin, as_completed, worker_client
from distributed.utils_test import async_poll_for
from helpers import cluster

import dask_coro
from dask_coro import coroutine

#: Children run beside their parent only with inline calls on (the shipped
#: default; the suite turns it off unless a test is marked).
pytestmark = pytest.mark.inline

#: What the children's ``finally`` blocks recorded (gen_cluster's workers run
#: in the test's process).
CLOSED: set[str] = set()
ARRIVED: dict[str, int] = {}


class Seen(SchedulerPlugin):
    """Every key of the given prefixes the scheduler was given."""

    def __init__(self, *prefixes):
        self.prefixes = prefixes
        self.keys: set = set()

    def transition(self, key, start, finish, *args, **kwargs):
        if str(key).split("-")[0] in self.prefixes:
            self.keys.add(key)


async def nap(x, seconds):
    await asyncio.sleep(seconds)
    return x


naps = coroutine(nap)
naps_as_tasks = coroutine(inline=False, name="tasknap")(nap)


@coroutine
def in_completion_order(spawn, n):
    out = []
    with dask_coro.group() as g:
        for i in range(n):
            g.spawn(spawn(i, 0.05 * (n - i)))  # the last spawned finishes first
        for _, value in g:
            out.append(value)
    return out


def plain_in_completion_order(n):
    def sleeper(x, seconds):
        time.sleep(seconds)
        return x

    with worker_client() as client:
        futures = [client.submit(sleeper, i, 0.05 * (n - i), pure=False) for i in range(n)]
        return [f.result() for f in as_completed(futures)]


@cluster(nthreads=[("", 2), ("", 2)])
async def test_async_children_run_beside_the_parent_without_a_task(c, s, a, b):
    seen = Seen("nap", "tasknap")
    s.add_plugin(seen)
    beside = await c.compute(in_completion_order(naps, 6))
    assert beside == [5, 4, 3, 2, 1, 0]
    assert not seen.keys  # no task: they ran on the parent's worker
    as_tasks = await c.compute(in_completion_order(naps_as_tasks, 6))
    assert sorted(as_tasks) == beside[::-1]
    assert len(seen.keys) == 6  # inline=False: each a task
    with dask.config.set({"coro.inline.enabled": False}):
        assert sorted(await c.compute(in_completion_order(naps, 6))) == beside[::-1]
    assert len(seen.keys) == 12  # without inline calls, tasks too
    plain = await c.submit(plain_in_completion_order, 6, pure=False)
    assert sorted(plain) == sorted(beside)


async def rendezvous(tag, n):
    """Arrive, then wait (awaiting, holding no thread) until ``n`` have arrived."""
    ARRIVED[tag] = ARRIVED.get(tag, 0) + 1
    deadline = time.monotonic() + 20
    while ARRIVED[tag] < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ARRIVED[tag]} of {n} arrived: a waiting child held a thread")
        await asyncio.sleep(0.01)
    return tag


rendezvous_c = coroutine(rendezvous)


@coroutine
def all_meet(tag, n):
    with dask_coro.group() as g:
        for _ in range(n):
            g.spawn(rendezvous_c(tag, n))
        return (yield g.all())


@cluster(nthreads=[("", 1)])
async def test_beside_children_hold_no_thread_while_they_await(c, s, a):
    # One thread, four children that each wait for all four: they can only
    # meet if none holds the thread while it waits.
    assert await c.compute(all_meet("meet", 4)) == ["meet"] * 4


async def sleeps_then_records(tag, seconds):
    try:
        await asyncio.sleep(seconds)
        return tag
    finally:
        CLOSED.add(tag)


sleeps_then_records_c = coroutine(sleeps_then_records)


@coroutine
def first_then_aclose(slow, args, value):
    """The first of ``slow(*args)`` and a quick child giving ``value``, then
    ``aclose()``; what ``finally`` blocks recorded by the time it returned.
    (``slow`` is the function: a call given as an argument would be computed
    before this body starts.)"""
    with dask_coro.group() as g:
        g.spawn(slow(*args))
        g.spawn(naps(value, 0.01))
        _, got = yield g.next()
        yield g.aclose()
        return got, sorted(CLOSED)


@cluster(nthreads=[("", 2), ("", 2)])
async def test_aclose_waits_until_a_beside_child_has_closed(c, s, a, b):
    assert await c.compute(first_then_aclose(sleeps_then_records_c, ("ac-slow", 60), 7)) == (7, ["ac-slow"])
    await async_poll_for(lambda: not s.tasks, timeout=10)


GATE = threading.Event()  # set by the test once the parent returned


async def stuck(tag):
    GATE.wait(60)  # blocks its lane's thread: code between two awaits
    await asyncio.sleep(0)
    return tag


stuck_c = coroutine(stuck)


@cluster(nthreads=[("", 2)])
async def test_aclose_does_not_wait_for_a_beside_child_running_code(c, s, a):
    # aclose() does not wait for a child that cannot be stopped.
    GATE.clear()
    try:
        assert (await c.compute(first_then_aclose(stuck_c, ("stuck",), 5)))[0] == 5
    finally:
        GATE.set()
    await async_poll_for(lambda: not s.tasks, timeout=10)


@coroutine
def first_of(tag):
    with dask_coro.group() as g:
        g.spawn(sleeps_then_records_c(f"{tag}-slow", 60))
        g.spawn(naps(3, 0.01))
        _, value = yield g.next()
        return value  # leaving the block closes the slow one


@cluster(nthreads=[("", 2), ("", 2)])
async def test_leaving_the_block_closes_a_beside_child(c, s, a, b):
    assert await c.compute(first_of("fo")) == 3
    await async_poll_for(lambda: "fo-slow" in CLOSED, timeout=10)
    await async_poll_for(lambda: not s.tasks, timeout=10)


@coroutine
def under_deadline(tag):
    t = time.monotonic()
    with dask_coro.group(timeout=0.3) as g:
        for i in range(3):
            g.spawn(sleeps_then_records_c(f"{tag}-{i}", 60))
        try:
            yield g.next()
        except TimeoutError:
            return "deadline", time.monotonic() - t


@cluster(nthreads=[("", 2), ("", 2)])
async def test_a_deadline_closes_beside_children(c, s, a, b):
    what, elapsed = await c.compute(under_deadline("dl"))
    assert what == "deadline" and elapsed < 5
    await async_poll_for(lambda: {"dl-0", "dl-1", "dl-2"} <= CLOSED, timeout=10)
    await async_poll_for(lambda: not s.tasks, timeout=10)


@coroutine
def parent_waits(tag):
    with dask_coro.group() as g:
        g.spawn(sleeps_then_records_c(f"{tag}-a", 60))
        g.spawn(sleeps_then_records_c(f"{tag}-b", 60))
        yield g.next()


@cluster(nthreads=[("", 2), ("", 2)])
async def test_cancelling_the_parent_closes_beside_children(c, s, a, b):
    fut = c.compute(parent_waits("pc"))
    await asyncio.sleep(0.5)
    assert not fut.done()
    await fut.cancel()
    await async_poll_for(lambda: {"pc-a", "pc-b"} <= CLOSED, timeout=10)
    await async_poll_for(lambda: not s.tasks, timeout=10)


async def fails(x):
    await asyncio.sleep(0.01)
    raise ValueError(f"bad {x}")


fails_c = coroutine(fails)


async def waits_on_the_cluster(x):
    # A Delayed: computed as a task (a side child of the parent), awaited here.
    return await dask_coro.gather(dask.delayed(lambda v: v * 10)(x)) + await inc(x)


waits_on_the_cluster_c = coroutine(waits_on_the_cluster)


@coroutine
def errors_and_cluster_work():
    with dask_coro.group() as g:
        ok = g.spawn(waits_on_the_cluster_c(4))
        bad = g.spawn(fails_c(1))
        got = {}
        while g:
            try:
                child, value = yield g.next()
                got[child.index] = value
            except ValueError as e:
                got[e.dask_coro_child.index] = str(e)
    return got[ok.index], got[bad.index]


@cluster(nthreads=[("", 2), ("", 2)])
async def test_a_beside_child_errs_and_waits_on_the_cluster(c, s, a, b):
    assert await c.compute(errors_and_cluster_work()) == (45, "bad 1")
    await async_poll_for(lambda: not s.tasks, timeout=10)


async def cancels_itself(x):
    await asyncio.sleep(0.01)
    raise asyncio.CancelledError(f"by itself {x}")


@coroutine
def child_cancels_itself(task):
    fn = coroutine(inline=False, name="taskcancels")(cancels_itself) if task else coroutine(cancels_itself)
    with dask_coro.group() as g:
        g.spawn(fn(2))
        try:
            yield g.next()
        except asyncio.CancelledError as e:
            return f"caught: {e}"


@pytest.mark.parametrize("task", [False, True], ids=["beside", "task"])
@cluster(nthreads=[("", 2)])
async def test_a_child_raising_its_own_cancelled_error(c, s, a, task):
    # Its error, not a cancel of the child: delivered, not waited for ever.
    assert await c.compute(child_cancels_itself(task)) == "caught: by itself 2"
    await async_poll_for(lambda: not s.tasks, timeout=10)


async def opens_a_group(n):
    async with dask_coro.group() as g:
        for i in range(n):
            g.spawn(inc(i))
        return sum(await g.all())


opens_a_group_c = coroutine(opens_a_group)


@coroutine
def nested(n):
    with dask_coro.group() as g:
        g.spawn(opens_a_group_c(n))
        g.spawn(opens_a_group_c(n + 1))
        return sorted((yield g.all()))


@cluster(nthreads=[("", 2), ("", 2)])
async def test_a_beside_child_opens_a_group_of_its_own(c, s, a, b):
    # inc(i) for i < n sums to n * (n + 1) / 2.
    assert await c.compute(nested(4)) == [10, 15]
    await async_poll_for(lambda: not s.tasks, timeout=10)


# -- short plain children ------------------------------------------------------


@coroutine
def tiny(x):
    return x * 2


@coroutine
def one_at_a_time(n):
    """``tiny`` children spawned one after the other, each once the last came back."""
    out = []
    with dask_coro.group() as g:
        for i in range(n):
            g.spawn(tiny(i))
            _, value = yield g.next()
            out.append(value)
    return out


def plain_one_at_a_time(n):
    with worker_client() as client:
        return [client.submit(tiny.__wrapped__, i, pure=False).result() for i in range(n)]


@cluster(nthreads=[("", 2), ("", 2)])
async def test_a_short_plain_child_runs_beside_once_measured(c, s, a, b):
    # The first call of a plain function goes out as a task (nothing is
    # known of it) and is timed where it runs; once its runs are known to be
    # far shorter than a round trip, the next ones run beside the parent.
    seen = Seen("tiny")
    s.add_plugin(seen)
    got = await c.compute(one_at_a_time(40))
    # A run timed above a round trip (a thread switch in it) sends a few
    # more out until the mean is short again: far fewer than 40.
    assert 1 <= len(seen.keys) <= 10
    assert got == await c.submit(plain_one_at_a_time, 40, pure=False)
    await async_poll_for(lambda: not s.tasks, timeout=10)


@coroutine
def sleeper_where(seconds):
    from distributed import get_worker

    time.sleep(seconds)
    return get_worker().address


@coroutine
def fan_out(n, seconds):
    with dask_coro.group(limit=8) as g:
        for _ in range(n):
            g.spawn(sleeper_where(seconds))
        return (yield g.all())


@cluster(nthreads=[("", 2), ("", 2)])
async def test_a_slow_plain_child_still_fans_out(c, s, a, b):
    # Children of 30 ms are measured (the first group), and stay tasks the
    # scheduler places on both workers: never run beside the parent.
    seen = Seen("sleeper_where")
    s.add_plugin(seen)
    await c.compute(fan_out(8, 0.03))
    where = await c.compute(fan_out(16, 0.03))
    assert set(where) == {a.address, b.address}
    assert len(seen.keys) == 24
    await async_poll_for(lambda: not s.tasks, timeout=10)


RUNNING = {"now": 0, "most": 0}
RUNNING_LOCK = threading.Lock()


@coroutine
def counted(x, seconds):
    with RUNNING_LOCK:
        RUNNING["now"] += 1
        RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
    try:
        time.sleep(seconds)
        if x < 0:
            raise ValueError(f"negative {x}")
        return x
    finally:
        with RUNNING_LOCK:
            RUNNING["now"] -= 1


@coroutine
def plain_contract():
    """Errors, the limit and a deadline, with plain children beside."""
    got, errors = [], []
    with dask_coro.group(limit=2) as g:
        for x in (1, -2, 3, 4, -5, 6):
            g.spawn(counted(x, 0.01))
        while g:
            try:
                _, value = yield g.next()
                got.append(value)
            except ValueError as e:
                errors.append((e.dask_coro_child.index, str(e)))
    t = time.monotonic()
    with dask_coro.group(timeout=0.2) as g:
        g.spawn(counted(7, 3))  # runs on: a plain function cannot be interrupted
        try:
            yield g.next()
        except TimeoutError:
            late = time.monotonic() - t
    return sorted(got), sorted(errors), late < 2.5


@pytest.fixture
def beside_always():
    from dask_coro.runtime.timings import TIMINGS

    TIMINGS.force = True
    yield
    TIMINGS.force = None


@cluster(nthreads=[("", 2), ("", 2)])
async def test_plain_children_beside_keep_the_contract(c, s, a, b, beside_always):
    seen = Seen("counted")
    s.add_plugin(seen)
    RUNNING.update(now=0, most=0)
    got, errors, heard = await c.compute(plain_contract())
    assert got == [1, 3, 4, 6]
    assert errors == [(1, "negative -2"), (4, "negative -5")]
    assert heard  # the deadline was heard while the child ran on
    assert RUNNING["most"] <= 2  # the limit
    assert not seen.keys  # all beside the parent
    await async_poll_for(lambda: RUNNING["now"] == 0, timeout=10)
    await async_poll_for(lambda: not s.tasks, timeout=10)


_clear = cleared(CLOSED, ARRIVED)
