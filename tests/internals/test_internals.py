"""Each assumption the seam (``dask_coro/_internals``) makes about distributed's
and dask's private API, pinned against the installed versions: a release that
changes one fails the test named after it, not a hang somewhere else."""

from __future__ import annotations

import asyncio
import operator
import threading

import dask
import pytest
from dask.delayed import Delayed
from dask.local import get_sync
from distributed import Event, get_worker
from distributed.utils_test import gen_cluster, gen_test, inc

from dask_coro._internals import dask_private as dp
from dask_coro._internals.distributed import client as client_seam
from dask_coro._internals.distributed.client import (
    annotated_graph,
    collections_message,
    flush_client_stream,
    future_in_memory,
    get_in_order,
    keeping_on_reconnect,
    send_on_client_stream,
    send_serialized,
    serialized_graph,
    set_batch_interval,
    submission_expr,
    submission_keys,
    submitting_as,
    watch_submissions,
)
from dask_coro._internals.distributed.collections import drop_stale_queue_entries, queue_entries
from dask_coro._internals.distributed.core import add_handlers, wrap_stream_handler
from dask_coro._internals.distributed.dashboard import (
    add_dashboard_page,
    add_http_routes,
    dashboard_prefix,
    render_dashboard_page,
)
from dask_coro._internals.distributed.scheduler import (
    adjust_suspicion,
    alias_task,
    count_resources,
    drop_client_state,
    fail_task,
    forget_if_unused,
    idle_threads,
    processing_task,
    send_to_worker,
    store_worker_plugin,
    used_resources,
)
from dask_coro._internals.distributed.threadpoolexecutor import PoolSeat, set_task_thread
from dask_coro._internals.distributed.worker import (
    add_worker_plugin_now,
    as_worker,
    default_executor,
    fast_memory_value,
    send_on_worker_stream,
    store_own_data,
    thread_task_key,
    worker_is_closing,
    worker_plugin,
)
from dask_coro._internals.distributed.worker_state_machine import (
    async_tasks_executing,
    available_resources,
    lend_resources,
    secede_from_loop,
    take_resources,
    task_resources,
    task_run_id_priority,
    total_resources,
    worker_knows,
    worker_task_annotations,
    worker_task_error,
    worker_task_priority,
    worker_task_state,
)

# -- dask (_internals/dask_private.py) -------------------------------------------------

def test_annotations_in_effect_is_what_dask_annotate_sets():
    assert not dp.annotations_in_effect.get()
    with dask.annotate(retries=2):
        assert dp.annotations_in_effect.get()["retries"] == 2
    assert not dp.annotations_in_effect.get()


def test_delayed_slots_are_member_descriptors_and_underscore_names_are_not_lazy():
    d = dask.delayed(max)(1, 2)
    for name in ("_key", "_dask", "_length"):
        assert type(dp.delayed_slot(name)).__name__ == "member_descriptor", name
    assert dp.delayed_slot("_key").__get__(d) == d.key
    assert dp.delayed_slot("_dask").__get__(d) is d.dask
    # CoroutineCall's own slots start with underscores: Delayed's lazy
    # attribute access must never answer them.
    with pytest.raises(AttributeError):
        d._no_such_slot
    assert isinstance(d.anything, Delayed)


def test_task_spec_nodes_rename_and_report_dependencies():
    t = dp.Task("b", max, dp.TaskRef("a"), 1)
    assert t.dependencies == {"a"}
    t2 = t.substitute({"a": "a2"}, key="b2")
    assert t2.key == "b2" and t2.dependencies == {"a2"}
    assert dp.Alias("c", "b").dependencies == {"b"}
    assert get_sync({"a": dp.DataNode("a", 5), "b": t}, "b") == 5
    legacy = dp.convert_legacy_task("x", (max, "a", 2), {"a"})
    assert isinstance(legacy, dp.GraphNode) and legacy.dependencies == {"a"}


def test_parse_input_makes_containers_of_references_nodes():
    # lifetimes.passed: an Alias in an argument's list or dict is a dependency
    # of the task rebuilt over it, evaluated when it runs.
    args = dp.parse_input([dp.Alias("a"), 1]), dp.parse_input({"x": dp.Alias("b")})
    assert all(isinstance(a, dp.GraphNode) for a in args)
    assert dp.parse_input([1, 2]) == [1, 2]  # nothing to refer to: left as it is
    t = dp.Task("t", lambda xs, d: sum(xs) + d["x"], *args)
    assert t.dependencies == {"a", "b"}
    assert get_sync({"a": dp.DataNode("a", 5), "b": dp.DataNode("b", 7), "t": t}, "t") == 13


def test_finalized_graph_computes_a_collection():
    da = pytest.importorskip("dask.array")
    x = da.ones((4, 4), chunks=2).sum()
    key, graph = dp.finalized_graph(x, optimize=True)
    assert get_sync(graph, key) == 16
    key, graph = dp.finalized_graph(x, optimize=False)
    assert get_sync(graph, key) == 16


def test_finalized_gives_the_annotations_the_scheduler_reads():
    da = pytest.importorskip("dask.array")
    with dask.annotate(retries=3):
        x = da.ones(4, chunks=2) + 1
    key, graph, by_type = dp.finalized(x, optimize=False)
    assert get_sync(graph, key).tolist() == [2.0] * 4
    assert by_type["retries"] and set(by_type["retries"].values()) == {3}
    assert set(by_type["retries"]) <= set(graph)


def test_finalized_together_is_client_computes_expression_and_keys():
    # One expression for several collections, a key per collection in order,
    # shared tasks once (distributed.Client.compute).
    da = pytest.importorskip("dask.array")
    x = da.arange(8, chunks=2)
    expr, keys = dp.finalized_together([x.sum(), x.mean()])
    assert len(keys) == 2
    graph = dp.expression_graph(expr)
    assert get_sync(graph, keys) == (28, 3.5)
    assert sum(1 for k in graph if isinstance(k, tuple) and k[0].startswith("arange")) <= 4


@pytest.mark.filterwarnings("ignore:Computing mixed collections:UserWarning")
def test_finalized_together_keeps_a_dataframe_before_an_array():
    # A collection backed by an expression (a dataframe) before one backed by
    # a graph (an array, a bag): dask 2025.9.x dropped the first
    # from the expression (dask/dask#12081); every collection keeps its key,
    # in the order given, and each computes to its own value.
    da = pytest.importorskip("dask.array")
    db = pytest.importorskip("dask.bag")
    dd = pytest.importorskip("dask.dataframe")
    pd = pytest.importorskip("pandas")
    frame = dd.from_pandas(pd.DataFrame({"a": range(10)}), npartitions=2)
    colls = [frame.a.sum(), da.ones(10, chunks=5).sum(), db.from_sequence([1, 2, 3], npartitions=2).map(lambda v: v * 2)]
    expr, keys = dp.finalized_together(colls)
    assert len(keys) == 3
    graph = dp.expression_graph(expr)
    got = get_sync(graph, keys)
    assert (got[0], got[1], list(got[2])) == (45, 10.0, [2, 4, 6])


def test_holds_any_finds_a_delayeds_task_in_a_collection_without_building_it():
    da = pytest.importorskip("dask.array")
    dd = pytest.importorskip("dask.dataframe")
    pd = pytest.importorskip("pandas")
    L = dask.delayed(lambda: [1, 2, 3])()
    arr = da.from_delayed(L, shape=(3,), dtype=int) + 1
    assert dp.holds_any(arr.sum(), {L.key})
    assert not dp.holds_any(arr.sum(), {"other-key"})
    assert not dp.holds_any(arr, set())
    frame = dd.from_delayed([dask.delayed(pd.DataFrame)({"a": [1]})], meta={"a": "i8"})
    inner = [k for k in frame.__dask_graph__() if not isinstance(k, tuple)]
    assert inner and dp.holds_any(frame.a.sum(), set(inner))
    mapped = frame.map_partitions(lambda df, v: df + v, L[0], meta=frame._meta)
    assert dp.holds_any(mapped, {L.key})
    assert not dp.holds_any(dd.from_pandas(pd.DataFrame({"a": [1]}), npartitions=1), {L.key})


def test_expression_holds_any_finds_a_delayeds_task_in_what_client_compute_sends():
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr

    d = dask.delayed(inc)(1, dask_key_name="mine")
    for colls in ([d], [dask.delayed(sum)([d, 2])]):
        expr = FinalizeCompute(collections_to_expr(colls)).optimize()  # as Client.compute makes it
        assert dp.expression_holds_any(expr, {"mine"})
        assert not dp.expression_holds_any(expr, {"other"})
    assert not dp.expression_holds_any(b"serialized", {"mine"})


def test_task_is_coro_honours_the_tornado_flag():
    # CoroutineTask marks itself with __tornado_coroutine__ so a worker runs it
    # on its event loop (Task.is_coro -> distributed.utils.iscoroutinefunction).
    from dask_coro.runtime.call import CoroutineTask

    task = dp.Task("k", CoroutineTask(max, "k"), 1)
    assert task.is_coro


# -- distributed.worker (_internals/distributed/worker.py) -----------------------------

@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_plugin_added_now_sees_every_transition(c, s, a):
    seen = []

    class Watch:
        def transition(self, key, start, finish, **kwargs):
            seen.append((key, finish))

    plugin = add_worker_plugin_now(a, "test-watch", Watch)
    assert add_worker_plugin_now(a, "test-watch", Watch) is plugin
    assert worker_plugin(a, "test-watch") is plugin
    await c.submit(lambda: 1, key="watched")
    assert ("watched", "memory") in seen


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_default_executor_runs_tasks_and_fast_memory_holds_results(c, s, a):
    assert default_executor(a) is a.executors["default"]

    def where():
        return threading.current_thread().name

    name = await c.submit(where, key="where")
    assert "Dask-Default-Threads" in name
    assert fast_memory_value(a, "where") == name


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_as_worker_makes_get_worker_answer(c, s, a):
    with pytest.raises(ValueError):
        get_worker()
    with as_worker(a):
        assert get_worker() is a
    with pytest.raises(ValueError):
        get_worker()
    assert not worker_is_closing(a)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_worker_stream_messages_reach_a_scheduler_stream_handler(c, s, a):
    got = asyncio.Event()
    messages = []

    def handler(worker=None, **msg):
        messages.append((worker, msg))
        got.set()

    add_handlers(s, stream={"test-worker-op": handler})
    send_on_worker_stream(a, {"op": "test-worker-op", "x": 1})
    await asyncio.wait_for(got.wait(), 10)
    assert messages == [(a.address, {"x": 1})]


# -- distributed.worker_state_machine (_internals/distributed/worker_state_machine.py) ---

@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_worker_task_state_and_thread_key(c, s, a):
    def sync_task():
        w = get_worker()
        return thread_task_key(), worker_task_state(w, thread_task_key())

    key, state = await c.submit(sync_task, key="sync-task")
    assert key == "sync-task" and state == "executing"
    assert worker_task_state(a, "no-such-key") is None
    assert worker_knows(a, "sync-task")
    assert thread_task_key() is None  # not inside a task here


def _fails():
    raise ZeroDivisionError("no")


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_workers_erred_task_keeps_its_error_pickled(c, s, a):
    """``WorkerTaskState.exception`` is a ``Serialize`` of the bytes the
    worker pickled the error to (``distributed.core.error_message``)."""
    f = c.submit(_fails, key="fails")
    with pytest.raises(ZeroDivisionError):
        await f
    error = worker_task_error(a, "fails")
    assert isinstance(error, ZeroDivisionError) and error.args == ("no",)
    assert worker_task_error(a, "no-such-key") is None
    g = c.submit(inc, 1, key="fine")
    await g
    assert worker_task_error(a, "fine") is None


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_worker_task_priority_and_annotations_are_the_schedulers(c, s, a):
    def seen():
        w = get_worker()
        key = thread_task_key()
        return worker_task_priority(w, key), worker_task_annotations(w, key)

    with dask.annotate(team="red"):
        f = c.compute(dask.delayed(seen)(dask_key_name="seen"))
    priority, annotations = await f
    assert priority == s.tasks["seen"].priority  # the worker's own generation left off
    assert annotations["team"] == "red"
    assert worker_task_priority(a, "no-such-key") == ()
    assert worker_task_annotations(a, "no-such-key") == {}


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_async_tasks_executing_lists_the_async_task(c, s, a):
    async def async_task():
        return async_tasks_executing(get_worker())

    assert await c.submit(async_task, key="async-task") == ["async-task"]


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_secede_from_loop_frees_the_slot_on_worker_and_scheduler(c, s, a):
    ev = Event()

    async def waits():
        secede_from_loop(get_worker(), "waits", 0.0)
        await ev.wait()
        return 1

    fut = c.submit(waits, key="waits")
    while not s.tasks.get("waits") or s.tasks["waits"] not in s.workers[a.address].long_running:
        await asyncio.sleep(0.01)
    assert a.state.tasks["waits"].state == "long-running"
    # The slot is free: another task runs while it waits.
    assert await c.submit(lambda: 2, key="other") == 2
    await ev.set()
    assert await fut == 1


# -- distributed.threadpoolexecutor (_internals/distributed/threadpoolexecutor.py) -----

def test_a_pool_seat_is_what_secede_and_rejoin_use():
    """threadpoolexecutor.secede removes the thread from the executor's
    _threads (a KeyError when it is not there) and calls _adjust_thread_count;
    rejoin appends (thread, event) to _rejoin_list, submits, and waits for the
    event; worker_client and Client.get read thread_state.key and start_time
    from distributed.utils.thread_state."""
    import importlib

    from distributed import threadpoolexecutor as tpe
    from distributed import utils, worker

    worker_client = importlib.import_module("distributed.worker_client")

    calls = []
    out = {}

    def leave():
        if calls and calls[-1] == "leave":
            raise KeyError("seceded already")
        calls.append("leave")

    def join(event):
        calls.append("join")
        event.set()

    def run():
        set_task_thread("k", 12.0, PoolSeat(leave, join))
        try:
            out["key"], out["start"] = worker.thread_state.key, worker.thread_state.start_time
            tpe.secede()
            with pytest.raises(KeyError):
                tpe.secede()
            tpe.rejoin()
        finally:
            set_task_thread(None)
        out["after"] = getattr(utils.thread_state, "key", None)
        out["executor"] = getattr(tpe.thread_state, "executor", None)

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert calls == ["leave", "join"]
    assert out == {"key": "k", "start": 12.0, "after": None, "executor": None}
    assert worker.thread_state is utils.thread_state is worker_client.thread_state


# -- distributed.client (_internals/distributed/client.py) -----------------------------

@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_annotated_graph_gives_each_task_its_own_annotations(c, s, a):
    graph = {"x": dp.Task("x", operator.add, 1, 1), "y": dp.Task("y", operator.add, 2, 2)}
    hlg = annotated_graph(graph, {"x": {"retries": 2, "team": "red"}})
    with dask.annotate(team="blue"):  # global ones lose to a layer's
        fx, fy = c.get(hlg, ["x", "y"], sync=False)
    assert await c.gather([fx, fy]) == [2, 4]
    assert s.tasks["x"].annotations == {"retries": 2, "team": "red"}
    assert s.tasks["x"].retries == 2
    assert s.tasks["y"].annotations == {"team": "blue"}  # no None from dict.get
    assert annotated_graph(graph, {}) is graph


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_serialized_message_is_sent_as_client_compute_sends_its_expression(c, s, a):
    # Client._graph_to_futures serializes to_serialize(expr); a Serialized
    # one goes as it is (distributed.protocol.serialize), so it can be made
    # in another thread; the dask.annotate in effect reaches every task.
    da = pytest.importorskip("dask.array")
    x = da.arange(8, chunks=2)
    expr, keys = dp.finalized_together([x.sum()])
    extra = {"out": dp.Task("out", operator.add, dp.TaskRef(keys[0]), 1)}
    message = collections_message(expr, extra, [x.sum()])
    assert type(message[0]).__name__ == "Serialized"
    with dask.annotate(retries=2):
        (fut,) = send_serialized(c, message, ["out"])
    assert await fut == 29
    assert s.tasks["out"].retries == 2
    graph = {"y": dp.Task("y", operator.mul, 6, 7)}
    (fut,) = send_serialized(c, serialized_graph(graph), ["y"])
    assert await fut == 42


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_client_stream_is_ordered_with_graph_submissions(c, s, a):
    order = []
    got = asyncio.Event()

    def handler(key=None, client=None):
        order.append((key, key in s.tasks))
        got.set()

    add_handlers(s, stream={"test-client-op": handler})
    fut = c.submit(lambda: 1, key="ordered")
    send_on_client_stream(c, {"op": "test-client-op", "key": "ordered"})
    await asyncio.wait_for(got.wait(), 10)
    assert order == [("ordered", True)]  # the graph arrived first
    await fut


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_get_in_order_gives_the_scheduler_its_order(c, s, a, monkeypatch):
    # Client._graph_to_futures takes internal_priority; Scheduler.update_graph
    # then skips dask.order.order (its offload), and _set_priorities uses ours.
    import dask.order

    ordered = []
    real = dask.order.order
    monkeypatch.setattr(dask.order, "order", lambda *a, **k: ordered.append(1) or real(*a, **k))
    graph = {"io-x": (operator.add, 1, 1), "io-y": (operator.mul, "io-x", 10)}
    fy, fx = get_in_order(c, graph, ["io-y", "io-x"])
    assert (fy.key, fx.key) == ("io-y", "io-x")
    assert await fy == 20 and await fx == 2
    assert s.tasks["io-x"].priority[-1] == 0 and s.tasks["io-y"].priority[-1] == 1
    assert not ordered
    # Annotated (a HighLevelGraph), as a coroutine's children may be.
    annotated = annotated_graph({"io-z": (operator.add, 2, 3)}, {"io-z": {"retries": 2}})
    (fz,) = get_in_order(c, annotated, ["io-z"])
    assert await fz == 5
    assert s.tasks["io-z"].retries == 2 and s.tasks["io-z"].priority[-1] == 0
    assert not ordered
    # Client.get has its graph ordered on the scheduler.
    assert await c.get({"io-w": (operator.add, 1, 2)}, "io-w", sync=False) == 3
    assert ordered


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_flush_client_stream_sends_before_the_interval_ends(c, s, a):
    # BatchedSend._background_send waits for next_deadline after each batch;
    # flush_stream clears it and wakes the sender. With an interval of an
    # hour, the second message arrives only if the flush sent it.
    got = []
    arrived = asyncio.Event()

    def handler(n=None, client=None):
        got.append(n)
        arrived.set()

    add_handlers(s, stream={"test-flush-op": handler})
    c.scheduler_comm.interval = 3600
    send_on_client_stream(c, {"op": "test-flush-op", "n": 1})  # idle stream: sent now
    await asyncio.wait_for(arrived.wait(), 10)
    arrived.clear()
    send_on_client_stream(c, {"op": "test-flush-op", "n": 2})  # held for the hour
    for _ in range(20):
        await asyncio.sleep(0)
    assert got == [1] and c.scheduler_comm.buffer
    flush_client_stream(c)
    await asyncio.wait_for(arrived.wait(), 10)
    assert got == [1, 2]
    c.scheduler_comm.interval = 0.01


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_batch_interval_is_the_client_streams(c, s, a):
    set_batch_interval(c, 0.002)
    assert c.scheduler_comm.interval == 0.002


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_submitting_as_ranks_children_ahead_of_queued_work(c, s, a):
    # Client._graph_to_futures reads thread_state.key to rank a task's
    # children (distributed.client: "priority" from the running task).
    ev = Event()

    async def parent():
        await ev.wait()

    p = c.submit(parent, key="parent")
    while "parent" not in s.tasks or s.tasks["parent"].state != "processing":
        await asyncio.sleep(0.01)
    with submitting_as("parent"):
        child = c.submit(lambda: 1, key="child")
    plain = c.submit(lambda: 1, key="plain")
    while "child" not in s.tasks or "plain" not in s.tasks:
        await asyncio.sleep(0.01)
    assert s.tasks["child"].priority < s.tasks["plain"].priority
    await ev.set()
    await asyncio.gather(p, child, plain)


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_future_in_memory_is_finished_and_gathers(c, s, a):
    # A key put in a worker's memory and made known to the scheduler
    # (Worker.update_data, Scheduler.update_data), as a stream's item is.
    store_own_data(a, {"item-x": 42})
    s.update_data(who_has={"item-x": [a.address]}, nbytes={"item-x": 28}, client="holder")
    f = future_in_memory(c, "item-x")
    assert f.status == "finished"
    assert await c.gather(f) == 42
    s.client_releases_keys(keys=["item-x"], client="holder")


def test_blocking_client_calls_go_through_client_sync_and_the_worker_makes_its_client():
    """seceding_waits relies on Worker._get_client (get_client() calls it and
    makes the worker's client) and on every blocking call of a Client going
    through its sync method (gather, Future.result, scatter)."""
    import inspect

    from distributed import Client, Future, Worker

    assert callable(Worker._get_client)
    assert "asynchronous" in inspect.signature(Client.sync).parameters
    # What the grace of coro.secede-after does in Client.sync's place:
    # distributed.utils.sync runs func on the client's loop, within
    # callback_timeout, and says "timed out after ..." when it is over.
    from distributed.utils import sync

    assert "callback_timeout" in inspect.signature(Client.sync).parameters
    assert "wait_for(awaitable, timeout)" in inspect.getsource(sync)
    assert 'timed out after {timeout} s.' in inspect.getsource(sync)
    for method in (Client.gather, Client.scatter, Future.result):
        assert "self.sync(" in inspect.getsource(method) or "self.client.sync(" in inspect.getsource(method)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_clients_loop_is_an_asyncio_loop_that_runs_its_calls(c, s, a):
    """seceding_waits runs a blocking call's coroutine on the worker client's
    loop (``Client.loop.asyncio_loop``), where Client.sync would."""
    client = a._get_client()
    await client
    assert client.loop.asyncio_loop is asyncio.get_running_loop()


@gen_cluster(client=True, client_kwargs={"set_as_default": False}, nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1)])
async def test_workers_of_a_process_share_the_client_of_the_first_over_its_pool(c, s, a, b):
    """own_scheduler_rpc relies on Worker._get_client handing the client the
    worker's PooledRPCCall to the scheduler (Client.scheduler), making it the
    process's default client, which the other workers adopt, and on its RPCs
    failing once that worker's pool is closed."""
    from distributed.core import PooledRPCCall

    from dask_coro._internals.distributed.client import own_scheduler_rpc

    client = a._get_client()
    await client
    assert b._get_client() is client  # adopted: the process's default
    assert isinstance(client.scheduler, PooledRPCCall) and client.scheduler.pool is a.rpc
    assert not own_scheduler_rpc(client, a)  # on a's own pool: left alone
    await a.rpc.close()
    with pytest.raises(RuntimeError, match="ConnectionPool is closed"):
        await client.scheduler.identity()
    assert own_scheduler_rpc(client, b)
    assert client.scheduler.pool is client.rpc and not own_scheduler_rpc(client, b)
    assert (await client.scheduler.identity())["type"] == "Scheduler"


# -- distributed.scheduler (_internals/distributed/scheduler.py; batched.py) -----------

@gen_cluster(client=True, nthreads=[("127.0.0.1", 1), ("127.0.0.1", 2)])
async def test_idle_threads_counts_free_threads(c, s, a, b):
    assert idle_threads(s) == 3
    ev = Event()

    async def block():
        await ev.wait()

    futs = [c.submit(block, key=f"block-{i}") for i in range(2)]
    while idle_threads(s) > 1:
        await asyncio.sleep(0.01)
    assert idle_threads(s) == 1
    await ev.set()
    await asyncio.gather(*futs)
    with dask.config.set({"distributed.scheduler.worker-saturation": float("inf")}):
        assert idle_threads(s) >= 0  # the attribute is read either way


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_send_to_worker_reaches_its_stream_handler(c, s, a):
    got = []
    add_handlers(a, stream={"test-op": lambda n, **kw: got.append(n)})
    assert send_to_worker(s, a.address, {"op": "test-op", "n": 3})
    while not got:
        await asyncio.sleep(0.01)
    assert got == [3]
    assert not send_to_worker(s, "tcp://127.0.0.1:1", {"op": "test-op", "n": 4})


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_send_to_worker_now_sends_before_the_interval_ends(c, s, a):
    got = []
    add_handlers(a, stream={"test-op": lambda n, **kw: got.append(n)})
    stream = s.stream_comms[a.address]
    stream.interval = 3600
    assert send_to_worker(s, a.address, {"op": "test-op", "n": 1})
    while not got:
        await asyncio.sleep(0.01)
    assert send_to_worker(s, a.address, {"op": "test-op", "n": 2})
    for _ in range(20):
        await asyncio.sleep(0)
    assert got == [1] and stream.buffer  # held for the hour
    assert send_to_worker(s, a.address, {"op": "test-op", "n": 3}, now=True)
    while len(got) < 3:
        await asyncio.sleep(0.01)
    assert got == [1, 2, 3]  # in order, both sent by the flush
    stream.interval = 0.005


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_stored_worker_plugin_is_given_to_joining_workers(c, s, a):
    from distributed import Worker, WorkerPlugin
    from distributed.protocol.pickle import dumps

    class Mark(WorkerPlugin):
        name = "test-mark"

        def setup(self, worker):
            worker.marked = True

    store_worker_plugin(s, "test-mark", dumps(Mark()))
    async with Worker(s.address, nthreads=1) as w:
        assert getattr(w, "marked", False)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_fail_task_errs_a_parked_task_with_the_error(c, s, a):
    fut = c.submit(lambda: 1, key="parked", resources={"nothing-has-this": 1})
    while "parked" not in s.tasks or s.tasks["parked"].state != "no-worker":
        await asyncio.sleep(0.01)
    try:
        raise KeyError("failed on purpose")
    except KeyError as e:
        fail_task(s, "parked", e, "test-fail")
    with pytest.raises(KeyError, match="failed on purpose"):
        await fut


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_forget_if_unused_forgets_only_released_unused_tasks(c, s, a):
    fut = c.submit(lambda: 1, key="used")
    await fut
    assert not forget_if_unused(s, "used", "test")  # in memory, wanted
    assert not forget_if_unused(s, "no-such-key", "test")


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)],
    config={"distributed.scheduler.validate": True, "distributed.worker.validate": True},
)
async def test_alias_task_points_a_parked_task_at_a_target(c, s, a):
    parked = c.submit(lambda: 0, key="alias", resources={"nothing-has-this": 1})
    target = c.submit(lambda: 42, key="target")
    await target
    while "alias" not in s.tasks or s.tasks["alias"].state != "no-worker":
        await asyncio.sleep(0.01)
    assert alias_task(s, s.tasks["alias"], s.tasks["target"], "test-alias") is None
    assert await parked == 42
    assert isinstance(s.tasks["alias"].run_spec, dp.Alias)
    # A finished task cannot be re-pointed.
    assert "cannot re-point" in alias_task(s, s.tasks["alias"], s.tasks["target"], "t2")


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_remove_worker_counts_suspicion_that_adjust_suspicion_changes(c, s, a):
    from distributed import Worker

    async with Worker(s.address, nthreads=1, resources={"R": 1}) as b:
        ev_key = "blocker"
        from distributed import Event

        fut = c.submit(lambda: Event(ev_key).wait(), key="victim", resources={"R": 1})
        while not (fut.key in s.tasks and s.tasks[fut.key].state == "processing"):
            await asyncio.sleep(0.01)
        ts = s.tasks[fut.key]
        assert ts.suspicious == 0
        await s.remove_worker(b.address, stimulus_id="test")
        assert ts.suspicious == 1 and ts.prefix.suspicious == 1
        adjust_suspicion(ts, -1, prefix=-1)
        assert ts.suspicious == 0 and ts.prefix.suspicious == 0
        adjust_suspicion(ts, -1, prefix=-1)  # a credit: below zero; the prefix not
        assert ts.suspicious == -1 and ts.prefix.suspicious == 0
        adjust_suspicion(ts, 1)
        await Event(ev_key, client=c).set()
        await c.cancel(fut)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_scheduler_side_client_holds_keys_and_is_dropped(c, s, a):
    fut = c.submit(lambda: 5, key="held")
    await fut
    s.client_desires_keys(keys=["held"], client="holder-x")
    del fut
    await asyncio.sleep(0.2)
    assert s.tasks["held"].state == "memory"  # still wanted by the holder
    drop_client_state(s, "holder-x")
    assert "holder-x" in s.clients  # it still holds a key
    s.client_releases_keys(keys=["held"], client="holder-x", stimulus_id="test")
    drop_client_state(s, "holder-x")
    assert "holder-x" not in s.clients
    while "held" in s.tasks:
        await asyncio.sleep(0.01)


# -- distributed.core: handlers (_internals/distributed/core.py) -----------------------

@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_stream_handlers_inline_plugin_wraps_are_plain_functions(c, s, a):
    # InlinePlugin wraps them in a plain function, which handle_stream then
    # calls without awaiting.
    import inspect

    for op in ("long-running", "worker-status-change"):
        assert not inspect.iscoroutinefunction(s.stream_handlers[op]), op


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_wrap_stream_handler_wraps_update_graph_once(c, s, a):
    calls = []

    def wrap(handler):
        async def wrapped(**kwargs):
            calls.append(1)
            return await handler(**kwargs)

        return wrapped

    wrap_stream_handler(s, "update-graph", wrap, "_test_wrapped")
    wrap_stream_handler(s, "update-graph", wrap, "_test_wrapped")
    assert await c.submit(lambda: 3, key="wrapped") == 3
    assert calls == [1]


# -- distributed.collections: the scheduler's queue (_internals/distributed/collections.py) ---

def test_queue_heap_keeps_discarded_tasks_and_drop_stale_queue_entries_cleans_it():
    """``Scheduler.queued`` is a ``HeapSet`` of a set (``_data``) and a heap
    of weak references (``_heap``); a discarded task stays in the heap, and
    ``peek`` hands back an alive object equal to one in the set, the old one
    (dask/distributed #7504). ``drop_stale_queue_entries`` keeps the entries
    of the very objects in the set."""
    from types import SimpleNamespace

    from distributed.collections import HeapSet

    class Task:  # compares and hashes by key, as TaskState does
        def __init__(self, key, priority):
            self.key, self.priority = key, priority

        def __eq__(self, other):
            return isinstance(other, Task) and other.key == self.key

        def __hash__(self):
            return hash(self.key)

    s = SimpleNamespace(queued=HeapSet(key=lambda t: t.priority))
    old, other = Task("x", 0), Task("y", 1)
    s.queued.add(old)
    s.queued.add(other)
    s.queued.discard(old)  # released from the queue, not popped
    new = Task("x", 2)  # the key queued again, the old object alive
    s.queued.add(new)
    assert queue_entries(s) == 3
    assert s.queued.peek() is old  # the stale entry comes first
    assert drop_stale_queue_entries(s) == 1 and queue_entries(s) == 2
    assert s.queued.peek() is other and s.queued.pop() is other and s.queued.pop() is new
    assert drop_stale_queue_entries(s) == 0


# -- distributed.dashboard (_internals/distributed/dashboard.py) -----------------------

@gen_cluster(
    client=True, nthreads=[], scheduler_kwargs={"dashboard": True, "dashboard_address": "127.0.0.1:0", "http_prefix": "/p"}
)
async def test_dashboard_prefix_routes_navigation_and_frame(c, s):
    from tornado import web
    from tornado.httpclient import AsyncHTTPClient

    assert dashboard_prefix(s) == "/p"  # the Bokeh app's prefix is the http_prefix

    class Hello(web.RequestHandler):
        def get(self):
            self.finish(render_dashboard_page(s, '<p id="hello">hello</p>'))

    add_http_routes(s, [("/p/dask-coro-hello", Hello, {})])  # added after the server started
    add_dashboard_page(s, "dask-coro-hello")
    add_dashboard_page(s, "dask-coro-hello")  # once
    base = f"http://127.0.0.1:{s.http_server.port}/p"
    hello = (await AsyncHTTPClient().fetch(f"{base}/dask-coro-hello")).body.decode()
    assert '<p id="hello">hello</p>' in hello and "statics/css/base.css" in hello
    # The navigation bar of this page and of the Bokeh pages, loaded now, lists it once.
    status = (await AsyncHTTPClient().fetch(f"{base}/status")).body.decode()
    for markup in (hello, status):
        assert markup.count('<a href="dask-coro-hello">') == 1
        assert markup.index('href="dask-coro-hello"') < markup.index('href="info"')


@gen_cluster(client=True, nthreads=[])
async def test_no_dashboard_prefix_without_a_dashboard(c, s):
    assert s.http_server is not None  # the HTTP server runs (health, metrics), the dashboard not
    assert dashboard_prefix(s) is None


# -- resources lent by a waiting coroutine (worker_state_machine.py, scheduler.py) -----

_GPU = {"GPU": 1}


_VALIDATE = {"distributed.scheduler.validate": True, "distributed.worker.validate": True}


def _seceded_holding(hold):
    """A plain task that secedes (long-running, as a waiting coroutine is)
    and waits: its resources stay its own (dask/distributed #6565)."""
    from distributed import secede

    secede()
    Event(hold).wait(30)
    return "held"


async def _held(c, a, hold, key):
    """``_seceded_holding(hold)`` submitted as ``key`` with the GPU, once it
    is long-running on worker ``a``."""
    future = c.submit(_seceded_holding, hold, resources=_GPU, key=key)
    await _in_state(a, key, "long-running")
    return future


async def _in_state(worker, key, state):
    """Until the task ``key`` is in ``state`` on ``worker``."""
    while worker.state.tasks.get(key) is None or worker.state.tasks[key].state != state:
        await asyncio.sleep(0.01)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1, {"resources": _GPU})], config=_VALIDATE)
async def test_lend_and_take_move_a_long_running_tasks_resources_through_the_state_machine(c, s, a):
    # Worker and scheduler validate their state after every step: the sum of
    # available resources and those of executing | long_running tasks stays
    # the total (WorkerState._validate_resources), whatever we lend or take.
    p = await _held(c, a, "hold", "p")
    assert a.state.available_resources == {"GPU": 0}  # seceding kept them
    assert task_resources(a, "p") == _GPU
    run_id, priority = task_run_id_priority(a, "p")
    assert run_id == s.tasks["p"].run_id and isinstance(priority, tuple)
    # A constrained task waits for the GPU; lending it lets it start at once
    # (the event's handler runs _ensure_computing).
    q = c.submit(_seceded_holding, "q-hold", resources=_GPU, key="q")
    await _in_state(a, "q", "constrained")
    assert lend_resources(a, "p") == _GPU
    assert a.state.tasks["p"].resource_restrictions == {}
    while a.state.tasks["q"].state not in ("executing", "long-running"):
        await asyncio.sleep(0.01)
    assert lend_resources(a, "p") == {}  # nothing held: nothing lent twice
    # Not free while q has it; free once q ended (_execute_done_common gives
    # back q's resource_restrictions).
    assert not take_resources(a, "p", _GPU)
    await Event("q-hold").set()
    assert await q == "held"
    assert available_resources(a) == _GPU and total_resources(a) == _GPU
    assert take_resources(a, "p", _GPU)
    assert a.state.tasks["p"].resource_restrictions == _GPU and a.state.available_resources == {"GPU": 0}
    assert not take_resources(a, "p", _GPU)  # holds them already
    await Event("hold").set()
    assert await p == "held"
    assert a.state.available_resources == _GPU  # given back once, as it ended

    # A task that ends while they are lent gives back nothing more.
    p2 = await _held(c, a, "hold2", "p2")
    assert lend_resources(a, "p2") == _GPU
    await Event("hold2").set()
    assert await p2 == "held"
    assert a.state.available_resources == _GPU


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1, {"resources": _GPU})], config=_VALIDATE)
async def test_a_cancelled_running_task_keeps_its_resource_restrictions_when_asked_for_again(c, s, a):
    # WorkerState._handle_compute_task: a task cancelled while it runs keeps
    # the resource_restrictions it had (so one lent stays lent, {}) when the
    # scheduler asks for it again.
    p = await _held(c, a, "hold3", "p3")
    lend_resources(a, "p3")
    await p.cancel()
    await _in_state(a, "p3", "cancelled")
    p = await _held(c, a, "hold3", "p3")
    assert a.state.tasks["p3"].resource_restrictions == {}
    assert take_resources(a, "p3", _GPU)
    await Event("hold3").set()
    assert await p == "held"
    assert a.state.available_resources == _GPU


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1, {"resources": _GPU})], config=_VALIDATE)
async def test_used_resources_count_processing_tasks_and_count_resources_adjusts_them(c, s, a):
    p = c.submit(_seceded_holding, "hold4", resources=_GPU, key="p4")
    while s.tasks.get("p4") is None or s.tasks["p4"] not in s.workers[a.address].long_running:
        await asyncio.sleep(0.01)
    # Scheduler.handle_long_running leaves used_resources alone.
    assert used_resources(s, a.address) == _GPU
    ts = s.tasks["p4"]
    assert processing_task(s, "p4", a.address, ts.run_id) == (ts, s.workers[a.address])
    assert processing_task(s, "p4", a.address, ts.run_id + 1) is None  # a stale run
    assert processing_task(s, "p4", "tcp://elsewhere:1", ts.run_id) is None
    count_resources(s, ts.processing_on, _GPU, used=False)
    assert used_resources(s, a.address) == {"GPU": 0}
    count_resources(s, ts.processing_on, _GPU, used=True)
    assert used_resources(s, a.address) == _GPU
    # Scheduler._exit_processing_common subtracts the task's restrictions as
    # it leaves processing.
    await Event("hold4").set()
    assert await p == "held"
    assert used_resources(s, a.address) == {"GPU": 0}


# -- distributed's state-machine checks in the tests (--validate) ----------------------

def _validates(dask_worker):
    return dask_worker.state.validate


def test_the_validate_option_reaches_worker_processes(pytestconfig):
    """`pytest --validate` turns distributed's state-machine checks on in
    every worker process the tests start; without it they are off there, as
    in a deployment."""
    from distributed import Client, LocalCluster

    on = pytestconfig.getoption("--validate")
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as lc, Client(lc) as client:
        assert set(client.run(_validates).values()) == {on}
        assert lc.scheduler.validate is on


@pytest.mark.validated
def test_a_validated_test_validates_its_worker_processes():
    """A test marked ``validated`` runs as under --validate (.ci/run's one
    pass relies on it for the chaos workloads)."""
    from distributed import Client, LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as lc, Client(lc) as client:
        assert set(client.run(_validates).values()) == {True}
        assert lc.scheduler.validate is True


@gen_cluster(client=True, nthreads=[("", 1), ("", 1)])
async def test_gen_cluster_validates_in_every_pass(c, s, a, b):
    """distributed's gen_cluster turns validation on for its scheduler and
    workers (utils_test.config_for_cluster_tests), with or without
    --validate: .ci/run runs them once."""
    assert s.validate and a.state.validate and b.state.validate


# -- what a task's error becomes (runtime/errors.py) -----------------------------------

class _Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


class _TwoArguments(Exception):  # its constructor takes other arguments than its args
    def __init__(self, a, b):
        super().__init__(a)
        self.b = b


class _Unloadable(Exception):  # pickles, but loading it fails
    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise TypeError("not here")


@pytest.mark.parametrize(
    "error",
    [
        ValueError("plain"),
        _Unpicklable("holds a lock"),
        _TwoArguments("a", "b"),
        _Unloadable("x"),
        KeyError("k" * 20_000),  # longer than distributed.admin.max-error-length
    ],
    ids=lambda e: type(e).__name__,
)
def test_task_error_is_what_error_message_and_clean_exception_deliver(error):
    """runtime.errors.task_error gives a parent what a task's Future gives:
    distributed.core.error_message on the worker, clean_exception on the
    client."""
    from distributed.core import clean_exception, error_message

    from dask_coro.runtime.errors import task_error

    try:
        raise error
    except Exception as e:
        sent = error_message(e)["exception"].data  # the pickled bytes a client receives
    _, delivered, _ = clean_exception(sent)
    ours = task_error(error)
    assert (type(ours), ours.args) == (type(delivered), delivered.args)


def test_task_error_of_stop_iteration_is_what_a_client_raises():
    """A task's StopIteration reaches a waiting client as RuntimeError: the
    client raises it inside a coroutine (PEP 479)."""
    from distributed import Client, LocalCluster

    from dask_coro.runtime.errors import task_error

    def stop():
        raise StopIteration(1)

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        with pytest.raises(RuntimeError) as info:
            client.submit(stop).result()
    ours = task_error(StopIteration(1))
    assert (type(ours), ours.args) == (type(info.value), info.value.args)
    assert type(ours.__cause__) is type(info.value.__cause__) is StopIteration


@pytest.mark.timeout(120)
@gen_test(timeout=90)
async def test_a_reconnecting_client_keeps_and_sends_again_the_submissions_held(monkeypatch):
    """``Client._reconnect`` (a scheduler lost, the client running) cancels
    every future in ``client.futures``; ``_graph_to_futures`` is what every
    submission goes through, with ``expr`` and ``keys``; a Future's state is
    its client's ``FutureState`` (``reset``), which the key's answers from a
    new scheduler at the same address finish."""
    from distributed import Client, Scheduler, Worker

    monkeypatch.setattr(client_seam, "_ORIGINAL", {})  # installed afresh, undone after
    monkeypatch.setattr(Client, "_graph_to_futures", Client._graph_to_futures)
    monkeypatch.setattr(Client, "_reconnect", Client._reconnect)
    seen = []
    watch_submissions(lambda client, task, args, kwargs: seen.append((client, task, args, kwargs)))
    keeping_on_reconnect(lambda client: [(a, k) for c, _, a, k in seen if c is client and "kept" in submission_keys(a, k)])

    s = await Scheduler(host="127.0.0.1", port=0, dashboard_address=":0")
    port = s.port
    w = await Worker(s.address, nthreads=1)
    async with Client(s.address, asynchronous=True, timeout=60) as c:
        kept = c.submit(inc, 1, key="kept")
        other = c.submit(inc, 2, key="other")
        assert await kept == 2 and await other == 3
        [(client, task, args, kwargs)] = [x for x in seen if "kept" in submission_keys(x[2], x[3])]
        assert client is c and task is None and submission_expr(args, kwargs) is not None
        await w.close()
        await s.close()
        s = await Scheduler(host="127.0.0.1", port=port, dashboard_address=":0")
        w = await Worker(s.address, nthreads=1)
        try:
            assert await kept == 2  # computed again by the new scheduler
            assert "kept" in s.tasks and "other" not in s.tasks
            assert other.status == "cancelled"
        finally:
            await w.close()
            await s.close()
