"""Lifetimes across real processes: the preloads, and a scheduler that never
deserializes a release."""

from __future__ import annotations

import os
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster, Scheduler
from helpers import cli_cluster

import dask_coro
from dask_coro import shm
from dask_coro.examples import fib

#: Set in the test process, which runs LocalCluster's scheduler.
SCHEDULER_PID = os.getpid()


def wait_until(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached after {timeout} s")
        time.sleep(0.05)


def produce(n):
    a = shm.empty(n, dtype="i8")
    a[:] = np.arange(n)
    return a


def total(a):
    return int(a.sum()), os.getpid(), a.segment_name


@pytest.mark.inline  # the shipped default: the preload installs InlinePlugin too
def test_preloaded_scheduler_has_the_plugins_before_first_use(tmp_path):
    preload = ("--preload", "dask_coro")
    with cli_cluster(tmp_path, 2, scheduler_args=preload, worker_args=preload) as client:
        plugins = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.plugins))
        assert {"dask-coro-lifetimes", "dask-coro-promises", "dask-coro-tree", "dask-coro-durable", "dask-coro-inline"} <= set(plugins)
        # the scheduler plugin put its worker plugin on every worker (both
        # there: a worker that reconnected under load is waited for)
        def plugged():
            client.wait_for_workers(2, timeout=60)
            found = client.run(lambda dask_worker: list(dask_worker.plugins)).values()
            return len(found) == 2 and all("dask-coro-lifetimes" in names for names in found)

        wait_until(plugged, what="worker plugins")
        n = 100_000
        client.wait_for_workers(2, timeout=60)
        arr = client.submit(produce, n)
        # The workers' addresses from a broadcast: scheduler_info(n_workers=-1)
        # can come back with no workers under load (the client's periodic
        # refresh, n_workers=0, may replace the answer before it is returned:
        # Client.scheduler_info then _update_scheduler_info).
        workers = sorted(client.run(os.getpid))
        assert len(workers) == 2
        reads = [client.submit(total, arr, workers=[w], pure=False) for w in workers]
        out = client.gather(reads)
        assert {o[0] for o in out} == {n * (n - 1) // 2}
        assert len({o[1] for o in out}) == 2  # two processes read it
        name = out[0][2]
        assert name in shm.segments()
        del arr, reads
        wait_until(lambda: name not in shm.segments(), what=f"{name} released")


class Trap:
    """A release callable that records every process that unpickles it."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __reduce__(self):
        return (_trap_loaded, (self.log,))

    def __call__(self, rid: str) -> None:
        with open(self.log, "a") as f:
            f.write(f"release {rid} {os.getpid()}\n")


def _trap_loaded(log: str) -> Trap:
    with open(log, "a") as f:
        f.write(f"unpickled {os.getpid()}\n")
    return Trap(log)


def tie_trap(log: str) -> int:
    dask_coro.tie(f"trap-{os.getpid()}", Trap(log))
    return os.getpid()


def test_scheduler_never_unpickles_a_release(tmp_path):
    log = str(tmp_path / "trap.log")
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        assert cluster.scheduler is not None  # in this process
        workers = set(client.run(os.getpid).values())
        fut = client.submit(tie_trap, log)
        tier = fut.result()
        assert tier in workers
        del fut
        wait_until(lambda: os.path.exists(log) and "release" in open(log).read(), what="release")
    lines = [line.split() for line in open(log).read().splitlines()]
    pids = {int(line[-1]) for line in lines}
    assert SCHEDULER_PID not in pids
    assert pids <= workers
    assert [line[0] for line in lines].count("release") == 1
    assert ["unpickled"] == sorted({line[0] for line in lines} - {"release"})


def test_scheduler_pickle_false_cannot_be_set_in_this_distributed():
    # Lifetimes must work with distributed.scheduler.pickle:
    # false. distributed 2026.8 refuses to start such a scheduler at all, so
    # test_scheduler_never_unpickles_a_release checks what the setting meant.
    # If this starts failing, distributed allows it again: test under it.
    with dask.config.set({"distributed.scheduler.pickle": False}):
        with pytest.raises(RuntimeError, match="Pickling can no longer be disabled"):
            Scheduler()


def _cluster():
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")


def test_cluster_closed_while_futures_held_releases_segments():
    # LocalCluster closes its workers first; the last worker of the host
    # releases the host's shared memory, though the client still holds it.
    cluster = _cluster()
    client = Client(cluster)
    try:
        futs = [client.submit(produce, 1000, pure=False) for _ in range(4)]
        names = {o[2] for o in client.gather([client.submit(total, f) for f in futs])}
        assert len(names) == 4 and names <= set(shm.segments())
        cluster.close()
        wait_until(lambda: not names & set(shm.segments()), what="segments released")
    finally:
        client.close()
        cluster.close()


def test_client_and_cluster_exit_together_release_segments():
    # The usual script: leave both with-blocks at once. The client's keys are
    # forgotten as the workers start closing.
    with _cluster() as cluster, Client(cluster) as client:
        futs = [client.submit(produce, 1000, pure=False) for _ in range(4)]
        names = {o[2] for o in client.gather([client.submit(total, f) for f in futs])}
        assert names <= set(shm.segments())
    wait_until(lambda: not names & set(shm.segments()), what="segments released")


def test_client_shutdown_releases_segments_while_workers_remain():
    cluster = _cluster()
    client = Client(cluster)
    try:
        fut = client.submit(produce, 1000)
        name = client.submit(total, fut).result()[2]
        assert name in shm.segments()
        client.shutdown()  # closes the scheduler: before_close hands releases out
        wait_until(lambda: name not in shm.segments(), what="segment released")
    finally:
        client.close()
        cluster.close()


def test_worker_preload_installs_the_scheduler_plugins(tmp_path):
    # A scheduler started without the preload; its worker has it.
    with cli_cluster(tmp_path, 1, worker_args=("--preload", "dask_coro")) as client:
        plugins = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.plugins))
        assert {"dask-coro-lifetimes", "dask-coro-promises", "dask-coro-tree", "dask-coro-durable"} <= set(plugins)
        # Calls inline are off here (its tree counts tasks): no InlinePlugin.
        assert "dask-coro-inline" not in plugins
        # and installing them again from a client is harmless
        client.register_plugin(dask_coro.LifetimesPlugin())
        client.register_plugin(dask_coro.TreePlugin())
        f = client.compute(fib(6))
        assert f.result(timeout=60) == 8
        assert len(dask_coro.tree(f)) == 25


def test_a_shared_array_a_body_passes_on_is_not_copied_on_its_host():
    """A body holds a shared array and passes it on as a value to a child on
    another worker process of its host: it goes as a key of the body's
    worker (lifetimes.passed), which the child maps without a copy; nothing
    is left once the body is done."""
    from dask_coro import coroutine

    @coroutine
    def body(n, here, there):
        with dask.annotate(workers=[here], allow_other_workers=False):
            arr = yield dask.delayed(produce)(n)
        with dask.annotate(workers=[there], allow_other_workers=False):
            got = yield dask.delayed(total)(arr)
            listed = yield dask.delayed(lambda xs: [total(x) for x in xs])([arr, arr[1:]])
        return got, listed, arr.segment_name, os.getpid()

    n = 1000
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        workers = sorted(client.run(os.getpid))
        here, there = workers
        pids = client.run(os.getpid)
        (got, listed, name, body_pid) = client.compute(
            body(n, here, there), workers=[here], allow_other_workers=False
        ).result(timeout=60)
        assert body_pid == pids[here]
        assert got == (n * (n - 1) // 2, pids[there], name)  # the same segment, mapped there
        assert [x[0] for x in listed] == [n * (n - 1) // 2, n * (n - 1) // 2] and {x[2] for x in listed} == {name}
        wait_until(lambda: name not in shm.segments(), what=f"{name} released")
        assert not any(k.startswith("dask-coro-shared-") for k in client.run_on_scheduler(
            lambda dask_scheduler: list(dask_scheduler.tasks)))
