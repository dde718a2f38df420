"""Chaos: workers SIGKILLed at random while coroutine workloads run.

A ``LocalCluster`` of 3 Nanny workers (1 thread each); a killer thread
SIGKILLs a random worker process every 1-3 s (the Nanny starts a new one).
Meanwhile fib (every call a task), process_all, a promise and a
shared-memory workload run, each checked against its known answer. After
the runs: nothing hangs, the scheduler holds no task, no segment of the run
is left in /dev/shm, and the cluster is back to 3 workers.

Marked ``chaos``: CI runs one round (``pytest -m chaos``, part of the suite);
``--chaos-runs N`` runs N rounds. The baseline beside it: plain Dask's static
graph of 10-ms tasks under the same killer.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import dask
import pytest
from distributed import Client, LocalCluster
from workloads import fib, process_all_pure

from dask_coro import shm
from dask_coro.examples import logical_task, shared_totals

pytestmark = pytest.mark.chaos


class Killer:
    """SIGKILLs a random worker process of ``cluster`` every ``low``-``high``
    seconds while in a ``with`` block; counts the kills."""

    def __init__(self, cluster: LocalCluster, low: float = 1.0, high: float = 3.0, seed: int = 0):
        self.cluster = cluster
        self.low, self.high = low, high
        self.random = random.Random(seed)
        self.kills = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _pids(self) -> list[int]:
        pids = []
        for nanny in list(self.cluster.workers.values()):
            proc = getattr(getattr(nanny, "process", None), "process", None)
            pid = getattr(proc, "pid", None)
            if pid is not None and proc.is_alive():
                pids.append(pid)
        return pids

    def _run(self) -> None:
        while not self._stop.wait(self.random.uniform(self.low, self.high)):
            pids = self._pids()
            if len(pids) < 2:
                continue  # leave one: a cluster of none finishes nothing
            try:
                os.kill(self.random.choice(pids), signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills += 1

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _tasks(dask_scheduler=None) -> int:
    return len(dask_scheduler.tasks)


def _poll(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


WORKLOADS = [
    ("fib(14), every call a task", lambda c: c.compute(fib(14)), 377),
    # Pure tasks only: a lost result is computed again, and a random one
    # (process_all's generate_data) would then differ between its consumers.
    ("process_all", lambda c: c.compute(process_all_pure(40)), (sum(range(1, 41)), list(range(40)))),
    ("a promise", lambda c: c.compute(logical_task(5) + 1), 101),
    ("shared memory", lambda c: c.compute(shared_totals(200_000, 2)), [200_000.0, 200_000.0]),
]


# distributed's SpecCluster closes a worker's Nanny for good when, at
# distributed.deploy.lost-worker-timeout (15 s) after the worker left, no
# worker of that name is registered (SpecCluster._update_worker_status). Kills
# every 1-3 s often land on a worker just restarted by its Nanny, so the
# cluster shrank for good (2 of 3 workers, then 1): LocalCluster's behaviour,
# not dask_coro's. Each Nanny restarts its own worker; a timeout longer than
# the run leaves that to it.
NANNIES_STAY = {"distributed.deploy.lost-worker-timeout": "600s"}


@pytest.mark.timeout(600)
def test_workloads_survive_workers_killed_at_random(pytestconfig):
    rounds = pytestconfig.getoption("--chaos-runs")
    before = set(shm.segments())
    ran = 0
    with dask.config.set(NANNIES_STAY), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as lc, Client(lc) as client:
        client.wait_for_workers(3, timeout=60)
        with Killer(lc, seed=rounds) as killer:
            for _ in range(rounds):
                for name, start, expected in WORKLOADS:
                    got = start(client).result(timeout=240)
                    assert got == expected, name
                    ran += 1
        kills = killer.kills
        # Back to 3 workers, nothing held, no segment left.
        client.wait_for_workers(3, timeout=90)
        _poll(lambda: client.run_on_scheduler(_tasks) == 0, 60, "tasks left on the scheduler")
    _poll(lambda: not (set(shm.segments()) - before), 30, "segments left")
    print(f"chaos: {ran} workload runs, {kills} kills, all right")
    assert ran == rounds * len(WORKLOADS)


def _ten_ms(i):
    time.sleep(0.01)
    return i


@pytest.mark.timeout(600)
def test_baseline_plain_dask_static_graph_under_the_same_killer(pytestconfig):
    """The same killer on plain Dask: ``--chaos-baseline-tasks`` 10-ms
    ``dask.delayed`` tasks and their sum, without kills and then with. Printed
    beside ours, not asserted fast; it must finish right."""
    n = pytestconfig.getoption("--chaos-baseline-tasks")

    def graph():
        return dask.delayed(sum)([dask.delayed(_ten_ms)(i) for i in range(n)])

    with dask.config.set(NANNIES_STAY), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as lc, Client(lc) as client:
        client.wait_for_workers(3, timeout=60)
        start = time.monotonic()
        assert client.compute(graph()).result(timeout=300) == sum(range(n))
        calm = time.monotonic() - start
        with Killer(lc, seed=2) as killer:
            start = time.monotonic()
            assert client.compute(graph()).result(timeout=500) == sum(range(n))
            took = time.monotonic() - start
        print(f"baseline: plain Dask, {n} 10-ms tasks: {calm:.1f} s without kills, "
              f"{took:.1f} s with {killer.kills} kills")
        client.wait_for_workers(3, timeout=90)
