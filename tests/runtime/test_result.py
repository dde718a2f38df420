"""``dask_coro.result(x)`` on a cluster: waiting from plain code at any call
depth, holding no thread; thread affinity of parked greenlets; cancellation;
outside a coroutine (ordinary tasks, the client, the event loop).

gen_cluster workers run in the test's process, so bodies record into module
state here; the LocalCluster tests count OS threads of worker processes.
"""

from __future__ import annotations

import threading
import time
import traceback
import weakref

import dask
import pytest
from bodies import boom, cleared
from distributed import Client, Future, LocalCluster, Worker, get_client, get_worker, worker_client
from distributed.utils_test import async_poll_for, gen_cluster
from helpers import Busy, cluster, recorder, waits_behind_a_gate

from dask_coro import BadYieldError, DaskCoroError, coroutine, current_key, result
from dask_coro.runtime.lanes import LANES_PER_THREAD

# Coroutine calls with plain arguments run inline (the shipped default); the
# waiters that must be tasks say so (@coroutine(inline=False)).
# Each test runs on both engines, compiled and pure (conftest.engine).
pytestmark = [pytest.mark.inline, pytest.mark.usefixtures("engine")]

# --------------------------------------------------------------------------
# module state (in-process workers)

LOG: list = []
_busy = Busy()  # user code holding a thread, counted per worker


_clear = cleared(LOG, _busy)



# --------------------------------------------------------------------------
# bodies


@coroutine
def load(p):
    return p * 10


@coroutine(inline=False)
def load_task(p):
    return p * 10


def load_all(paths, task=False):  # a plain helper: no yield, no async
    return result([(load_task if task else load)(p) for p in paths])


def score(paths, task=False):  # two plain frames deep
    return sum(load_all(paths, task)) / len(paths)


@coroutine
def pipeline(groups, task=False):  # a plain @coroutine function
    return [score(g, task) for g in groups]


@coroutine
def mixed(n):
    a = yield load(n)
    b = score([1, 2], task=True)
    c = yield [load(1), load_task(2)]
    return a, b, c, current_key()


@coroutine
async def async_pipeline(groups):
    first = await load(0)
    return first, [score(g, task=True) for g in groups]


@cluster(nthreads=[("", 1)])
async def test_result_in_plain_helpers_inline_and_as_tasks(c, s, a):
    r = recorder(s)
    assert await c.compute(pipeline([[1, 2], [3]])) == [15.0, 30.0]
    assert not r.ran("load")  # plain arguments: run inline
    assert await c.compute(pipeline([[1, 2], [3]], task=True)) == [15.0, 30.0]
    assert len(r.ran("load_task")) == 3
    # One result() call, one batch: both children of [1, 2] in one graph.
    graphs = [g for g in r.graphs if any(str(k).startswith("load_task-") for k in g)]
    assert sorted(len(g) for g in graphs) == [1, 2]


@cluster(nthreads=[("", 1)])
async def test_result_and_yield_mixed_in_one_body(c, s, a):
    out = await c.compute(mixed(3, dask_key_name="mixed-root"))
    assert out == (30, 15.0, [10, 20], "mixed-root")


@cluster(nthreads=[("", 1)])
async def test_async_def_body_waits_from_helpers(c, s, a):
    assert await c.compute(async_pipeline([[1], [2, 4]])) == (0, [10.0, 30.0])


@coroutine(inline=False)
def boom_task(x):
    raise KeyError(f"task {x}")  # TASK-BOOM-LINE


def _catch_child_error(child):
    try:
        result([load(1), child])
    except (ValueError, KeyError) as e:
        return type(e).__name__, str(e), "".join(traceback.format_exception(e))


@coroutine
def catches_at_result(which):
    return _catch_child_error(boom(3) if which == "inline" else boom_task(3))


@coroutine
def does_not_catch_at_result():
    return score([1], task=False) + result(boom(4))


@cluster(nthreads=[("", 1)])
async def test_child_error_raised_at_result_with_type_and_traceback(c, s, a):
    name, msg, tb = await c.compute(catches_at_result("inline"))
    assert (name, msg) == ("ValueError", "boom 3")
    assert "in _catch_child_error" in tb and "BOOM-LINE" in tb  # the child's own line
    name, msg, tb = await c.compute(catches_at_result("task"))
    assert (name, msg) == ("KeyError", "'task 3'")
    assert "in _catch_child_error" in tb and "TASK-BOOM-LINE" in tb  # the remote traceback
    with pytest.raises(ValueError, match=r"^boom 4$"):
        await c.compute(does_not_catch_at_result())


@coroutine
def bad_result():
    return load_all_bad()


def load_all_bad():
    return result([load(1), {"k": {1, 2}}])


@cluster(nthreads=[("", 1)])
async def test_bad_input_names_the_object_and_its_position(c, s, a):
    with pytest.raises(BadYieldError, match=r"\{1, 2\} at position \[1\]\['k'\]"):
        await c.compute(bad_result())
    with pytest.raises(BadYieldError, match=r"coroutine 'result' yielded \{3\}"):
        result({3})


# --------------------------------------------------------------------------
# parked bodies hold no thread; every resume on its own thread


@coroutine(inline=False)
def parked_waiter(gate_key, busy):
    return _park_and_check(gate_key, busy)


def _park_and_check(gate_key, busy):
    _busy(busy)
    before = threading.current_thread().name, threading.get_ident()
    value = _wait_on_gate(gate_key)
    after = threading.current_thread().name, threading.get_ident()
    _busy(busy)
    return before, after, value


def _wait_on_gate(gate_key):
    # The gate travels by key: as an argument it would be a dependency, and
    # the waiters would not start before it is done.
    return result(Future(gate_key, get_client()))


@coroutine
def hold(n, gate_key, busy):
    return (yield [parked_waiter(gate_key, busy) for _ in range(n)])


def _plain_busy(seconds):
    _busy(seconds)
    return seconds


@pytest.mark.parametrize("nthreads, n", [(1, 50), pytest.param(4, 500, marks=pytest.mark.slow)])
@cluster(nthreads=[], timeout=120)
async def test_parked_bodies_resume_on_their_own_thread(c, s, nthreads, n):
    """Every resume of a parked greenlet lands on the thread that parked it,
    and never more than nthreads bodies (and plain tasks) run at once."""
    async with Worker(s.address, nthreads=nthreads) as a:
        gate = c.submit(lambda: 7, resources={"GATE": 1}, pure=False)
        root = c.compute(hold(n, gate.key, 0.002))
        # Plain tasks compete for the same threads while bodies step.
        plain = c.map(_plain_busy, [0.02] * 20, pure=False)
        await async_poll_for(
            lambda: sum(ts.state == "long-running" for ts in a.state.tasks.values()) >= n + 1,
            timeout=90,
        )
        lanes = [t for t in threading.enumerate() if t.name.startswith("dask-coro-lane")]
        assert 1 <= len(lanes) <= nthreads * LANES_PER_THREAD
        async with Worker(s.address, nthreads=1, resources={"GATE": 1}):
            out = await root
        assert await c.gather(plain) == [0.02] * 20
    assert len(out) == n
    for before, after, value in out:
        assert value == 7
        assert before == after
        assert before[0].startswith("dask-coro-lane")
    if nthreads > 1:
        assert len({b for b, _, _ in out}) > 1  # the lanes share the work
    assert 0 < _busy.most(a.address) <= nthreads, _busy.active



@pytest.mark.slow
def test_2000_bodies_parked_two_frames_deep_hold_no_threads(tmp_path):
    out = waits_behind_a_gate(tmp_path, lambda gate: hold(2000, gate, 0), 2000, timeout=120)
    assert len(out) == 2000
    assert all(before == after and value == 1 for before, after, value in out)


@pytest.mark.timeout(120)
def test_work_is_stolen_from_plain_helpers():
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as lc, Client(lc) as client:
        workers = set(client.nthreads())
        where = client.compute(where_tree(6)).result(timeout=90)
        assert len(where) == 64
        assert set(where) == workers  # the idle worker took subtrees


@coroutine
def where_tree(depth):
    if depth == 0:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.02:
            pass
        return [get_worker().address]
    return _both(depth)


def _both(depth):
    a, b = result([where_tree(depth - 1), where_tree(depth - 1)])
    return a + b


# --------------------------------------------------------------------------
# cancellation: parked bodies unwind innermost first


@coroutine
def guarded(gate_key):
    try:
        return _outer(gate_key)
    finally:
        LOG.append("body")


def _outer(gate_key):
    try:
        return _inner(gate_key)
    finally:
        LOG.append("outer")


def _inner(gate_key):
    try:
        return _wait_on_gate(gate_key)
    except BaseException as e:
        LOG.append(type(e).__name__)
        raise
    finally:
        LOG.append("inner")


@cluster(nthreads=[("", 1)])
async def test_cancel_unwinds_parked_helpers_innermost_first(c, s, a):
    gate = c.submit(lambda: 1, resources={"GATE": 1}, pure=False)
    fut = c.compute(guarded(gate.key))
    await async_poll_for(lambda: a.state.tasks.get(fut.key) is not None
                         and a.state.tasks[fut.key].state == "long-running", timeout=30)
    await c.cancel(fut)
    await async_poll_for(lambda: "body" in LOG, timeout=30)
    assert LOG == ["GreenletExit", "inner", "outer", "body"]
    await async_poll_for(lambda: fut.key not in a.state.tasks, timeout=30)


# --------------------------------------------------------------------------
# compute-once and current_key inside helpers


def _count(tag):
    LOG.append(tag)
    return tag


@coroutine
def counted(tag):
    return _count(tag)


def _key_and_twice():
    x = counted("once")
    a = result(x)
    b = result([x, x])
    return current_key(), a, b


@coroutine
def key_in_helper():
    return _key_and_twice()


@cluster(nthreads=[("", 1)])
async def test_compute_once_and_current_key_in_helpers(c, s, a):
    out = await c.compute(key_in_helper(dask_key_name="kh"))
    assert out == ("kh", "once", ["once", "once"])
    assert LOG == ["once"]


class Blob:
    """A value whose life a weak reference shows."""

    def __init__(self, x):
        self.x = x


def make_blob(x):
    return Blob(x)


def _wait_for_a_future(x):  # a plain helper: the Future is its own
    value = result(get_client().submit(make_blob, x, pure=False))
    LOG.append(weakref.ref(value))
    return value.x


@coroutine
def future_inline(x):
    return _wait_for_a_future(x)


@coroutine(inline=False)
def future_task(x):
    return _wait_for_a_future(x)


@coroutine
def future_yielded(x):
    return (yield [future_task(x), future_inline(x + 1)])


def future_worker_client(x):  # the same program in plain distributed
    with worker_client() as client:
        value = client.submit(make_blob, x, pure=False).result()
        LOG.append(weakref.ref(value))
        return value.x


@cluster(nthreads=[("", 1)])
async def test_a_body_waited_on_lets_go_of_its_futures_and_values(c, s, a):
    """A body that waited in ``result()`` keeps nothing alive once it ended: not
    the Futures it waited on (their keys leave the scheduler, as after a
    ``worker_client`` task) nor the values it was resumed with. Idle greenlets
    of the worker's pool once kept the last values handed through them."""
    assert await c.submit(future_worker_client, 1) == 1
    await async_poll_for(lambda: not s.tasks, timeout=5)
    for call, want in ((future_inline(1), 1), (future_task(1), 1), (future_yielded(1), [1, 2])):
        assert await c.compute(call) == want
        await async_poll_for(lambda: not s.tasks, timeout=5)
    assert len(LOG) == 1 + 1 + 1 + 2
    await async_poll_for(lambda: all(ref() is None for ref in LOG), timeout=5)


# --------------------------------------------------------------------------
# outside a coroutine


def plain_task_waits(parent_key):
    return result([seceded_while_waiting(parent_key), load(3)])


@coroutine(inline=False)
def seceded_while_waiting(parent_key):
    return get_worker().state.tasks[parent_key].state


@cluster(nthreads=[("", 1)])
async def test_ordinary_task_secedes_as_worker_client_does(c, s, a):
    """A thread is held (the task's own), but not the worker slot: on a
    1-thread worker the child still runs."""
    fut = c.submit(plain_task_waits, "plain-waits", key="plain-waits")
    assert await fut == ["long-running", 30]
    lazy = dask.delayed(plain_task_waits)("delayed-waits", dask_key_name="delayed-waits")
    assert await c.compute(lazy) == ["long-running", 30]


def test_result_in_the_client_process():
    with dask.config.set(scheduler="sync"):
        assert result([load(1), dask.delayed(sum)([1, 2])]) == [10, 3]
        assert result({"a": (load(2),), "b": 5}) == {"a": (20,), "b": 5}
        with pytest.raises(ValueError, match=r"^boom 5$"):
            result(boom(5))


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_result_with_a_default_client_uses_it(c, s, a):
    r = recorder(s)

    def in_thread():
        return result([load_task(4), load(5)])

    import asyncio

    assert await asyncio.to_thread(in_thread) == [40, 50]
    assert r.ran("result") and r.ran("load_task")


async def _async_task():
    try:
        result(load(1))
    except DaskCoroError as e:
        return str(e)


@cluster(nthreads=[("", 1)])
async def test_result_on_the_event_loop_raises(c, s, a):
    with pytest.raises(DaskCoroError, match="running event loop"):
        result(load(1))
    assert "would block the loop" in await c.submit(_async_task)
