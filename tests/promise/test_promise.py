"""Promise: depend on a result before it exists; rewire it at run time.

Every test runs with the scheduler's and the workers' validation on, so each
rewrite of scheduler state is checked by distributed's own invariants."""

from __future__ import annotations

from collections import namedtuple

import dask
import pytest
from distributed import Event
from distributed.utils_test import async_poll_for, gen_cluster
from helpers import cluster

from dask_coro import Promise, PromiseError, coroutine
from dask_coro.examples import (
    inc,
    logical_task,  # the README's promise example
)

validated = dict(
    client=True,
    nthreads=[("", 1), ("", 1)],
    scheduler_kwargs={"validate": True},
    worker_kwargs={"validate": True},
)


class HandleOf:
    """Carries a promise into a task without making it a dependency."""

    def __init__(self, p):
        self.p = p

    def __getitem__(self, i):
        return self.p


class HandlesOf:
    """Carries promises into a task without making them dependencies."""

    def __init__(self, ps):
        self.ps = list(ps)

    def __getitem__(self, i):
        return self.ps[i]


@gen_cluster(**validated)
async def test_the_use_case_delegates_from_inside_a_task(c, s, a, b):
    p = await asyncio_to(logical_task, 5)
    assert await c.compute(dask.delayed(lambda v: v + 1)(p)) == 101
    assert await c.compute(p) == 100
    plugin = s.plugins["dask-coro-promises"]
    assert len(plugin.history[p.key]) == 2  # subprocess, then aggregate


async def asyncio_to(fn, *args):
    # Promise() and resolve_with() are blocking client calls; run them off the
    # event loop the asynchronous test client lives on.
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


@gen_cluster(**validated)
async def test_dependents_submitted_before_the_promise_is_resolved(c, s, a, b):
    p = await asyncio_to(Promise)
    total = c.compute(dask.delayed(lambda v: v * 2)(p))
    direct = c.compute(p)
    await async_poll_for(lambda: p.key in s.tasks and len(s.tasks) >= 2, timeout=10)
    assert s.tasks[p.key].state == "no-worker"  # parked: nothing runs, nothing waits
    assert not total.done() and not direct.done()
    await asyncio_to(p.resolve_with, dask.delayed(sum)([1, 2, 3]))
    assert await total == 12
    assert await direct == 6


@gen_cluster(**validated)
async def test_resolve_with_every_kind_of_value(c, s, a, b):
    da = pytest.importorskip("dask.array")
    fut = c.submit(lambda: "from a future", key="the-future")
    for x, expected in [
        (fut, "from a future"),
        (7, 7),
        (da.ones(10, chunks=5).sum(), 10.0),
        (dask.delayed(max)([1, 5]), 5),
    ]:
        p = await asyncio_to(Promise)
        await asyncio_to(p.resolve_with, x)
        assert await c.compute(p) == expected


@coroutine
def resolves(handle, x):
    handle[0].resolve_with(x)
    return "resolved"


@coroutine
def creates_and_waits():
    p = Promise()  # created inside a running coroutine, on a worker
    done = yield resolves(HandleOf(p), dask.delayed(lambda: 21)())
    value = yield p
    return done, value * 2


@coroutine
def yields_promise(q):
    return (yield q) + 1


@gen_cluster(**validated)
async def test_promises_in_coroutines(c, s, a, b):
    assert await c.compute(creates_and_waits()) == ("resolved", 42)
    # A promise passed into a coroutine as an argument is a dependency: the
    # coroutine starts once the promise has its value.
    p = await asyncio_to(Promise)
    fut = c.compute(yields_promise(p))
    await asyncio_to(p.resolve_with, 5)
    assert await fut == 6


@gen_cluster(**validated)
async def test_value_not_copied_when_target_is_local(c, s, a, b):
    @dask.delayed
    def big():
        return list(range(1000))

    p = await asyncio_to(Promise)
    target = big()
    keep_target = c.compute(target)  # keep the target's data to compare with
    await asyncio_to(p.resolve_with, target)
    fut = c.compute(p)
    await fut
    holder = a if p.key in a.data else b
    # The promise ran on its target's worker, as an alias: the same object.
    assert holder.data[p.key] is holder.data[target.key]
    del keep_target


# --- containers: traversed as dask.compute and a yield traverse them -----------

Pair = namedtuple("Pair", "left right")


@dask.delayed
def plus_one(x):
    return x + 1


def containers():
    """Containers of lazy values resolve_with must compute (delayed and
    coroutine calls, a collection, nested, the same value twice), with what
    plain dask computes for each."""
    da = pytest.importorskip("dask.array")
    twice = plus_one(10)
    return [
        [inc(1), inc(2)],
        (plus_one(1), "plain", [inc(5), {"deep": plus_one(2)}]),
        {"a": inc(1), "b": [twice, twice], "n": 3},
        Pair(inc(1), da.ones(4, chunks=2).sum()),
        [1, {"no": ("lazy", "value")}],
    ]


@gen_cluster(**validated)
async def test_resolve_with_a_container_computes_it(c, s, a, b):
    for x in containers():
        (expected,) = dask.compute(x, scheduler="sync")  # plain dask, no cluster
        p = await asyncio_to(Promise)
        await asyncio_to(p.resolve_with, x)
        assert await c.compute(p) == expected
        assert type(await c.compute(p)) is type(expected)
    # Futures in a container: the values, as gather gives them.
    fut = c.submit(lambda: "from a future", key="the-future")
    x = {"a": fut, "b": [fut, inc(1)]}
    p = await asyncio_to(Promise)
    await asyncio_to(p.resolve_with, x)
    assert await c.compute(p) == {"a": "from a future", "b": ["from a future", 2]}
    assert await c.gather({"a": fut}) == {"a": "from a future"}
    # A dependent of the promise gets the computed container too.
    p = await asyncio_to(Promise)
    dep = c.compute(dask.delayed(sum)(p))
    await asyncio_to(p.resolve_with, [inc(1), plus_one(2)])
    assert await dep == 2 + 3


@gen_cluster(**validated)
async def test_resolve_with_a_set_of_lazy_values_is_refused(c, s, a, b):
    p = await asyncio_to(Promise)
    with pytest.raises(PromiseError, match=r"set of lazy values at \[1\].*use a list"):
        await asyncio_to(p.resolve_with, [1, {plus_one(1)}])
    await asyncio_to(p.resolve_with, [{1, 2}])  # a set of plain values is a value
    assert await c.compute(p) == [{1, 2}]


@coroutine
def resolves_container(handle):
    # What containers() builds, here inside a running coroutine.
    for i, x in enumerate(containers()):
        handle[i].resolve_with(x)
    return "resolved"


@coroutine
def drives(handle):
    return (yield resolves_container(handle))


@pytest.mark.parametrize("inline", [True, False])
@gen_cluster(**validated)
async def test_resolve_with_a_container_from_a_coroutine(c, s, a, b, inline):
    # The resolver runs as an inline call of its parent, or as a task.
    expected = dask.compute(containers(), scheduler="sync")[0]
    promises = [await asyncio_to(Promise) for _ in expected]
    with dask.config.set({"coro.inline.enabled": inline}):
        assert await c.compute(drives(HandlesOf(promises))) == "resolved"
    assert await c.gather(c.compute(promises)) == expected


def test_promise_in_a_coroutine_without_a_cluster():
    # The local path: no scheduler to park a promise on, a clear error.
    with pytest.raises(PromiseError, match="distributed"):
        creates_and_waits().compute(scheduler="sync")


# --- errors ---------------------------------------------------------------------


@gen_cluster(**validated)
async def test_resolving_a_promise_with_a_final_value(c, s, a, b):
    p = await asyncio_to(Promise)
    await asyncio_to(p.resolve_with, 1)
    assert await c.compute(p) == 1
    keep = c.compute(p)
    await keep
    with pytest.raises(PromiseError, match="already has a final value"):
        await asyncio_to(p.resolve_with, 2)


@gen_cluster(**validated)
async def test_only_the_target_may_repoint(c, s, a, b):
    ev = Event()
    p = await asyncio_to(Promise)

    @dask.delayed
    def slow_target():
        Event(ev.name).wait()
        return "target"

    await asyncio_to(p.resolve_with, slow_target())
    keep = c.compute(p)

    # The client is not the target:
    with pytest.raises(PromiseError, match=r"may not resolve promise .* only that task"):
        await asyncio_to(p.resolve_with, 3)

    # Nor is another task:
    @dask.delayed
    def intruder(q):
        q[0].resolve_with(4)

    with pytest.raises(PromiseError, match=r"task .*intruder.* may not resolve"):
        await c.compute(intruder(HandleOf(p)))
    await ev.set()
    assert await keep == "target"


@gen_cluster(**validated)
async def test_target_that_fails_fails_the_dependents(c, s, a, b):
    @dask.delayed
    def broken():
        raise ValueError("target broke")

    p = await asyncio_to(Promise)
    dep = c.compute(dask.delayed(lambda v: v)(p))
    await asyncio_to(p.resolve_with, broken())
    with pytest.raises(ValueError, match="target broke"):
        await dep


@gen_cluster(**validated)
async def test_resolver_that_fails_before_resolving(c, s, a, b):
    @dask.delayed
    def resolver(initial, promise):
        raise KeyError("resolver failed first")

    def logical():
        p = Promise()
        p.resolve_with(resolver(1, p))
        return p

    p = await asyncio_to(logical)
    # The resolver received the promise: its failure names the promise it
    # left unresolved, and carries the original error's text.
    with pytest.raises(PromiseError, match=rf"promise '{p.key}' was not resolved: its resolver .*resolver.* raised KeyError: 'resolver failed first'"):
        await c.compute(dask.delayed(lambda v: v)(p))


@gen_cluster(**validated)
async def test_coroutine_resolver_that_fails_before_resolving(c, s, a, b):
    @coroutine
    def resolver(promise):
        yield dask.delayed(lambda: 1)()  # a real coroutine, suspended once
        raise ValueError("coroutine resolver failed")

    def logical():
        p = Promise()
        p.resolve_with(resolver(p))
        return p

    p = await asyncio_to(logical)
    with pytest.raises(PromiseError, match=rf"promise '{p.key}' was not resolved: .*ValueError: coroutine resolver failed"):
        await c.compute(p)


@gen_cluster(**validated)
async def test_promise_nobody_will_resolve_is_an_error(c, s, a, b):
    @coroutine
    def forgets():
        p = Promise()  # created here, never resolved, returned to the caller
        return HandleOf(p)

    handle = await c.compute(forgets())
    p = handle[0]
    with pytest.raises(PromiseError, match=r"never resolved: the task .*forgets"):
        await c.compute(p)


@gen_cluster(**validated)
async def test_resolving_with_itself(c, s, a, b):
    p = await asyncio_to(Promise)
    with pytest.raises(PromiseError, match="with itself"):
        await asyncio_to(p.resolve_with, p)


# --- a forgotten promise is refused at once (no wait for it to arrive) ----------


@coroutine
def resolves_first(handle, x):
    try:
        handle[0].resolve_with(x)
    except PromiseError as e:
        return str(e)
    return "resolved"


@pytest.mark.parametrize("where", ["client", "inline", "task"])
@gen_cluster(**validated)
async def test_resolving_a_cancelled_promise(c, s, a, b, where):
    # The default test timeout (30 s) is below the 60 s this used to wait.
    p = await asyncio_to(Promise)
    dep = c.compute(plus_one(p))
    await c.cancel([c.compute(p)])  # this client's only wish: forgotten
    await async_poll_for(lambda: p.key not in s.tasks, timeout=10)
    if where == "client":
        with pytest.raises(PromiseError, match="not known to the scheduler: it was cancelled"):
            await asyncio_to(p.resolve_with, 1)
    else:
        with dask.config.set({"coro.inline.enabled": where == "inline"}):
            message = await c.compute(drives_first(HandlesOf([p]), 1))
        assert "not known to the scheduler: it was cancelled" in message
    # As a plain dask dependent of a cancelled future: cancelled too.
    await async_poll_for(dep.cancelled, timeout=10)
    assert not s.plugins["dask-coro-promises"].marks


@coroutine
def drives_first(handle, x):
    return (yield resolves_first(handle, x))


@gen_cluster(**validated)
async def test_a_promise_resolved_while_its_creation_is_in_flight(c, s, a, b):
    # The check waits for the client's own stream, not for a timeout: with
    # the stream slow, the creation and earlier rewirings still arrive first.
    from dask_coro._internals.distributed.client import set_batch_interval

    set_batch_interval(c, 0.3)

    def create_and_resolve():
        p, q = Promise(), Promise()
        q.resolve_with(plus_one(1))
        p.resolve_with(plus_one(q))  # q's rewiring is on the stream, p's check is not
        return p

    p = await asyncio_to(create_and_resolve)
    assert await c.compute(p) == 3


# --- cycles are refused ----------------------------------------------------------


def test_plain_dask_refuses_a_cycle():
    # What we match: dask refuses a cyclic graph at once.
    with pytest.raises(RuntimeError, match=r"[Cc]ycle"):
        dask.get({"a": (abs, "b"), "b": (abs, "a")}, "a")


@gen_cluster(**validated)
async def test_resolving_promises_with_each_other(c, s, a, b):
    p1, p2, p3 = [await asyncio_to(Promise) for _ in range(3)]
    dep = c.compute(plus_one(p1))
    await asyncio_to(p2.resolve_with, p1)
    with pytest.raises(PromiseError, match=rf"{p1.key}.*dependency cycle"):
        await asyncio_to(p1.resolve_with, p2)
    # longer: p1 -> p3 -> p2 -> p1
    await asyncio_to(p3.resolve_with, p2)
    with pytest.raises(PromiseError, match="dependency cycle"):
        await asyncio_to(p1.resolve_with, p3)
    # Refused, nothing changed: p1 may still be resolved with a value.
    await asyncio_to(p1.resolve_with, 41)
    assert await dep == 42
    assert await c.gather(c.compute([p1, p2, p3])) == [41, 41, 41]


@pytest.mark.parametrize("where", ["client", "inline", "task"])
@gen_cluster(**validated)
async def test_a_cycle_through_ordinary_tasks(c, s, a, b, where):
    # p1 resolved with a task that depends on p2, p2 with one depending on p1.
    p1, p2 = [await asyncio_to(Promise) for _ in range(2)]
    await asyncio_to(p1.resolve_with, [plus_one(p2), 0])
    if where == "client":
        with pytest.raises(PromiseError, match=rf"cannot be resolved with .*{p1.key}.*dependency cycle"):
            await asyncio_to(p2.resolve_with, on_top_of(p1))
    else:
        with dask.config.set({"coro.inline.enabled": where == "inline"}):
            message = await c.compute(closes_cycle(HandlesOf([p1, p2])))
        assert "dependency cycle" in message and p1.key in message
    await asyncio_to(p2.resolve_with, 1)
    assert await c.compute(p1) == [2, 0]


def on_top_of(p):
    return dask.delayed(sum)([plus_one(plus_one(p)), 1])


@coroutine
def resolves_second_with_first(handle):
    # Built here, so that the promise is not a dependency of this coroutine.
    try:
        handle[1].resolve_with(on_top_of(handle[0]))
    except PromiseError as e:
        return str(e)
    return "resolved"


@coroutine
def closes_cycle(handle):
    return (yield resolves_second_with_first(handle))


@gen_cluster(**validated)
async def test_a_cycle_through_a_task_already_on_the_scheduler(c, s, a, b):
    # d, computed first, is the scheduler's task under its key, depending on
    # p, though inside the target's graph p would stand for itself.
    p = await asyncio_to(Promise)
    d = plus_one(p)
    dep = c.compute(d)
    await async_poll_for(lambda: dep.key in s.tasks, timeout=10)
    with pytest.raises(PromiseError, match=rf"{dep.key}.*dependency cycle"):
        await asyncio_to(p.resolve_with, dask.delayed(sum)([d, 1]))
    await asyncio_to(p.resolve_with, 1)
    assert await dep == 2


@gen_cluster(**validated)
async def test_two_resolves_racing_into_a_cycle_fail_rather_than_hang(c, s, a, b):
    # Both checks pass before either rewiring arrives (done here by hand, as
    # two clients' streams could): the second rewiring to arrive closes the
    # loop, is refused on the scheduler, and the promises fail.
    from dask_coro._internals.distributed.client import send_on_client_stream

    p1, p2 = [await asyncio_to(Promise) for _ in range(2)]
    await async_poll_for(lambda: p1.key in s.tasks and p2.key in s.tasks, timeout=10)
    t1, t2 = plus_one(p2), plus_one(p1)
    for p, t, up in [(p1, t1, p2), (p2, t2, p1)]:
        reply = await c.scheduler.dask_coro_promise_check(promise=p.key, target=t.key, upstream=[up.key])
        assert reply == {"status": "OK"}
    held = c.compute([t1, t2])
    for p, t in [(p1, t1), (p2, t2)]:
        send_on_client_stream(c, {"op": "dask-coro-promise-resolve", "promise": p.key, "target": t.key})
    with pytest.raises(PromiseError, match=rf"{p2.key}.*dependency cycle"):
        await c.compute(p2)
    with pytest.raises(PromiseError, match="dependency cycle"):
        await c.compute(p1)  # it waits on p2 through t1
    del held


@gen_cluster(**validated)
async def test_a_re_pointing_racing_into_a_cycle_is_refused_to_its_resolver(c, s, a, b):
    # p points at task T; T re-points it to X (depending on p2) while p2 is
    # resolved with Y (depending on p), both granted before either arrives.
    # The re-pointing arrives second: refused, and ``applied``, which T waits
    # in, says why (resolve_with raises it in T, and p fails with T).
    from dask_coro._internals.distributed.client import send_on_client_stream

    p, p2 = [await asyncio_to(Promise) for _ in range(2)]
    ev = Event()
    t = dask.delayed(lambda h: Event(ev.name).wait())(HandleOf(p))
    await asyncio_to(p.resolve_with, t)
    await async_poll_for(lambda: s.plugins["dask-coro-promises"].targets.get(p.key) == t.key, timeout=10)
    x, y = plus_one(p2), plus_one(p)
    checks = [(p, x, t.key, p2), (p2, y, None, p)]
    for q, target, resolver, up in checks:
        reply = await c.scheduler.dask_coro_promise_check(
            promise=q.key, target=target.key, resolver=resolver, upstream=[up.key]
        )
        assert reply["status"] == "OK"
    held = c.compute([x, y])
    for q, target, resolver, _ in checks[::-1]:
        send_on_client_stream(
            c, {"op": "dask-coro-promise-resolve", "promise": q.key, "target": target.key, "resolver": resolver}
        )
    reply = await c.scheduler.dask_coro_promise_applied(promise=p.key, target=x.key)
    assert reply["status"] == "error" and "dependency cycle" in reply["message"]
    assert s.plugins["dask-coro-promises"].targets[p.key] == t.key  # unchanged
    await ev.set()
    del held


def test_promise_needs_a_cluster():
    with pytest.raises(PromiseError, match=r"needs a distributed Client|distributed scheduler"):
        Promise()


# --- scale ------------------------------------------------------------------------


@gen_cluster(client=True, nthreads=[("", 1)], scheduler_kwargs={"validate": True})
async def test_recursive_delegation_depth_10(c, s, a):
    @dask.delayed
    def step(n, acc, promise):
        if n == 0:
            promise.resolve_with(acc)
        else:
            promise.resolve_with(step(n - 1, acc + n, promise))

    def start():
        p = Promise()
        p.resolve_with(step(10, 0, p))
        return p

    p = await asyncio_to(start)
    assert await c.compute(p) == sum(range(11))
    assert len(s.plugins["dask-coro-promises"].history[p.key]) == 12


@gen_cluster(**validated)
async def test_resolver_cancelled_before_resolving(c, s, a, b):
    from distributed.client import FutureCancelledError

    ev = Event()

    @dask.delayed
    def resolver(promise):
        Event(ev.name).wait()  # never set before the cancel
        promise.resolve_with(1)

    def logical():
        p = Promise()
        r = resolver(p)
        p.resolve_with(r)
        return p, r

    p, r = await asyncio_to(logical)
    dep = c.compute(dask.delayed(lambda v: v)(p))
    held = c.compute(r)  # the user holds the resolver too, and cancels it
    await async_poll_for(lambda: s.tasks.get(r.key) is not None
                         and s.tasks[r.key].state == "processing", timeout=10)
    await c.cancel([held])
    # Cancelling the resolver cancels what depends on it: the promise and its
    # dependents fail instead of waiting for ever.
    with pytest.raises(FutureCancelledError, match=p.key + "|lost dependencies|cancelled"):
        await dep
    await ev.set()


# --- the cycle walk's cost, on a stand-in for the scheduler's task table ---------


class _TS:
    def __init__(self, key, state="waiting"):
        self.key = key
        self.state = state
        self.dependencies = set()
        self.dependents = set()


class _CountingTasks(dict):
    looked_up = 0

    def get(self, key, default=None):
        type(self).looked_up += 1
        return super().get(key, default)


def _chain(tasks, prefix, n, state="waiting"):
    """n tasks, each depending on the one before; returns (first, last)."""
    prev = None
    for i in range(n):
        ts = tasks[f"{prefix}-{i}"] = _TS(f"{prefix}-{i}", state)
        if prev is not None:
            ts.dependencies.add(prev)
            prev.dependents.add(ts)
        prev = ts
    return tasks[f"{prefix}-0"], prev


def _plugin_on(tasks):
    from types import SimpleNamespace

    from dask_coro.promise.scheduler import PromisePlugin

    plugin = PromisePlugin()
    plugin.scheduler = SimpleNamespace(tasks=tasks)
    return plugin


def test_cycle_walk_searches_from_the_smaller_side(caplog):
    from dask_coro.promise import scheduler as promise_scheduler

    tasks = _CountingTasks()
    p = tasks["p"] = _TS("p", "no-worker")
    _, big_end = _chain(tasks, "up", 10_000)  # the target's large unfinished graph
    dep = tasks["dep"] = _TS("dep")  # the promise's one dependent
    dep.dependencies.add(p)
    p.dependents.add(dep)
    plugin = _plugin_on(tasks)
    _CountingTasks.looked_up = 0
    assert plugin._path_to("p", [big_end.key], pending=False) is None
    assert _CountingTasks.looked_up < 10  # not the 10,000 upstream
    # The same target with the promise at the bottom of its graph: found,
    # with the whole path.
    bottom = tasks["up-0"]
    bottom.dependencies.add(p)
    p.dependents.add(bottom)
    path = plugin._path_to("p", [big_end.key], pending=True)
    assert path[0] == big_end.key and path[-2:] == ["up-0", "p"] and len(path) == 10_001
    # Finished tasks wait for nothing: no path through them.
    tasks["up-5000"].state = "memory"
    assert plugin._path_to("p", [big_end.key], pending=False) is None
    # Past the bound, both sides large: no answer, a warning.
    tasks["up-5000"].state = "waiting"
    _chain(tasks, "down", 10_000)  # the promise's large unfinished graph
    tasks["down-0"].dependencies.add(p)
    p.dependents.add(tasks["down-0"])
    p.dependents.discard(bottom)
    bottom.dependencies.discard(p)
    old = promise_scheduler.CYCLE_WALK_LIMIT
    promise_scheduler.CYCLE_WALK_LIMIT = 1_000
    try:
        with caplog.at_level("WARNING", logger="dask_coro"):
            assert plugin._path_to("p", [big_end.key], pending=False) is None
        assert "not checked for a dependency cycle" in caplog.text
    finally:
        promise_scheduler.CYCLE_WALK_LIMIT = old
    # A granted rewiring in flight is an edge of the check's walk only.
    plugin.pending["q"] = (None, "p")
    tasks["q"] = _TS("q", "no-worker")
    assert plugin._path_to("p", ["q"], pending=True) == ["q", "p"]
    assert plugin._path_to("p", ["q"], pending=False) is None


@gen_cluster(**validated)
async def test_promise_whose_creator_finished_before_it_arrived_is_an_error(c, s, a, b):
    """The creating task's completion travels on its worker's stream, the
    promise's graph on the worker client's: the completion may come first.
    The promise then fails at once instead of waiting for ever."""
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    from dask_coro._internals.dask_private import Task
    from dask_coro.promise.parked import PARK_RESOURCE, unresolved

    await asyncio_to(Promise)  # installs the plugin
    creator = c.submit(lambda: 1, key="finished-creator")
    assert await creator == 1
    key = "promise-late"
    layer = MaterializedLayer(
        {key: Task(key, unresolved, key, creator.key)},
        annotations={"resources": {PARK_RESOURCE: 1}},
    )
    (late,) = c.get(HighLevelGraph({key: layer}, {key: set()}), [key], sync=False)
    with pytest.raises(PromiseError, match="never resolved: the task 'finished-creator'"):
        await late


@coroutine
def _submits_a_child():
    return (yield _one_task())


@coroutine(inline=False)
def _one_task():
    return 1


@coroutine
def _returns_an_unresolved_promise():
    return [Promise()]


@cluster(nthreads=[("", 1)], config={"coro.client-batch-interval": "500ms"})
async def test_a_promise_made_in_a_task_is_on_the_scheduler_before_the_task_ends(c, s, a):
    """A task's completion travels on its worker's connection, a promise it
    made on the worker client's batched stream: the client that gets the
    result could compute the promise before the scheduler heard of it, and
    be told of lost data. Made in a task, ``Promise()`` waits until the
    scheduler has it. (The worker's client batches over 500 ms here, set by
    the first coroutine that submits a child, so the race is won every time
    without the wait.)"""
    assert await c.compute(_submits_a_child()) == 1
    creator = c.compute(_returns_an_unresolved_promise())
    (p,) = await creator
    with pytest.raises(PromiseError, match="never resolved"):
        await c.compute(p)
