"""The runner on real clusters: gen_cluster, LocalCluster with processes, and
`dask scheduler` / `dask worker` processes."""

from __future__ import annotations

import os
import signal
import time

import dask
import pytest
from bodies import yields_one_by_one
from distributed import Client, LocalCluster, SchedulerPlugin
from distributed.utils_test import async_poll_for, gen_cluster
from helpers import (
    cli_cluster,
    dask_cli,
    free_port,
    recorder,
    start_worker,
    waits_behind_a_gate,
    workers_now,
)
from workloads import afib, fib, inc, process_all, process_all_checked, sequential_fib

import dask_coro
from dask_coro import coroutine, current_key
from dask_coro.core.plan import derive_key


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_recursion_deeper_than_threads_on_one_thread(c, s, a):
    # 753 coroutine tasks nested 13 deep on one worker with one thread.
    assert await c.compute(fib(13)) == 233
    assert await c.compute(afib(11)) == 89


@gen_cluster(client=True, nthreads=[("", 1), ("", 1)])
async def test_process_all_reuses_the_list(c, s, a, b):
    r = recorder(s)
    for _ in range(5):
        total, data = await c.compute(process_all_checked())
        assert total == sum(x + 1 for x in data)
    # each call of generate_data is a task of its own (not pure): one run per
    # process_all, never recomputed
    assert len(r.ran("generate_data")) == 5
    assert await c.compute(process_all()) == 55  # as the README's prints


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_one_message_per_yield(c, s, a):
    @coroutine
    def fan(n, rounds):
        total = 0
        for _ in range(rounds):
            total += sum((yield [inc(i) for i in range(n)]))
        return total

    r = recorder(s)
    assert await c.compute(fan(50, 3)) == 3 * sum(range(1, 51))
    # One update-graph from the client, then one per yield with all 50 children.
    assert len(r.graphs) == 4
    assert [len(g) for g in r.graphs[1:]] == [50, 50, 50]


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_children_keys_are_derived_and_prioritised(c, s, a):
    r = recorder(s)

    @coroutine
    def parent():
        values = yield [inc(1), {"x": inc(2)}]
        return values

    root = parent(dask_key_name="root")
    assert await c.compute(root) == [2, {"x": 3}]
    expected = {derive_key("inc", "root", 0, (0,)), derive_key("inc", "root", 0, (1, "x"))}
    assert {k[:-17] for k in r.graphs[1]} == expected

    # Children rank ahead of unrelated work, as worker_client children do:
    # Scheduler._set_priorities gives a graph with a submitting task an earlier
    # generation than any graph a client submits.
    seen = {}

    class Prio(SchedulerPlugin):
        def transition(self, key, start, finish, *args, **kwargs):
            ts = s.tasks.get(key)
            if ts is not None and ts.priority is not None:
                seen[key] = ts.priority

    s.add_plugin(Prio())
    assert await c.compute(parent(dask_key_name="root2")) == [2, {"x": 3}]
    (child,) = [k for k in seen if str(k).startswith(derive_key("inc", "root2", 0, (0,)))]
    unrelated = c.submit(inc.__wrapped__, 1, key="unrelated")
    await unrelated
    assert seen[child][1] < seen["root2"][1] <= seen["unrelated"][1]


@gen_cluster(
    client=True, nthreads=[("", 1)], config={"coro.durability.hold-children": False}
)
async def test_results_released_after_resume(c, s, a):
    r = recorder(s)
    assert await c.compute(yields_one_by_one(inc, 300)) == sum(range(1, 301))
    # Root plus at most a couple of children alive at any time, not 300.
    assert r.max_tasks <= 5, r.max_tasks
    # Released asynchronously after the run: the worker drops them soon after.
    await async_poll_for(
        lambda: not any(str(k).startswith("inc-") for k in a.data), timeout=10
    )


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_results_held_for_the_parent_until_it_ends(c, s, a):
    """By default (coro.durability.hold-children) every child stays held for
    its coroutine, so a re-run finds them; all go when the coroutine ends."""
    r = recorder(s)
    assert await c.compute(yields_one_by_one(inc, 200)) == sum(range(1, 201))
    assert r.max_tasks >= 200
    await async_poll_for(lambda: not s.tasks, timeout=10)
    assert not [cid for cid in s.clients if str(cid).startswith("dask-coro-held-")]


# A yield's collections are computed together: a bag (a graph) with a
# dataframe and an array (expressions) warns as client.compute of the same
# three does ("Computing mixed collections ...", dask/_expr.py).
@pytest.mark.filterwarnings("ignore:Computing mixed collections:UserWarning")
@gen_cluster(client=True, nthreads=[("", 1)])
async def test_yield_everything_a_user_may(c, s, a):
    da = pytest.importorskip("dask.array")
    db = pytest.importorskip("dask.bag")
    dd = pytest.importorskip("dask.dataframe")
    pd = pytest.importorskip("pandas")
    future = c.submit(lambda: 40, key="forty")
    frame = dd.from_pandas(pd.DataFrame({"a": [1, 2, 3, 4]}), npartitions=2)

    @coroutine
    def many(fut):
        out = yield {
            "frame": frame.a.sum(),
            "array": da.ones(10, chunks=5).sum(),
            "bag": db.from_sequence([1, 2, 3], npartitions=2).map(lambda v: v * 2),
            "future": fut,
            "delayed": dask.delayed(sum)([1, 2]),
            "plain": ("a", 1, None),
            "nested": [inc(1), (inc(2), {"deep": inc(3)})],
        }
        return out

    out = await c.compute(many(future))
    assert out == {
        "frame": 10,
        "array": 10.0,
        "bag": [2, 4, 6],
        "future": 40,
        "delayed": 3,
        "plain": ("a", 1, None),
        "nested": [2, (3, {"deep": 4})],
    }


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_lazy_object_interfaces_on_cluster(c, s, a):
    @coroutine
    def pair(x):
        return (x, x + 1)

    p = pair(1)
    assert await c.compute(p[1] * 10) == 20
    assert await c.compute(dask.delayed(sum)(p)) == 3
    (fut,) = c.persist([p])
    assert await c.compute(fut) == (1, 2)


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_current_key_everywhere(c, s, a):
    @coroutine
    def gen_key():
        child = yield async_key()
        return current_key(), child

    @coroutine
    async def async_key():
        return current_key()

    def plain():
        return current_key()

    root = gen_key(dask_key_name="the-root")
    me, child = await c.compute(root)
    assert me == "the-root"
    assert child.startswith(derive_key("async_key", "the-root", 0, ()) + "-")
    assert await c.submit(plain, key="plain-key") == "plain-key"

    async def plain_async():
        return current_key()

    assert await c.submit(plain_async, key="async-key") == "async-key"



@coroutine
def waiter(gate_key):
    from distributed import Future, get_client

    # The gate travels by key: a Future passed as an argument would be a
    # dependency, and the coroutines would not start before it is done.
    value = yield Future(gate_key, get_client())
    return value


@coroutine
def hold(n, gate_key):
    values = yield [waiter(gate_key) for _ in range(n)]
    return sum(values)


def test_2000_suspended_coroutines_hold_no_threads(tmp_path):
    assert waits_behind_a_gate(tmp_path, lambda gate: hold(2000, gate), 2000, timeout=90) == 2000


def test_local_cluster_with_processes():
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        assert fib(12).compute() == sequential_fib(12)
        # With a client active, coroutines run on the cluster's workers.
        where = coroutine(lambda: __import__("distributed").get_worker().address)()
        assert where.compute() in client.nthreads()
        total, data = process_all_checked().compute()
        assert total == sum(x + 1 for x in data)
        (n,) = dask.compute(afib(10))
        assert n == 55


def test_dask_scheduler_and_worker_processes(tmp_path):
    with cli_cluster(tmp_path, 2) as client:
        assert client.compute(fib(12)).result(timeout=60) == 144
        assert len(workers_now(client)) == 2


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_sync_compute_inside_an_async_task_is_a_clear_error(c, s, a):
    # A synchronous scheduler run on the worker's event loop would otherwise
    # get back an unawaited coroutine as the "result".
    async def inside():
        return fib(3).compute(scheduler="sync")

    with pytest.raises(dask_coro.DaskCoroError, match="not a task executing there"):
        await c.submit(inside)


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_yield_a_persisted_delayed(c, s, a):
    # A persisted Delayed's graph is {key: Future(key)}: it is read back like
    # a Future, not renamed into a task that would lose its data.
    (persisted,) = c.persist([dask.delayed(sum)([1, 2, 3])])

    @coroutine
    def uses():
        return (yield persisted) * 2  # from the closure: not an argument

    assert await c.compute(uses()) == 12


@pytest.mark.timeout(90)
def test_worker_whose_scheduler_is_killed_closes_at_once(tmp_path):
    """A preloaded worker that loses its scheduler does not wait out
    coro.lifetimes.leave-timeout (far above this test's timeout here) asking
    a scheduler that is gone for its releases."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env_before = os.environ.get("DASK_CORO__LIFETIMES__LEAVE_TIMEOUT")
    os.environ["DASK_CORO__LIFETIMES__LEAVE_TIMEOUT"] = "600s"
    try:
        sched = dask_cli("scheduler", "--host", "127.0.0.1", "--port", str(port),
                         "--dashboard-address", ":0", "--preload", "dask_coro",
                         log=tmp_path / "s.log")
        worker = start_worker(address, tmp_path, "--no-nanny", "--preload", "dask_coro")
    finally:
        if env_before is None:
            del os.environ["DASK_CORO__LIFETIMES__LEAVE_TIMEOUT"]
        else:
            os.environ["DASK_CORO__LIFETIMES__LEAVE_TIMEOUT"] = env_before
    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            assert client.compute(fib(10)).result(timeout=60) == 55
            sched.send_signal(signal.SIGKILL)
            sched.wait(timeout=30)
            start = time.monotonic()
            worker.wait(timeout=60)
            took = time.monotonic() - start
        assert took < 15, took  # without the fix: the 30 s connect timeout
        assert "could not ask for releases" not in (tmp_path / "w0.log").read_text()
    finally:
        for p in (worker, sched):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
