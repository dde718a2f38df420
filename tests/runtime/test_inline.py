"""Coroutine calls run inline on real clusters (``coro.inline.enabled``).

Every test here is marked ``inline`` (see conftest.py): calls with plain
arguments whose key nobody asked for run in their parent's step, on the
parent's worker, with no task of their own; what users see must not change.

gen_cluster workers share this process, Nanny and LocalCluster workers do
not: bodies record what they did in files under ``tmp_path`` (filelog.py) or
in ``distributed`` primitives, never in module state. No timing assertions:
every wait polls a condition with a generous timeout.
"""

from __future__ import annotations

import asyncio
import collections
import io
import os
import re
import signal
import sys
import threading
import time
import traceback
import uuid

import dask
import distributed
import pytest
from bodies import add
from distributed import (
    Client,
    Event,
    Future,
    LocalCluster,
    Nanny,
    get_client,
)
from distributed.utils_test import async_poll_for
from filelog import append as _append
from filelog import lines as _lines
from filelog import ticks_after_cancel
from helpers import cluster, places, recorder
from workloads import afib, boom, does_not_catch, fib, inc

import dask_coro
from dask_coro import Promise, coroutine, current_key, gather
from dask_coro.core.plan import derive_key
from dask_coro.runtime.scheduler import NAME as INLINE
from dask_coro.runtime.scheduler import InlinePlugin
from dask_coro.runtime.worker import _KeyWatcher, _watcher

# Each test runs on both engines, compiled and pure (conftest.engine).
pytestmark = [pytest.mark.inline, pytest.mark.usefixtures("engine")]


# --------------------------------------------------------------------------
# coroutines (module level: Nanny and LocalCluster workers import them)


@coroutine
def logged(folder, tag, value=None):
    _append(folder, "runs", tag)
    return tag if value is None else value


@coroutine
def late_boom(x):
    y = yield inc(x)
    raise ValueError(f"late boom {y}")


@coroutine
def catches(folder, kind):
    bad = boom(7) if kind == "plain" else late_boom(7)
    try:
        yield [logged(folder, "first"), bad, logged(folder, "later")]
    except ValueError as e:
        caught = (type(e), str(e), "".join(traceback.format_exception(e)))
    else:  # pragma: no cover - the test fails on this
        caught = None
    after = yield [inc(10), inc(20)]
    return caught, after


def _double(x):
    return 2 * x


@coroutine
def remote_child(x):
    # A dask.delayed task: submitted, with a key derived from this frame
    # (dask names it double-<uuid>; a name of the user's would be kept).
    value = yield dask.delayed(_double)(x)
    return value


@coroutine
def with_remote_child():
    return (yield [remote_child(3), inc(1), {"k": inc(2)}])


@coroutine
def promise_waiter(pkey):
    # By key: a Future or Promise argument would make the call remote, and a
    # dependency of it.
    value = yield Future(pkey, get_client())
    return value


@coroutine
def promise_setter(pkey):
    Promise(_key=pkey).resolve_with(42)
    return "set"


@coroutine
def promise_siblings():
    p = Promise()
    got = yield [promise_waiter(p.key), promise_setter(p.key)]
    return got


def _wait_event(name, timeout):
    return Event(name).wait(timeout=timeout)  # False if nobody set it meanwhile


event_waiter = coroutine(name="event_waiter")(_wait_event)
event_waiter_task = coroutine(inline=False, name="event_waiter_task")(_wait_event)


@coroutine
def event_setter(name):
    Event(name).set()
    return "set"


@coroutine
def event_siblings(name, timeout=5.0, waiter_inline=True):
    waiter = event_waiter if waiter_inline else event_waiter_task
    return (yield [waiter(name, timeout), event_setter(name)])


@coroutine
def sleepy(folder, depth, tag="r"):
    """A binary tree of calls; its leaves sleep a little and record a tick.
    Frames record how they end: closed (GeneratorExit at the yield) or not."""
    if depth == 0:
        time.sleep(0.005)
        _append(folder, "ticks", tag)
        return 1
    try:
        a, b = yield [
            sleepy(folder, depth - 1, tag + "0"),
            sleepy(folder, depth - 1, tag + "1"),
        ]
        return a + b
    except GeneratorExit:
        _append(folder, "closed", str(depth))
        raise
    finally:
        _append(folder, "finally", str(depth))


def _blocked(started, never):
    Event(started).set()
    Event(never).wait(timeout=60)
    return 1


@coroutine
def waits_on_a_blocked_task(folder, started, never):
    try:
        value = yield [inc(1), dask.delayed(_blocked, pure=False)(started, never)]
        return value
    finally:
        _append(folder, "finally", "waiter")


@coroutine
def key_of():
    return current_key()


@coroutine
def gen_key_of():
    inner = yield key_of()
    return current_key(), inner


@coroutine
async def async_key_of():
    inner = await key_of()
    return current_key(), inner


@coroutine
def keys_everywhere():
    mine = current_key()
    children = yield [key_of(), gen_key_of(), async_key_of()]
    return mine, children


def _plus_one(v):
    return v + 1


@coroutine
def reuses(folder):
    c = logged(folder, "c", 10)
    a, b = yield [c, c]
    again = yield c
    # c ran inline: a lazy call built on it now gets its value.
    via_delayed = yield dask.delayed(_plus_one)(c)
    via_coroutine = yield add(c, 5)
    return a, b, again, via_delayed, via_coroutine


@coroutine
def logged_then_waits(folder):
    _append(folder, "runs", "c")
    value = yield dask.delayed(_double)(21, dask_key_name="double-21")
    return value


@coroutine
def same_call_twice(folder):
    c = logged_then_waits(folder)
    return (yield [c, c])


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@coroutine
def where_tree(depth):
    """The addresses of the workers that ran each leaf (CPU-bound leaves)."""
    if depth == 0:
        from distributed import get_worker

        _spin(0.02)
        return [get_worker().address]
    a, b = yield [where_tree(depth - 1), where_tree(depth - 1)]
    return a + b


@coroutine
def sleepy_where(depth, seconds=0.01):
    """The addresses of the workers that ran each leaf (sleeping leaves: the
    workers of a gen_cluster share this process and its GIL)."""
    if depth == 0:
        from distributed import get_worker

        time.sleep(seconds)
        return [get_worker().address]
    a, b = yield [sleepy_where(depth - 1, seconds), sleepy_where(depth - 1, seconds)]
    return a + b


#: Events of this process (a gen_cluster's workers share it): a call waiting
#: on one blocks its thread without the worker's client, which would secede
#: around a blocking wait in a body.
THREAD_EVENTS: dict[str, threading.Event] = collections.defaultdict(threading.Event)


@coroutine
def thread_blocker(name, timeout):
    return THREAD_EVENTS[name].wait(timeout)


@coroutine
def blocks_inline(name):
    """Runs a call inline that blocks its thread (and its seat of the
    worker's pool) until ``THREAD_EVENTS[name]`` is set."""
    return (yield [thread_blocker(name, 30), inc(1)])


@coroutine
def tree_of_tasks(depth):
    if depth == 0:
        return 1
    a, b = yield [tree_of_tasks(depth - 1), tree_of_tasks(depth - 1)]
    return a + b


@coroutine
def gated_tree(lo, hi, go, folder):
    _append(folder, "starts", f"{lo}-{hi}")
    if hi - lo == 1:
        _append(folder, "leaf", str(lo))
        assert Event(go).wait(timeout=60)
        return lo * lo
    mid = (lo + hi) // 2
    a, b = yield [gated_tree(lo, mid, go, folder), gated_tree(mid, hi, go, folder)]
    return a + b


# --------------------------------------------------------------------------
# results


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_fib_and_afib(c, s, a):
    assert await c.compute(fib(20)) == 6765
    assert await c.compute(afib(15)) == 610


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_inline_inside_a_named_span(c, s, a):
    # Worker.execute runs a task of a named span inside dask.annotate(span=...):
    # that annotation alone must not turn the calls into tasks.
    r = recorder(s)
    with distributed.span("search"):
        fut = c.compute(fib(14, dask_key_name="fib-span"))
    assert await fut == 377
    assert len(r.seen) < 10, r.seen


def test_tree_of_a_root_whose_calls_all_ran_inline():
    from distributed import Client, LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        f = client.compute(fib(10))
        assert f.result() == 55
        t = dask_coro.tree(f)
        assert [n.key for n in t] == [f.key] and t.edges == []
        assert t.counts["spawned"] == 0 and t.counts["depth"] == 0
        assert dask_coro.progress(f, file=io.StringIO())["spawned"] == 0


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_scheduler_sees_few_tasks(c, s, a):
    r = recorder(s)
    assert await c.compute(fib(16, dask_key_name="fib-root")) == 987
    # 3,193 calls; on one single-threaded worker nothing is idle to hand
    # work to, and nothing waits: the root runs them all.
    assert "fib-root" in r.seen
    assert len(r.seen) < 10, r.seen


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)], config={"coro": {"inline": {"enabled": False}}})
async def test_disabled_every_call_is_a_task(c, s, a):
    assert dask.config.get("coro.inline.enabled") is False
    r = recorder(s)
    assert await c.compute(fib(8, dask_key_name="fib-root")) == 21
    # 67 calls, 67 tasks, each with a key derived from its place in the tree.
    assert len(r.seen) == 67
    assert derive_key("fib", "fib-root", 0, (0,)) in places(r.seen)


# --------------------------------------------------------------------------
# errors


@pytest.mark.parametrize("kind", ["plain", "after-a-yield"])
@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_child_error_raised_at_the_yield_and_recovered(c, s, a, tmp_path, kind):
    (etype, msg, tb), after = await c.compute(catches(str(tmp_path), kind))
    assert etype is ValueError
    assert msg == ("boom 7" if kind == "plain" else "late boom 8")
    assert ("in boom" if kind == "plain" else "in late_boom") in tb, tb
    assert after == [11, 21]
    # The sibling after the failed child never started.
    assert _lines(tmp_path, "runs") == ["first"]


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_unhandled_child_error_fails_the_root(c, s, a):
    fut = c.compute(does_not_catch())
    with pytest.raises(ValueError, match=r"^boom 8$") as info:
        await fut
    assert type(info.value) is ValueError
    assert "in boom" in "".join(traceback.format_exception(info.value))
    fut.release()
    await async_poll_for(lambda: not s.tasks, timeout=20)


# --------------------------------------------------------------------------
# remote leaves under inline frames; promotion


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_child_yielding_a_delayed_task_keys_are_derived_and_stable(c, s, a):
    root = "inline-root"
    expected = {
        root,
        # The delayed task: its key derives from the inline frame it runs under.
        derive_key("double", (root, 0, (0,)), 0, ()),
        # The siblings not started when that frame waited: promoted to tasks.
        derive_key("inc", root, 0, (1,)),
        derive_key("inc", root, 0, (2, "k")),
    }
    r = recorder(s)
    seen = []
    for _ in range(2):
        r.seen = set()
        fut = c.compute(with_remote_child(dask_key_name=root))
        assert await fut == [6, 2, {"k": 3}]
        del fut
        await async_poll_for(lambda: not s.tasks, timeout=20)
        seen.append(r.seen)
    assert places(seen[0]) == expected, seen[0]
    assert seen[1] == seen[0]


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_sibling_that_resolves_a_promise_another_waits_on(c, s, a):
    # The waiter waits on the cluster: its unstarted sibling, which resolves
    # what it waits for, must become a task first (else: deadlock).
    assert await asyncio.wait_for(c.compute(promise_siblings()), 30) == [42, "set"]


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_sibling_that_sets_an_event_another_blocks_on(c, s, a):
    """A documented limit: an inline call that blocks its thread on something
    only a later sibling provides waits out its own timeout, because the
    sibling is handed out between calls, never during one. The fix docs/limitations.md
    names: ``inline=False`` on the waiter, which then is a task (started
    before the inline sibling runs). One thread: with an idle one, a push
    arriving before the waiter starts would hand the setter out first."""
    name = f"ev-{uuid.uuid4().hex}"
    got = await asyncio.wait_for(c.compute(event_siblings(name, 0.5)), 30)
    assert got == [False, "set"]
    name = f"ev-{uuid.uuid4().hex}"
    got = await asyncio.wait_for(c.compute(event_siblings(name, 20.0, False)), 30)
    assert got == [True, "set"]


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 2)], config={"coro": {"inline": {"enabled": False}}})
async def test_sibling_that_sets_an_event_another_blocks_on_inline_off(c, s, a):
    got = await asyncio.wait_for(
        c.compute(event_siblings(f"ev-{uuid.uuid4().hex}")), 30
    )
    assert got == [True, "set"]


@coroutine
def chain(n):
    if n == 0:
        return (yield dask.delayed(_double)(0, dask_key_name="double-0"))
    return (yield chain(n - 1)) + 1


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)], timeout=20)
async def test_deep_inline_chain_waiting_at_the_bottom(c, s, a):
    # Deeper than Python's recursion limit: as tasks, 1,501 nested coroutines.
    assert await c.compute(chain(1500)) == 1500


# --------------------------------------------------------------------------
# cancellation


async def _assert_tree_stopped(s, workers, folder, depth):
    # Every frame open when the run stopped was closed, innermost first, the
    # root last.
    await async_poll_for(lambda: str(depth) in _lines(folder, "closed"), timeout=20)
    closed = [int(x) for x in _lines(folder, "closed")]
    assert closed == sorted(set(closed)) and closed[-1] == depth, closed
    n = await ticks_after_cancel(s, workers, folder)
    assert n < 2**depth  # stopped before the end


@pytest.mark.parametrize("how", ["cancel", "close-client", "cancel-nothing-idle"])
@pytest.mark.timeout(90)
@cluster(nthreads=[("", 1)])
async def test_cancelling_stops_a_tree_running_inline(c, s, a, tmp_path, how):
    """Once its key is released the worker's thread looks idle to the
    scheduler, so the run learns it is cancelled when it next hands work out;
    with a task waiting for a resource no worker has, nothing is idle and it
    learns it from the check it makes every ``check_every`` inline calls."""
    depth = 9  # 1,023 calls, 512 leaves of 5 ms
    c2 = await Client(s.address, asynchronous=True, set_as_default=False)
    unrunnable = None
    if how == "cancel-nothing-idle":
        unrunnable = c.submit(_double, 1, resources={"NOWHERE": 1}, pure=False)
        await async_poll_for(lambda: len(s.unrunnable) == 1, timeout=20)
    try:
        fut = c2.compute(sleepy(str(tmp_path), depth, dask_key_name="sleepy-root"))
        await async_poll_for(lambda: len(_lines(tmp_path, "ticks")) >= 5, timeout=20)
        assert not fut.done()
        if how == "close-client":
            await c2.close()
        else:
            await c2.cancel(fut)
        if unrunnable is not None:
            # Closed while nothing looked idle.
            await async_poll_for(
                lambda: str(depth) in _lines(tmp_path, "closed"), timeout=20
            )
            assert len(s.unrunnable) == 1
            unrunnable.release()
            del unrunnable
        await _assert_tree_stopped(s, [a], tmp_path, depth)
    finally:
        await c2.close()
    # The worker still serves coroutines.
    assert await c.compute(inc(1)) == 2


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 2)])
async def test_cancelling_while_the_root_waits_on_a_remote_leaf(c, s, a, tmp_path):
    """No further inline call to notice the cancellation at: the runner has
    to be woken while it waits."""
    started, never = f"started-{uuid.uuid4().hex}", f"never-{uuid.uuid4().hex}"
    try:
        fut = c.compute(waits_on_a_blocked_task(str(tmp_path), started, never))
        await Event(started, client=c).wait(timeout=20)
        await c.cancel(fut)
        await async_poll_for(
            lambda: _lines(tmp_path, "finally") == ["waiter"], timeout=15
        )
    finally:
        await Event(never, client=c).set()
    await async_poll_for(lambda: not s.tasks, timeout=20)
    await async_poll_for(lambda: not a.state.tasks, timeout=20)


# --------------------------------------------------------------------------
# current_key, compute once


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_current_key_in_inline_children_is_the_root_key(c, s, a):
    mine, children = await c.compute(keys_everywhere(dask_key_name="the-root"))
    assert mine == "the-root"
    assert children == ["the-root", ("the-root", "the-root"), ("the-root", "the-root")]


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_call_computed_inline_is_computed_once(c, s, a, tmp_path):
    out = await c.compute(reuses(str(tmp_path)))
    assert out == (10, 10, 10, 11, 15)
    assert _lines(tmp_path, "runs") == ["c"]


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_same_call_twice_waiting_on_the_cluster_runs_once(c, s, a, tmp_path):
    """The first occurrence runs inline and waits for its delayed task: the
    second must not be handed out as a task that runs the body again."""
    assert await c.compute(same_call_twice(str(tmp_path))) == [42, 42]
    assert _lines(tmp_path, "runs") == ["c"]


# --------------------------------------------------------------------------
# handed out while a lazy value on the same call is computed in place


class _AlwaysIdle:
    """Idle threads elsewhere that never run out: every call that could run
    inline is handed out as a task (the stolen path of tests/conformance.py)."""

    @property
    def n(self):
        return 1 << 20

    @n.setter
    def n(self, value):
        pass


Total = collections.namedtuple("Total", "total n")


@coroutine
def totals(folder):
    _append(folder, "runs", "g")
    yield []
    return Total(40, 1)


def _derived(c, how):
    if how == "item":
        return c[0]
    if how == "attr":
        return c.total
    return c.total + 1


@coroutine
async def gathers_derived_and_call(folder, how, first):
    c = totals(folder)
    d = _derived(c, how)
    got = await gather([d, c] if first else [c, d])
    return got if first else got[::-1]


@coroutine
def yields_derived_and_call(folder, how, first):
    c = totals(folder)
    d = _derived(c, how)
    got = yield ([d, c] if first else [c, d])
    return got if first else got[::-1]


@coroutine(inline=False)
def calls_as_task(body, folder, how, first):
    return (yield body(folder, how, first))


@pytest.mark.parametrize("first", [True, False], ids=["derived-first", "call-first"])
@pytest.mark.parametrize("how", ["item", "attr", "attr+1"])
@pytest.mark.parametrize("body", [gathers_derived_and_call, yields_derived_and_call], ids=["async", "gen"])
@pytest.mark.parametrize("stolen", [True, False], ids=["stolen", "inline"])
@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 1)])
async def test_call_and_a_lazy_value_on_it_in_one_yield_run_it_once(
    c, s, a, b, tmp_path, body, how, first, stolen
):
    """``c = g(); yield [c[0], c]``: computed in place, ``c[0]`` needs ``c``;
    with every call handed out as soon as it could be (a cluster whose idle
    threads never run out), ``c`` was handed out as a task while ``c[0]`` ran
    ``g`` again in place (two keys for one call). It runs once, as in dask."""
    if stolen:
        for w in (a, b):
            _watcher(w).idle = _AlwaysIdle()
    folder = str(tmp_path)
    want = {"item": 40, "attr": 40, "attr+1": 41}[how]
    got = await c.compute(calls_as_task(body, folder, how, first))
    assert list(got) == [want, Total(40, 1)]
    assert _lines(tmp_path, "runs") == ["g"]


@coroutine
def tiny_double(x):
    return 2 * x


@coroutine(inline=False)
def doubles_as_task(n):
    return sum((yield [tiny_double(i) for i in range(n)]))


def test_a_function_is_short_only_when_measured_under_a_quarter_of_a_round_trip_and_2_ms():
    """The bounds of ``runtime/timings.py``, without a cluster: never run
    here is not short; a mean under a quarter of the round trip and under
    ``CAP`` is; a busy scheduler's long round trips never make a child of
    milliseconds short; a slow run raises the mean past the bound."""
    from dask_coro.runtime.timings import CAP, DEFAULT_ROUND_TRIP, FRACTION, Timings

    t = Timings()
    assert not t.short("never-ran")
    t.ran("tiny", 0.0001)
    assert t.short("tiny")
    t.ran("quarter", FRACTION * DEFAULT_ROUND_TRIP * 1.01)  # 5 ms trips: 1.26 ms is not short
    assert not t.short("quarter")
    t.tripped(1.0)  # a scheduler so busy that a trip takes a second
    t.ran("milliseconds", CAP * 1.5)
    assert t.short("quarter") and not t.short("milliseconds")
    for _ in range(3):
        t.ran("tiny", 0.05)  # three slow runs: its mean is 29 ms
    assert not t.short("tiny")


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 1)])
async def test_idle_threads_are_not_handed_short_plain_calls(c, s, a, b, monkeypatch):
    """With idle threads elsewhere every call that could run inline is handed
    out as a task; a plain function measured far shorter than a task's round
    trip (``runtime/timings.py``) is not: it runs inline, as it would with
    nothing idle. The first yield hands them out (nothing is measured yet),
    and their runs as tasks measure them.

    The bounds are widened here (a run under a second, a round trip of ten):
    on a loaded machine a run of a function of microseconds is timed at
    milliseconds now and then (a thread switch in it), and the mean under
    the real 2 ms bound is then a matter of luck. What is checked is the
    decision: measured short runs inline, not measured goes out."""
    from dask_coro.runtime import timings

    monkeypatch.setattr(timings, "CAP", 1.0)
    monkeypatch.setattr(timings.TIMINGS, "round_trip", 10.0)
    for w in (a, b):
        _watcher(w).idle = _AlwaysIdle()
    r = recorder(s)
    assert await c.compute(doubles_as_task(30)) == 870
    assert len(r.ran("tiny_double")) > 0  # handed out: not measured yet
    r.memory.clear()
    assert await c.compute(doubles_as_task(30)) == 870
    assert r.ran("tiny_double") == []  # every one measured short by then: inline
    await async_poll_for(lambda: not s.tasks, timeout=20)


# --------------------------------------------------------------------------
# processes: stealing, a worker dying


@pytest.mark.parametrize("stealing", ["push", "poll"])
@pytest.mark.timeout(120)
def test_work_is_stolen_by_an_idle_worker(stealing):
    with (
        dask.config.set({"coro.inline.stealing": stealing}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as lc,
        Client(lc) as client,
    ):
        workers = set(client.nthreads())
        assert len(workers) == 2
        where = client.compute(where_tree(6)).result(timeout=90)
        assert len(where) == 64  # every leaf ran, once
        # Leaves run on the worker that runs their parent: the second worker
        # only ran some if a subtree was handed to it.
        assert set(where) == workers


@pytest.mark.timeout(120)
@cluster(nthreads=[("", 1), ("", 1)], Worker=Nanny, timeout=100)
async def test_worker_running_the_root_inline_dies(c, s, a, b, tmp_path):
    go = f"go-{uuid.uuid4().hex}"
    n = 8
    fut = c.compute(gated_tree(0, n, go, str(tmp_path), dask_key_name="root"))
    try:
        # The root runs its tree inline and is blocked in a leaf.
        await async_poll_for(
            lambda: (
                "0" in _lines(tmp_path, "leaf")
                and "root" in s.tasks
                and s.tasks["root"].processing_on is not None
            ),
            timeout=30,
        )
        address = s.tasks["root"].processing_on.address
        (victim,) = [nanny for nanny in (a, b) if nanny.worker_address == address]
        os.kill(victim.process.process.pid, signal.SIGKILL)
        await async_poll_for(lambda: address not in s.workers, timeout=30)
        assert not fut.done()
    finally:
        await Event(go, client=c).set()
    assert await fut.result(timeout=60) == sum(i * i for i in range(n))
    # The root ran its body again from the start, elsewhere.
    assert _lines(tmp_path, "starts").count(f"0-{n}") >= 2


# --------------------------------------------------------------------------
# push: the scheduler tells subscribed workers of idle threads


def _pushes_received(*workers):
    return sum(w.plugins[_KeyWatcher.name].pushes for w in workers if _KeyWatcher.name in w.plugins)


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 1)])
async def test_scheduler_pushes_to_the_subscribed_worker_when_a_thread_frees(c, s, a, b):
    go = Event(f"go-{uuid.uuid4().hex}", client=c)
    blocker = c.submit(_wait_event, go.name, 60, workers=[b.address], pure=False)
    await async_poll_for(lambda: b.state.executing_count == 1, timeout=20)
    fut = c.compute(sleepy_where(6), workers=[a.address])
    await async_poll_for(lambda: INLINE in s.plugins and a.address in s.plugins[INLINE].subscribed,
                         timeout=20)
    plugin = s.plugins[INLINE]
    # Subscribing made the scheduler look: both threads busy, nothing to tell.
    await async_poll_for(lambda: plugin.counts["check"] >= 1, timeout=20)
    assert plugin.counts["push"] == 0 and _pushes_received(a, b) == 0
    assert not fut.done()
    await go.set()  # b's thread frees
    assert await blocker is True
    where = await fut
    assert len(where) == 64
    # The push made a hand a subtree to b.
    assert b.address in where and a.address in where
    assert plugin.counts["push"] >= 1
    assert plugin.counts["pushed"] >= plugin.counts["push"]
    # Every push sent was received (the streams may still carry the last ones).
    await async_poll_for(lambda: _pushes_received(a, b) == plugin.counts["push"], timeout=20)
    assert plugin.counts["poll"] == 0
    # Both unsubscribe once they ran nothing inline for a second.
    await async_poll_for(lambda: not plugin.subscribed, timeout=20)
    assert plugin.counts["unsubscribe"] == plugin.counts["subscribe"]


async def _subscribed_and_looked_at(c, s, a):
    """Worker ``a`` ran a tree inline and stays subscribed (its stealer
    cancelled); the scheduler looked at the idle threads since the tree
    ended. Gives the scheduler's inline plugin."""
    assert len(await c.compute(sleepy_where(2), workers=[a.address])) == 4
    plugin = s.plugins[INLINE]
    assert a.address in plugin.subscribed
    a.plugins[_KeyWatcher.name].stealer.cancel()  # a stays subscribed
    checks = plugin.counts["check"]
    await async_poll_for(lambda: plugin.counts["check"] > checks, timeout=20)
    return plugin


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 1)])
async def test_a_tree_starting_on_a_subscribed_worker_is_pushed_to_at_once(c, s, a, b):
    """A worker stays subscribed between its inline runs. A tree that starts
    on it while the other worker is idle frees no thread until its calls
    are handed out: its start is an idle event, and the push that hands b a
    subtree comes from that event (not from a later look at threads left
    idle)."""
    plugin = await _subscribed_and_looked_at(c, s, a)
    events_at_push = []
    push = plugin._push

    def recording_push(n, *args):
        sent = push(n, *args)
        if sent:  # (none to a worker with no task running)
            events_at_push.append(plugin.counts["event"])
        return sent

    plugin._push = recording_push
    events = plugin.counts["event"]
    where = await c.compute(sleepy_where(6), workers=[a.address])
    assert len(where) == 64 and b.address in where
    assert events_at_push and events_at_push[0] > events


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 1)])
async def test_a_push_is_not_held_for_the_rest_of_a_batch(c, s, a, b):
    """The push that follows a tree's start goes on the stream that just
    carried the tree's compute-task, whose next batch waits out the stream's
    interval (5 ms; 10 s here): it is sent at once. Held, it would come after
    a had run the whole tree (64 leaves of 10 ms) inline."""
    await _subscribed_and_looked_at(c, s, a)
    stream = s.stream_comms[a.address]
    interval, stream.interval = stream.interval, 10
    try:
        where = await c.compute(sleepy_where(6), workers=[a.address])
    finally:
        stream.interval = interval
    assert len(where) == 64 and b.address in where


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 1)])
async def test_a_tree_starting_right_after_a_look_is_pushed_to_at_once(c, s, a, b):
    """The looks at the threads a tree left idle tell nobody (no worker runs a
    task) and hold the next look back by an interval; a tree that starts
    meanwhile on a subscribed worker is looked at at once all the same (a
    start has a limit of its own), so its first hand-out does not wait out
    the interval (an hour here)."""
    assert len(await c.compute(sleepy_where(2), workers=[a.address])) == 4
    plugin = s.plugins[INLINE]
    assert a.address in plugin.subscribed
    a.plugins[_KeyWatcher.name].stealer.cancel()  # a stays subscribed
    await async_poll_for(lambda: plugin._stranded, timeout=20)
    plugin.interval = 3600
    plugin._last = time.monotonic()  # as if that look had just run
    where = await c.compute(sleepy_where(6), workers=[a.address])
    assert len(where) == 64 and b.address in where


@coroutine
def switch_interval():
    return sys.getswitchinterval()


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_the_switch_interval_is_short_while_calls_run_inline(c, s, a):
    """While a run inline holds the GIL, the worker's event loop must get it
    soon (to read pushes and send stolen calls): the interpreter's switch
    interval is 1 ms while calls run inline, and what it was after."""
    before = sys.getswitchinterval()
    assert before > 0.001  # CPython's default, 5 ms
    assert await c.compute(switch_interval()) == 0.001
    assert sys.getswitchinterval() == before
    with dask.config.set({"coro.inline.enabled": False}):
        assert await c.compute(switch_interval()) == before
    with dask.config.set({"coro.inline.switch-interval": None}):  # leave it alone
        assert await c.compute(switch_interval()) == before
    with dask.config.set({"coro.inline.switch-interval": "2ms"}):
        assert await c.compute(switch_interval()) == 0.002
    assert sys.getswitchinterval() == before
    with dask.config.set({"coro.inline.switch-interval": "soon"}):
        with pytest.raises(ValueError, match=r"coro\.inline\.switch-interval: 'soon' is not a time interval"):
            await c.compute(switch_interval())
    assert sys.getswitchinterval() == before


def _received(w):
    return w.plugins[_KeyWatcher.name].pushes


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)] * 3)
async def test_each_idle_thread_is_pushed_to_one_worker_round_robin(c, s, *workers):
    """Three workers run calls inline, each blocked in one: one idle thread
    is pushed to one of them, the next to the next; five to all three,
    shares adding up to five."""
    go = f"go-{uuid.uuid4().hex}"
    futs = [c.compute(blocks_inline(go), workers=[w.address]) for w in workers]
    try:
        await async_poll_for(
            lambda: INLINE in s.plugins and len(s.plugins[INLINE].subscribed) == 3, timeout=20)
        plugin = s.plugins[INLINE]
        # Whatever was pushed while they started has arrived.
        await async_poll_for(
            lambda: _pushes_received(*workers) == plugin.counts["push"], timeout=20)
        before = [_received(w) for w in workers]
        for k in (1, 2, 3):
            plugin._push(1)
            await async_poll_for(lambda k=k: _pushes_received(*workers) == sum(before) + k,
                                 timeout=20)
        assert [_received(w) - n for w, n in zip(workers, before)] == [1, 1, 1]
        pushed = plugin.counts["pushed"]
        plugin._push(5)
        await async_poll_for(lambda: _pushes_received(*workers) == sum(before) + 6, timeout=20)
        assert [_received(w) - n for w, n in zip(workers, before)] == [2, 2, 2]
        assert plugin.counts["pushed"] == pushed + 5
    finally:
        THREAD_EVENTS[go].set()
    assert await c.gather(futs) == [[True, 2]] * 3


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)])
async def test_a_worker_takes_the_idle_threads_counted_on_it_as_it_counts_them(c, s, a):
    """The scheduler hears a thread was taken again (a resumed step of a
    seceded run) a message late: a push may count one of a worker's own
    threads idle that is not. That worker counts its own threads itself:
    a's one thread runs a call inline, so a push of one idle thread counted
    on a hands nothing out, one counted on another worker does."""
    go = f"go-{uuid.uuid4().hex}"
    fut = c.compute(blocks_inline(go), workers=[a.address])
    try:
        await async_poll_for(lambda: INLINE in s.plugins and a.address in s.plugins[INLINE].subscribed, timeout=20)
        plugin = s.plugins[INLINE]
        await async_poll_for(lambda: _pushes_received(a) == plugin.counts["push"], timeout=20)
        watcher = a.plugins[_KeyWatcher.name]
        elsewhere = "tcp://127.0.0.1:1"
        for at, expected in (({a.address: 1}, 0), ({elsewhere: 1}, 1), ({a.address: 1, elsewhere: 1}, 1), (None, 1)):
            before = _received(a)
            watcher.idle.n = 0
            assert plugin._push(1, at) == 1
            await async_poll_for(lambda before=before: _received(a) == before + 1, timeout=20)
            assert watcher.idle.n == expected, at
    finally:
        THREAD_EVENTS[go].set()
    assert await fut == [True, 2]


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 1)])
async def test_pushes_lost_nothing_hangs(c, s, a, b, monkeypatch):
    """Every push lost (as to a stream that closed): the root's worker hears
    of no idle thread and runs the whole tree inline, to the same result."""
    from dask_coro.runtime import scheduler as inline_scheduler

    monkeypatch.setattr(inline_scheduler, "send_to_worker", lambda *args: False)
    where = await c.compute(sleepy_where(5), workers=[a.address])
    assert where == [a.address] * 32
    plugin = s.plugins[INLINE]
    assert plugin.counts["check"] >= 1 and plugin.counts["push"] == 0
    assert _pushes_received(a, b) == 0


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 1)])
async def test_a_run_starting_while_the_scheduler_backs_off_hears_at_once(c, s, a, b, monkeypatch):
    """While threads stay idle, the scheduler looks at them less and less
    often (here, as after an hour of it, once an hour). A coroutine that then
    starts on a worker still subscribed from an earlier run hears of the idle
    thread at once, not at that next look: its tree runs on both workers.
    (With its count up to a second late, a tree of 1.3 s ran on one worker.)"""
    from dask_coro.runtime import scheduler as inline_scheduler
    from dask_coro.runtime import worker as inline_worker

    monkeypatch.setattr(inline_worker, "_QUIET", 3600)  # a stays subscribed
    monkeypatch.setattr(inline_scheduler, "MAX_BACKOFF", 3600)
    assert await c.compute(fib(5), workers=[a.address]) == 5
    await async_poll_for(lambda: INLINE in s.plugins and a.address in s.plugins[INLINE].subscribed,
                         timeout=20)
    plugin = s.plugins[INLINE]
    # Both threads idle: the scheduler looks again later and later; from its
    # next look on, as after an hour of it, once an hour.
    await async_poll_for(lambda: plugin._left == 2, timeout=20)
    plugin._backoff = 3600
    checks = plugin.counts["check"]
    await async_poll_for(lambda: plugin.counts["check"] > checks, timeout=20)
    assert plugin._left == 2 and plugin._due - time.monotonic() > 600
    where = await c.compute(sleepy_where(6), workers=[a.address])
    assert len(where) == 64
    assert set(where) == {a.address, b.address}


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 2)], config={"coro": {"inline": {"interval": "1h"}}})
async def test_pushes_are_rate_limited(c, s, a, b):
    """With an interval longer than the test, the scheduler looks at idle
    threads once, at the first idle event (a's subscription), and pushes
    once, whatever the events after it (b's tasks ending, b subscribing)."""
    where = await c.compute(sleepy_where(6), workers=[a.address])
    assert len(where) == 64
    plugin = s.plugins[INLINE]
    assert plugin.counts["event"] >= 2
    assert plugin.counts["check"] == 1
    assert plugin.counts["push"] == 1
    # b got work from that one push.
    assert b.address in where
    await async_poll_for(lambda: _pushes_received(a, b) == 1, timeout=20)


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 1)])
async def test_no_push_while_no_worker_runs_inline(c, s, a, b):
    await c.register_plugin(InlinePlugin())
    plugin = s.plugins[INLINE]
    # Plain tasks, and coroutines with inline off (a coroutine task that starts
    # with it on subscribes, whatever it yields): idle threads come and go, no
    # worker subscribes, the scheduler neither looks nor sends.
    with dask.config.set({"coro.inline.enabled": False}):
        assert await c.compute(tree_of_tasks(4)) == 16
    assert await c.gather(c.map(_double, range(20), pure=False)) == [2 * i for i in range(20)]
    assert plugin.counts == dict.fromkeys(plugin.counts, 0)
    # A run inline subscribes its worker; once it unsubscribed, idle events
    # again cost nothing.
    assert len(await c.compute(sleepy_where(3))) == 8
    assert plugin.counts["subscribe"] >= 1
    await async_poll_for(lambda: not plugin.subscribed, timeout=20)
    before = dict(plugin.counts)
    await c.gather(c.map(_double, range(20), pure=False))
    assert plugin.counts == before


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1), ("", 1)])
async def test_a_worker_leaving_is_unsubscribed(c, s, a, b):
    # It stays subscribed for a second after its last inline run; stop it
    # from ever unsubscribing, then close it.
    assert len(await c.compute(sleepy_where(5), workers=[a.address])) == 32
    plugin = s.plugins[INLINE]
    await async_poll_for(lambda: a.address in plugin.subscribed, timeout=20)
    a.plugins[_KeyWatcher.name].stealer.cancel()
    unsubscribed = plugin.counts["unsubscribe"]
    address = a.address
    await a.close()
    await async_poll_for(lambda: address not in s.workers, timeout=20)
    assert address not in plugin.subscribed and address not in plugin.order
    assert plugin.counts["unsubscribe"] == unsubscribed  # removed with the worker
    # b still runs inline and gets its own subscription.
    assert len(await c.compute(sleepy_where(3))) == 8
    assert plugin.order == [b.address]


@pytest.mark.timeout(60)
@cluster(nthreads=[("", 1)], config={"coro": {"inline": {"stealing": "sometimes"}}})
async def test_a_bad_stealing_setting_fails_the_coroutine(c, s, a):
    message = "coro.inline.stealing: 'sometimes' is not one of push, poll"
    with pytest.raises(ValueError, match=re.escape(message)):
        await c.compute(fib(3))
    # Nothing left behind: the settings are checked before the run starts.
    assert not getattr(a.plugins.get(_KeyWatcher.name), "runs", None)
    with dask.config.set({"coro.inline.stealing": "push"}):
        assert await c.compute(fib(3)) == 2
