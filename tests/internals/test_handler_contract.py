"""dask_coro keeps distributed's contract where it stands in for distributed's
own code: every RPC and stream handler it wraps, and every method it replaces
on a Worker or a Client, looks to distributed as the original does.

distributed decides how to call a handler by inspecting it
(``Server.handle_comm``: ``_expects_comm``, ``has_keyword(handler,
"serializers")``; ``Server.handle_stream``: ``iscoroutinefunction``). A
wrapper that hid the ``serializers`` keyword made a worker pickle what it
sent to a client that refuses pickle (issue: ``Client(serializers=["dask",
"msgpack"])`` got "Data serialized with pickle but only able to deserialize
data with ['dask', 'msgpack']" once dask_coro's plugins were installed)."""

from __future__ import annotations

import inspect

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster, Scheduler, Worker, get_client
from distributed.core import _expects_comm
from distributed.utils import has_keyword, iscoroutinefunction
from distributed.utils_test import gen_cluster, inc

import dask_coro
from dask_coro import coroutine
from dask_coro.examples import fib

#: Every dask_coro plugin, installed by the preload hook on the scheduler and
#: the workers (the worker-release plugin only when enabled).
PRELOADED = {
    "distributed.scheduler.preload": ["dask_coro"],
    "distributed.worker.preload": ["dask_coro"],
    "coro.worker-release.enabled": True,
}
#: What a client that refuses pickle sets (distributed's test_turn_off_pickle).
NO_PICKLE = {"serializers": ["dask", "msgpack"], "deserializers": ["dask", "msgpack"]}

#: The handlers of distributed that dask_coro replaces by a wrapper, by table.
WRAPPED = {
    ("scheduler", "handlers"): set(),
    ("scheduler", "stream_handlers"): {
        "update-graph",  # lifetimes: shared arrays stay handles on the scheduler
        "release-worker-data",  # release: counts keys workers released early
        "client-desires-keys",  # release: revokes a mark a client now wants; durability: a late fire_and_forget
        "client-releases-keys",  # durability: a held child let go of
        "cancel-keys",  # durability: lets go of held children a cancel would reach
        "long-running",  # inline: a thread may be idle
        "worker-status-change",  # inline: a thread may be idle
    },
    ("worker", "handlers"): {"get_data"},  # lifetimes: names the recipient host
    ("worker", "stream_handlers"): {
        "compute-task",  # release: a key named held here alone after its early release
        # release: the keys the scheduler releases itself, not a compute the worker dropped
        "free-keys",
        "cancel-compute",
        "steal-request",
        "remove-replicas",
    },
}
#: The methods dask_coro replaces on an instance (``seceding_waits``).
REPLACED = {"worker": {"_get_client"}, "client": {"sync"}}


def _ours(f) -> bool:
    """Whether ``f`` is dask_coro's code: the module its code runs in (a
    wrapper shows the original's ``__module__``, not its globals)."""
    f = getattr(f, "__func__", f)
    module = f.__globals__["__name__"] if hasattr(f, "__globals__") else getattr(f, "__module__", None)
    return (module or "").split(".")[0] == "dask_coro"


def _takes_every_call_of(wrapper, original) -> list[str]:
    """The parameters of ``original`` that ``wrapper``'s own code (not the
    signature it shows) cannot take by name: what distributed may pass."""
    own = inspect.signature(wrapper, follow_wrapped=False).parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in own.values())
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in own.values())
    missing = []
    for name, p in inspect.signature(original).parameters.items():
        if p.kind is p.VAR_KEYWORD:
            ok = var_kw
        elif p.kind is p.VAR_POSITIONAL:
            ok = var_pos
        elif p.kind is p.POSITIONAL_ONLY:
            ok = var_pos or len([q for q in own.values() if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]) > 0
        else:
            ok = (name in own and own[name].kind is not own[name].POSITIONAL_ONLY) or var_kw
        if not ok:
            missing.append(name)
    return missing


def _compare_tables(role, server, plain) -> set[str]:
    """Every op of distributed's own table looks the same on ``server`` as on
    ``plain`` (a server without dask_coro); the ops dask_coro wrapped."""
    wrapped: set[str] = set()
    for table in ("handlers", "stream_handlers"):
        ours, theirs = getattr(server, table), getattr(plain, table)
        for op, original in theirs.items():
            h = ours[op]
            assert inspect.signature(h) == inspect.signature(original), (role, table, op)
            assert bool(iscoroutinefunction(h)) == bool(iscoroutinefunction(original)), (role, table, op)
            if table == "handlers":
                assert _expects_comm(h) == _expects_comm(original), (role, op)
                assert has_keyword(h, "serializers") == has_keyword(original, "serializers"), (role, op)
            if _ours(h):
                assert _takes_every_call_of(h, original) == [], (role, table, op)
                wrapped.add(op)
        # The ops dask_coro adds are its own: no clash with distributed's.
        added = set(ours) - set(theirs)
        assert all(op.startswith(("dask-coro", "dask_coro")) for op in added), (role, table, added)
        assert {op for op in theirs if _ours(ours[op])} == WRAPPED[(role, table)], (role, table)
    return wrapped


def _compare_replaced_methods(role, obj) -> set[str]:
    """Methods set on the instance ``obj`` by dask_coro have the signature
    and kind of its class's method, and take every call of it."""
    replaced = set()
    for name, f in vars(obj).items():
        if not callable(f) or not _ours(f):
            continue
        original = getattr(type(obj), name).__get__(obj)
        assert inspect.signature(f) == inspect.signature(original), (role, name)
        assert bool(iscoroutinefunction(f)) == bool(iscoroutinefunction(original)), (role, name)
        assert _takes_every_call_of(f, original) == [], (role, name)
        replaced.add(name)
    return replaced


@coroutine
def _uses_the_worker_client(n):
    # get_client() in a body: dask_coro wraps the worker's _get_client and
    # the client's sync (a blocking call in a body secedes).
    total = get_client().submit(inc, n, pure=False).result()
    a, b = yield [fib(5), fib(4)]  # inline children: the idle-threads handler
    dask_coro.tie(f"r-{n}", lambda rid: None)  # lifetimes: a release on the worker
    return total + a + b


@pytest.mark.inline  # the shipped default: the preload installs InlinePlugin too
@gen_cluster(client=True, config=PRELOADED)
async def test_every_handler_and_method_dask_coro_replaces_keeps_its_signature(c, s, a, b):
    # A coroutine on each worker installs what is installed on first use.
    assert await c.gather(
        [c.compute(_uses_the_worker_client(i), workers=[w.address]) for i, w in enumerate((a, b))]
    ) == [1 + 8, 2 + 8]
    assert {"dask-coro-lifetimes", "dask-coro-release", "dask-coro-inline", "dask-coro-durable"} <= set(s.plugins)
    with dask.config.set({"distributed.scheduler.preload": [], "distributed.worker.preload": []}):
        async with Scheduler(dashboard_address=":0", validate=True) as ps, Worker(ps.address) as pw:
            assert not any(_ours(p) for p in ps.plugins.values())
            _compare_tables("scheduler", s, ps)
            for w in (a, b):
                assert "dask-coro-lifetimes" in w.plugins and "dask-coro-release" in w.plugins
                _compare_tables("worker", w, pw)
    for w in (a, b):
        assert _compare_replaced_methods("worker", w) == REPLACED["worker"]
        assert _compare_replaced_methods("client", w._client) == REPLACED["client"]
    assert _compare_replaced_methods("scheduler", s) == set()
    # In one process a worker's get_client() may give the test's own client.
    assert _compare_replaced_methods("client", c) <= REPLACED["client"]


def test_a_wrapper_of_another_kind_is_refused():
    from dask_coro._internals.distributed.core import keeping_contract

    def sync_handler(comm, keys, serializers=None):
        return keys

    async def async_wrapper(*args, **kwargs):
        return sync_handler(*args, **kwargs)

    with pytest.raises(TypeError, match="coroutine functions"):
        keeping_contract(sync_handler, async_wrapper)


def _only_pickle():
    return inc  # a function: only pickle can send it


@pytest.mark.inline  # the shipped default: the preload installs InlinePlugin too
def test_a_client_that_refuses_pickle_gets_results_with_every_plugin_preloaded():
    """Worker processes and a scheduler with every dask_coro plugin (the
    preload hook; the worker-release plugin enabled): a client that refuses
    pickle gets its results, through the scheduler and from the workers
    directly, as without dask_coro; a result only pickle can send is still
    refused, as distributed's test_turn_off_pickle expects."""
    with dask.config.set(PRELOADED), LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster, **NO_PICKLE) as c:
        c.wait_for_workers(2, timeout=60)
        plugins = c.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.plugins))
        assert {
            "dask-coro-lifetimes", "dask-coro-promises", "dask-coro-tree",
            "dask-coro-durable", "dask-coro-inline", "dask-coro-release",
        } <= set(plugins)
        workers = sorted(c.run(lambda: 0))
        # A coroutine on each worker installs what is installed on first use.
        assert c.gather([
            c.compute(_uses_the_worker_client(i), workers=[w]) for i, w in enumerate(workers)
        ]) == [1 + 8, 2 + 8]
        found = c.run(lambda dask_worker: sorted(dask_worker.plugins))
        assert all({"dask-coro-lifetimes", "dask-coro-release"} <= set(p) for p in found.values())

        assert c.submit(inc, 1).result(timeout=60) == 2
        for direct in (False, True):
            futures = c.map(inc, range(5), pure=False, workers=workers[:1])
            assert c.gather(futures, direct=direct) == [1, 2, 3, 4, 5]
            arr = c.submit(np.ones, 5, pure=False)
            assert c.gather(arr, direct=direct).tolist() == [1.0] * 5
        assert c.compute(fib(10)).result(timeout=60) == 55
        assert c.scatter(1).result() == 1
        # What only pickle can carry is refused, as without dask_coro.
        with pytest.raises(TypeError, match="only able to deserialize"):
            c.submit(_only_pickle, pure=False).result(timeout=60)
