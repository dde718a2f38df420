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
def inc(x):
    return x + 1


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


@pytest.fixture(autouse=True)
def _clear():
    CLOSED.clear()
    ARRIVED.clear()
    yield
