"""``dask_coro.group`` on a cluster, without one, and on the client:
completion order, spawn while iterating, errors, limit, deadline, and the
cancellation contract."""

from __future__ import annotations

import asyncio
import logging
import operator
import time
import tracemalloc

import dask
import dask.array as da
import numpy as np
import pytest
from bodies import after, boom, sq
from distributed import (
    Client,
    Event,
    LocalCluster,
    SchedulerPlugin,
    Variable,
    as_completed,
    worker_client,
)
from distributed.utils_test import async_poll_for, captured_logger, gen_cluster
from filelog import append as _append
from filelog import lines as _lines
from helpers import cluster
from workloads import FLAGS, held, runs_until_released, watchdog

import dask_coro
from dask_coro import BadYieldError, coroutine


@coroutine
def waits_forever(name, tag):
    """A coroutine child that waits on a child of its own until cancelled;
    its ``finally`` records that it was closed (a Variable, so it is seen on
    the scheduler whatever process the child ran in)."""
    try:
        yield after(name, tag)
    finally:
        Variable(f"closed-{tag}").set(True)


class Processing(SchedulerPlugin):
    """The most tasks of one prefix processing at once, and every key seen."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.now: set = set()
        self.most = 0
        self.seen: set = set()

    def transition(self, key, start, finish, *args, **kwargs):
        if not str(key).startswith(self.prefix + "-"):
            return
        self.seen.add(key)
        if finish == "processing":
            self.now.add(key)
            self.most = max(self.most, len(self.now))
        else:
            self.now.discard(key)


# -- completion order -----------------------------------------------------------


@coroutine
def in_order_of_events(n):
    """Children released one at a time in reverse spawn order: next() gives
    them back in that order, the order they finished."""
    out = []
    with dask_coro.group() as g:
        for i in range(n):
            g.spawn(after(f"ev-{i}", i))
        for i in reversed(range(n)):
            Event(f"ev-{i}").set()
            child, value = yield g.next()
            out.append((child.index, value))
    return out


@cluster(nthreads=[("", 2), ("", 2)])
async def test_next_is_completion_order(c, s, a, b):
    assert await c.compute(in_order_of_events(3)) == [(2, 2), (1, 1), (0, 0)]


@pytest.mark.inline
@cluster(nthreads=[("", 2), ("", 2)])
async def test_next_is_completion_order_with_inline_on(c, s, a, b):
    # With calls inline, a group's children are still tasks: the order is theirs.
    assert await c.compute(in_order_of_events(3)) == [(2, 2), (1, 1), (0, 0)]


@coroutine
def expand(limit):
    """Spawn while iterating: each value below 100 spawns two more children,
    until 15 were delivered."""
    seen = []
    spawned = 1
    with dask_coro.group(limit=limit) as g:
        g.spawn(sq(1))
        while g:
            _, value = yield g.next()
            seen.append(value)
            if value < 100 and len(seen) < 15:
                g.spawn(sq(value + 1))
                g.spawn(sq(value + 2))
                spawned += 2
    return seen, spawned


@pytest.mark.parametrize("limit", [None, 2])
def test_spawn_while_iterating(limit):
    @cluster(nthreads=[("", 2), ("", 2)])
    async def run(c, s, a, b):
        seen, spawned = await c.compute(expand(limit))
        # Which children are spawned depends on the order they finish in,
        # but every child spawned was delivered once, the first is sq(1),
        # and each value is the square of one spawned.
        assert len(seen) == spawned
        assert seen[0] == 1 and all(int(v**0.5) ** 2 == v for v in seen)
        await async_poll_for(lambda: not s.tasks, timeout=10)

    run()


@coroutine
def gathered(n):
    with dask_coro.group() as g:
        for i in range(n):
            g.spawn(sq(i))
        first = yield g.next()
        rest = yield g.all()
        return first[1], rest, len(g), bool(g)


@cluster(nthreads=[("", 2)])
async def test_all_is_spawn_order_of_what_is_left(c, s, a):
    first, rest, left, nonempty = await c.compute(gathered(5))
    assert sorted([first, *rest]) == [0, 1, 4, 9, 16]
    assert rest == sorted(rest)  # spawn order: the squares increase
    assert (left, nonempty) == (0, False)


@coroutine
def error_named():
    with dask_coro.group() as g:
        g.spawn(sq(2))
        bad = g.spawn(boom(3))
        got = []
        while g:
            try:
                _, value = yield g.next()
                got.append(value)
            except ValueError as e:
                got.append((str(e), e.dask_coro_child is bad, f"raised by {bad!r}" in e.__notes__))
        return got


@cluster(nthreads=[("", 2)])
async def test_a_childs_error_is_raised_at_next_naming_its_handle(c, s, a):
    got = await c.compute(error_named())
    assert sorted(got, key=str) == sorted([4, ("boom 3", True, True)], key=str)


@coroutine
async def async_body(n):
    out = []
    async with dask_coro.group(limit=2) as g:
        for i in range(n):
            g.spawn(sq(i))
        async for _, v in g:
            out.append(v)
        assert not g
        return sorted(out)


@coroutine
def plain_iteration(n):
    with dask_coro.group() as g:
        for i in range(n):
            g.spawn(sq(i))
        # A for loop in a generator body waits through dask_coro.result.
        return sorted(v for _, v in g)


@cluster(nthreads=[("", 2)])
async def test_async_with_and_plain_for(c, s, a):
    assert await c.compute(async_body(5)) == [0, 1, 4, 9, 16]
    assert await c.compute(plain_iteration(5)) == [0, 1, 4, 9, 16]


def test_without_a_cluster_children_run_one_at_a_time_in_spawn_order():
    ran = []

    @coroutine
    def note(i):
        ran.append(("start", i))
        ran.append(("end", i))
        return i

    @coroutine
    def body():
        out = []
        with dask_coro.group(limit=2) as g:
            for i in range(4):
                g.spawn(note(i))
            while g:
                _, v = yield g.next()
                out.append(v)
                # next() ran exactly the child it returned
                assert ran[-1] == ("end", v)
        return out

    for inline in (True, False):
        ran.clear()
        with dask.config.set({"coro.inline.enabled": inline}):
            assert dask.compute(body(), scheduler="sync")[0] == [0, 1, 2, 3]
        assert [r for r in ran if r[0] == "start"] == [("start", i) for i in range(4)]
    assert dask.compute(error_named(), scheduler="sync")[0] == [4, ("boom 3", True, True)]
    assert dask.compute(plain_iteration(4), scheduler="sync")[0] == [0, 1, 4, 9]
    assert dask.compute(async_body(4), scheduler="sync")[0] == [0, 1, 4, 9]


# -- what may be spawned: anything a yield accepts ----------------------------------


def spawnables():
    """One of each kind of thing a yield accepts (made anew for each use: a
    call spawned belongs to its group)."""
    return [
        sq(2),
        [sq(1), sq(2)],
        (sq(3), 5),
        {"a": sq(4), "b": [sq(5), 6]},
        7,
        np.arange(3),
        dask.delayed(operator.add)(1, 2),
        da.arange(4, chunks=2) * 2,
        [],
    ]


def plain(x):
    """``x`` with its arrays as lists, to compare shapes and values with ==."""
    if isinstance(x, np.ndarray):
        return ("ndarray", x.tolist())
    if type(x) in (list, tuple):
        return type(x)(plain(v) for v in x)
    if type(x) is dict:
        return {k: plain(v) for k, v in x.items()}
    return x


@coroutine
def spawns_everything():
    """What a group delivers of each spawnable, in spawn order, and what a
    yield of the same gives; a bad spawn raises at spawn() and leaves the
    good children alone."""
    with dask_coro.group() as g:
        for x in spawnables():
            g.spawn(x)
        for bad in ({1, 2}, [sq(1), iter([1])]):
            with pytest.raises(BadYieldError, match=r"spawn\(\) of child 9 of group"):
                g.spawn(bad)
        got = yield g.all()
    yielded = yield spawnables()
    return got, yielded


def test_a_child_may_be_anything_a_yield_accepts():
    expected = plain(list(dask.compute(*spawnables(), scheduler="sync")))
    # Without a cluster, in a body on a worker, and on the client: the value
    # of each child in the shape a yield (and dask.compute) gives.
    got, yielded = spawns_everything().compute(scheduler="sync")
    assert plain(got) == plain(yielded) == expected
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as lc:
        with Client(lc) as client:
            got, yielded = client.compute(spawns_everything()).result()
            assert plain(got) == plain(yielded) == expected
            assert plain(list(dask.compute(*spawnables()))) == expected  # plain Dask, on the cluster
            with dask_coro.group() as g:
                for x in spawnables():
                    g.spawn(x)
                with pytest.raises(BadYieldError, match=r"spawn\(\) of child 9 of group"):
                    g.spawn({1, 2})
                assert plain(dask_coro.result(g.all())) == expected
            assert not g


@gen_cluster(client=True, nthreads=[("", 2)])
async def test_a_child_of_many_values_with_an_asynchronous_client(c, s, a):
    async with dask_coro.group() as g:
        g.spawn({"a": [sq(2), sq(3)], "b": 1})
        bad = g.spawn([sq(1), boom(3)])
        g.spawn(5)
        got = [await g.next(), await g.next()]
        assert sorted((ch.index, v) for ch, v in got) == [(0, {"a": [4, 9], "b": 1}), (2, 5)]
        with pytest.raises(ValueError, match="boom 3") as info:
            await g.next()
    assert info.value.dask_coro_child is bad


@coroutine
def many_values_and_errors():
    """A child of several values: its error is raised at next() naming it;
    the others of its step are delivered."""
    out = []
    with dask_coro.group() as g:
        g.spawn([sq(1), sq(2)])
        bad = g.spawn((sq(3), boom(4)))
        g.spawn(9)
        while g:
            try:
                child, value = yield g.next()
            except ValueError as e:
                assert e.dask_coro_child is bad
                out.append((bad.index, str(e)))
            else:
                out.append((child.index, value))
    return sorted(out)


@cluster(nthreads=[("", 2)])
async def test_a_childs_error_among_many_values(c, s, a):
    expected = [(0, [1, 4]), (1, "boom 4"), (2, 9)]
    assert await c.compute(many_values_and_errors()) == expected
    assert many_values_and_errors().compute(scheduler="sync") == expected


# -- a child shares the body's results, as a yield does --------------------------


@coroutine
def gen(n, folder):
    _append(folder, "gen", str(n))
    return list(range(n))


@coroutine
def my_len(L):
    return len(L)


@coroutine
def shares_results(folder, grouped):
    """docs/coroutines.md's process_all, its first wait a group's child (or
    a yield); then the other way round: a child uses what a yield computed."""
    L = gen(5, folder)
    if grouped:
        with dask_coro.group() as g:
            g.spawn(my_len(L))
            _, n = yield g.next()
    else:
        n = yield my_len(L)
    firsts = yield [sq(L[i]) for i in range(n)]
    M = gen(3, folder)
    m = yield my_len(M)
    with dask_coro.group() as g:
        g.spawn([sq(M[i]) for i in range(m)])
        _, seconds = yield g.next()
    return firsts, seconds


@pytest.mark.parametrize("inline", [pytest.param(True, marks=pytest.mark.inline), False])
def test_a_child_shares_the_bodys_results_as_a_yield_does(inline, tmp_path):
    expected = ([0, 1, 4, 9, 16], [0, 1, 4])
    assert dask.config.get("coro.inline.enabled") is inline

    @cluster(nthreads=[("", 2)])
    async def run(c, s, a):
        for grouped in (False, True):
            folder = tmp_path / f"{grouped}"
            folder.mkdir()
            folder = str(folder)
            assert await c.compute(shares_results(folder, grouped)) == expected
            # L and M computed once each, as without a group.
            assert _lines(folder, "gen") == ["5", "3"], grouped

    run()
    folder = tmp_path / "local"
    folder.mkdir()
    folder = str(folder)
    assert shares_results(folder, True).compute(scheduler="sync") == expected
    if inline:
        # Without a cluster, with calls run inline, L and M are computed
        # inline once and their values kept on the calls.
        assert _lines(folder, "gen") == ["5", "3"]


# -- limit ------------------------------------------------------------------------


@coroutine
def limited(n, limit):
    with dask_coro.group(limit=limit) as g:
        for i in range(n):
            g.spawn(sq(i))
        return sorted((yield g.all()))


@cluster(nthreads=[("", 2), ("", 2)])
async def test_limit_bounds_children_submitted_or_running(c, s, a, b):
    p = Processing("sq")
    s.add_plugin(p)
    assert await c.compute(limited(30, 3)) == sorted(i * i for i in range(30))
    assert len(p.seen) == 30
    assert p.most <= 3
    assert p.most >= 2  # they did run side by side


def test_queued_children_cost_under_a_kib_each():
    """10,000 children spawned under limit=8 while queued: the group's
    memory, call objects included, measured with tracemalloc in the body."""
    measured = {}

    @coroutine
    def body():
        with dask_coro.group(limit=8) as g:
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for i in range(10_000):
                g.spawn(sq(i))
            measured["per_child"] = (tracemalloc.get_traced_memory()[0] - before) / 10_000
            tracemalloc.stop()
            assert len(g) == 10_000 and g.book.started == 8
            g.close()
        return None

    dask.compute(body(), scheduler="sync")
    assert measured["per_child"] <= 1024, measured


# -- deadline -----------------------------------------------------------------------


@coroutine
def with_deadline(tag, timeout):
    with dask_coro.group(timeout=timeout) as g:
        g.spawn(waits_forever(f"never-{tag}", tag))
        g.spawn(sq(3))
        got = []
        try:
            while g:
                got.append((yield g.next())[1])
        except TimeoutError as e:
            return got, str(e)


@cluster(nthreads=[("", 2), ("", 2)])
async def test_deadline_cancels_children_and_raises_at_next(c, s, a, b):
    got, message = await c.compute(with_deadline("d1", 0.5))
    assert got == [9]
    assert "deadline passed" in message
    # The coroutine child was closed at its yield (its finally ran) and no
    # key of the group is left on the scheduler.
    await async_poll_for(lambda: "closed-d1" in s.extensions["variables"].variables, timeout=10)
    await async_poll_for(lambda: not s.tasks, timeout=10)


def holds_a_thread(name):
    Event(name).wait()  # a plain task: its thread is held until the event
    return 1


@coroutine
def deadline_over_a_busy_pool(name, deadline):
    with dask_coro.group(deadline=deadline) as g:
        g.spawn(dask.delayed(holds_a_thread)(name))
        g.spawn(dask.delayed(holds_a_thread)(name))
        try:
            yield g.next()
        except TimeoutError:
            return "deadline"


@cluster(nthreads=[("", 2)])
async def test_a_deadline_is_heard_while_every_thread_of_the_pool_is_held(c, s, a):
    """Both threads of the only worker run children that never end on their
    own (until the test sets the event): the body hears of its deadline
    without waiting for a thread of the pool (it runs as a seceded step
    would, one thread over), so the answer comes with every child still
    running. Waiting for a thread, it came only once a child ended."""
    def children_running():
        return sum(str(ts.key).startswith("holds_a_thread") for ts in a.state.executing)

    # Both children hold their threads well before the deadline (they start
    # within milliseconds here), so the deadline finds the pool full.
    fut = c.compute(deadline_over_a_busy_pool("busy-pool", time.time() + 3))
    await async_poll_for(lambda: children_running() == 2, timeout=3)
    assert await fut == "deadline"
    assert children_running() == 2  # neither ended: the event is not set
    del fut
    await Event("busy-pool", client=c).set()
    await async_poll_for(lambda: not s.tasks, timeout=30)


@coroutine
def absolute_deadline():
    with dask_coro.group(deadline=time.time() - 1) as g:
        g.spawn(sq(2))
        try:
            yield g.next()
        except TimeoutError:
            return "expired"


@cluster(nthreads=[("", 1)])
async def test_a_deadline_passed_already(c, s, a):
    assert await c.compute(absolute_deadline()) == "expired"
    assert dask.compute(absolute_deadline(), scheduler="sync")[0] == "expired"


def test_bad_arguments():
    with pytest.raises(TypeError, match="timeout= must be a number"):
        dask_coro.group(timeout="1s")
    with pytest.raises(ValueError, match="timeout= must be >= 0"):
        dask_coro.group(timeout=-1)
    # As for timeout=: a wrong type is a TypeError, a wrong value a ValueError.
    for bad in ("x", 2.0, True):
        with pytest.raises(TypeError, match="limit= must be a positive int or None"):
            dask_coro.group(limit=bad)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="limit= must be >= 1"):
            dask_coro.group(limit=bad)
    g = dask_coro.group()
    with pytest.raises(RuntimeError, match="inside its block"):
        g.spawn(sq(1))


# -- cancellation ---------------------------------------------------------------------


@coroutine
def first_of(tag):
    with dask_coro.group() as g:
        g.spawn(waits_forever(f"never-{tag}", tag))
        g.spawn(sq(5))
        _, value = yield g.next()
        return value  # leaving the block cancels the other


@cluster(nthreads=[("", 2), ("", 2)])
async def test_return_cancels_the_rest(c, s, a, b):
    assert await c.compute(first_of("r1")) == 25
    await async_poll_for(lambda: "closed-r1" in s.extensions["variables"].variables, timeout=10)
    await async_poll_for(lambda: not s.tasks, timeout=10)


@coroutine
def queued_never_start(tag):
    with dask_coro.group(limit=1) as g:
        g.spawn(sq(1))
        for i in range(5):
            g.spawn(after(f"never-{tag}", i))
        _, v = yield g.next()
        yield g.aclose()  # waits until the scheduler runs none of them
        return v


@cluster(nthreads=[("", 2), ("", 2)])
async def test_queued_children_never_start_and_aclose_waits(c, s, a, b):
    p = Processing("after")
    s.add_plugin(p)
    assert await c.compute(queued_never_start("q1")) == 1
    # Under limit=1 the first of them started after sq finished; the rest never did.
    assert len(p.seen) <= 1
    assert not p.now
    await async_poll_for(lambda: not s.tasks, timeout=10)


@coroutine
def parent_waits(tag):
    with dask_coro.group() as g:
        g.spawn(waits_forever(f"never-{tag}", f"{tag}-a"))
        g.spawn(waits_forever(f"never-{tag}", f"{tag}-b"))
        try:
            yield g.next()
        finally:
            Variable(f"closed-{tag}-parent").set(True)


@cluster(nthreads=[("", 2), ("", 2)])
async def test_parent_cancelled_closes_every_child(c, s, a, b):
    fut = c.compute(parent_waits("p1"))
    await async_poll_for(lambda: sum(str(k).startswith("after-") for k in s.tasks) == 2, timeout=10)
    await fut.cancel()
    variables = s.extensions["variables"].variables
    await async_poll_for(
        lambda: {"closed-p1-a", "closed-p1-b", "closed-p1-parent"} <= set(variables), timeout=10
    )
    await async_poll_for(lambda: not s.tasks, timeout=10)


@coroutine
def cancel_one(tag):
    with dask_coro.group() as g:
        slow = g.spawn(waits_forever(f"never-{tag}", tag))
        g.spawn(sq(4))
        slow.cancel()
        assert slow.done() and slow.cancelled()
        out = yield g.all()
        return out, len(g)


@cluster(nthreads=[("", 2), ("", 2)])
async def test_cancel_one_child(c, s, a, b):
    assert await c.compute(cancel_one("c1")) == ([16], 0)
    await async_poll_for(lambda: not any(str(k).startswith("waits_forever") for k in s.tasks), timeout=10)


def plain_dask_watchdog(tag):
    """Plain Dask: the same wait in a worker_client task, its future
    cancelled by a watchdog thread."""
    with worker_client() as client:
        f = client.submit(held, tag)
        watchdog(tag, f.cancel)
        return [x.status for x in as_completed([f])]


@coroutine
def left_to_a_watchdog(tag, how):
    """The only child is cancelled by a watchdog thread while the body waits
    for it (``for``, or ``next()``)."""
    with dask_coro.group() as g:
        child = g.spawn(runs_until_released(tag))
        watchdog(tag, child.cancel)
        if how == "for":
            return [v for _, v in g], child.cancelled()
        try:
            yield g.next()
        except RuntimeError as e:
            return str(e), child.cancelled()
        return "delivered", child.cancelled()


async def cancelled_by_a_side_task(tag):
    """The same, cancelled by another asyncio task (in a body, or on the
    client with an asynchronous client)."""
    async with dask_coro.group() as g:
        child = g.spawn(runs_until_released(tag))

        async def cancel_once_started():
            while not FLAGS[f"started-{tag}"].is_set():
                await asyncio.sleep(0.01)
            child.cancel()

        side = asyncio.create_task(cancel_once_started())
        got = [v async for _, v in g]
        await side
        return got, child.cancelled()


@coroutine
async def left_to_a_side_task(tag):
    return await cancelled_by_a_side_task(tag)


@cluster(nthreads=[("", 2)])
async def test_the_wait_ends_when_the_children_left_are_cancelled_from_elsewhere(c, s, a):
    """``handle.cancel()`` from a watchdog thread, or from another task of an
    async body, while the body waits for that child: iteration ends, and
    ``next()`` says no child is left (a cancelled child is never delivered),
    as on the client. Plain Dask's ``as_completed`` ends there too (giving
    the cancelled future). It waited for ever."""

    async def run(tag, waiting):
        try:
            return await asyncio.wait_for(waiting, 10)
        finally:
            FLAGS[f"release-{tag}"].set()  # the plain function runs on until then

    assert await run("w1", c.compute(left_to_a_watchdog("w1", "for"))) == ([], True)
    said, cancelled = await run("w2", c.compute(left_to_a_watchdog("w2", "next")))
    assert "no child left to deliver" in said and cancelled
    assert await run("w3", c.compute(left_to_a_side_task("w3"))) == ([], True)
    with c.as_current():  # on the client
        assert await run("w4", cancelled_by_a_side_task("w4")) == ([], True)
    assert await run("w5", c.submit(plain_dask_watchdog, "w5")) == ["cancelled"]
    await async_poll_for(lambda: not s.tasks, timeout=10)


@coroutine
async def leaves_a_failed_child_undelivered(tag):
    async with dask_coro.group() as g:
        failed = g.spawn(boom(tag))
        g.spawn(runs_until_released(tag))  # cancelled by the leaving: nothing to say
        while not failed.done():
            await asyncio.sleep(0.01)
        return g.name


@coroutine
async def cancels_a_failed_child_undelivered(tag):
    async with dask_coro.group() as g:
        failed = g.spawn(boom(tag))
        while not failed.done():
            await asyncio.sleep(0.01)
        failed.cancel()  # ended already, its error never taken
        return g.name, len(g)


@cluster(nthreads=[("", 2)])
async def test_cancelling_a_failed_child_logs_its_error_never_delivered(c, s, a):
    """``handle.cancel()`` of a child that had already ended with an error
    the body never took: the error is logged, naming the child (asyncio logs
    a task's exception never retrieved though the task was cancelled after
    it ended). It was dropped silently."""
    with captured_logger("dask_coro", level=logging.WARNING) as log:
        name, left = await asyncio.wait_for(c.compute(cancels_a_failed_child_undelivered("e2")), 10)
    assert left == 0
    text = log.getvalue()
    assert f"<child 0 of {name} (done)> ended with an error that was never delivered" in text
    assert "ValueError('boom e2')" in text
    await async_poll_for(lambda: not s.tasks, timeout=10)


@cluster(nthreads=[("", 2)])
async def test_leaving_a_group_logs_an_error_never_delivered(c, s, a):
    """A child ended with an error and the body left the group without
    taking it: the error is logged, naming the child, as asyncio logs a
    task's exception never retrieved. The child the leaving cancelled says
    nothing. It was dropped silently."""
    with captured_logger("dask_coro", level=logging.WARNING) as log:
        try:
            name = await asyncio.wait_for(c.compute(leaves_a_failed_child_undelivered("e1")), 10)
        finally:
            FLAGS["release-e1"].set()
    text = log.getvalue()
    assert f"<child 0 of {name} (done)> ended with an error that was never delivered" in text
    assert "ValueError('boom e1')" in text
    assert "child 1" not in text
    await async_poll_for(lambda: not s.tasks, timeout=10)


# -- on the client ------------------------------------------------------------------------


def test_a_group_of_roots_on_the_client():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as cluster:
        with Client(cluster):
            with dask_coro.group(limit=2) as g:
                for i in range(5):
                    g.spawn(sq(i))
                got = sorted(v for _, v in g)
            assert got == [0, 1, 4, 9, 16]
            with dask_coro.group() as g:
                g.spawn(sq(3))
                bad = g.spawn(boom(1))
                values = []
                with pytest.raises(ValueError, match="boom 1") as info:
                    while g:
                        values.append(dask_coro.result(g.next())[1])
                assert info.value.dask_coro_child is bad
            with dask_coro.group(timeout=0.3) as g:
                g.spawn(after("never-client", 1))
                with pytest.raises(TimeoutError):
                    dask_coro.result(g.next())
            deadline = time.time() + 10
            while cluster.scheduler.tasks and time.time() < deadline:
                time.sleep(0.05)
            assert not cluster.scheduler.tasks


@gen_cluster(client=True, nthreads=[("", 2)])
async def test_a_group_of_roots_with_an_asynchronous_client(c, s, a):
    async with dask_coro.group() as g:
        for i in range(3):
            g.spawn(sq(i))
        got = sorted([v async for _, v in g])
    assert got == [0, 1, 4]



@gen_cluster(client=True, nthreads=[("", 2)])
async def test_a_childs_error_with_an_asynchronous_client(c, s, a):
    async with dask_coro.group() as g:
        bad = g.spawn(boom(2))
        with pytest.raises(ValueError, match="boom 2") as info:
            await g.next()
    assert info.value.dask_coro_child is bad


@coroutine
def inner_group(timeout):
    with dask_coro.group(timeout=timeout) as g:
        g.spawn(sq(1))
        yield g.next()
        return g.deadline


@coroutine
def outer_group(outer, inner):
    with dask_coro.group(timeout=outer) as g:
        g.spawn(inner_group(inner))
        _, got = yield g.next()
        return got, g.deadline


@cluster(nthreads=[("", 2), ("", 2)])
async def test_a_coroutine_child_inherits_the_tighter_deadline(c, s, a, b):
    got, outer = await c.compute(outer_group(600, 3600))
    assert got == outer  # the parent's, tighter
    got, outer = await c.compute(outer_group(3600, 600))
    assert got < outer  # its own, tighter


# -- aclose() waits for a child task's body to close on its worker ------------

CLOSING: list[str] = []  # gen_cluster's workers run in this process


@coroutine(inline=False)
def closes_slowly(tag):
    try:
        yield after(f"never-{tag}", 0)
    finally:
        time.sleep(0.5)  # a finally block that takes a while
        CLOSING.append(tag)


@coroutine
def first_then_aclose_tasks(tag):
    with dask_coro.group() as g:
        g.spawn(closes_slowly(tag))
        g.spawn(sq(3))
        _, value = yield g.next()
        yield g.aclose()
        return value, tag in CLOSING


@cluster(nthreads=[("", 2), ("", 2)])
async def test_aclose_waits_until_a_child_tasks_finally_has_run(c, s, a, b):
    # The scheduler forgets the cancelled child at once; its worker is still
    # closing the body for 0.5 s: aclose() waits for the worker.
    assert await c.compute(first_then_aclose_tasks("slowclose")) == (9, True)
    await async_poll_for(lambda: not s.tasks, timeout=10)
