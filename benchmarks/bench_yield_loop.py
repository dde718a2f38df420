"""A coroutine looping over N sequential yields: per-yield latency and the most keys alive on the scheduler, versus a worker_client loop of submit().result().

Run: python benchmarks/bench_yield_loop.py [--n 10000]
"""

from __future__ import annotations

import argparse
import sys
import time

from distributed import Client, LocalCluster, SchedulerPlugin, worker_client

from dask_coro import coroutine


def inc(x):
    return x + 1


@coroutine
def loop(n):
    total = 0
    for i in range(n):
        total += yield coroutine(inc)(i)
    return total


def wc_loop(n):
    total = 0
    with worker_client() as c:
        for i in range(n):
            total += c.submit(inc, i, pure=False).result()
    return total


class MaxTasks(SchedulerPlugin):
    name = "bench-max-tasks"

    def __init__(self):
        self.max = 0

    async def start(self, scheduler):
        self.scheduler = scheduler

    def transition(self, *args, **kwargs):
        self.max = max(self.max, len(self.scheduler.tasks))


def _reset(dask_scheduler):
    dask_scheduler.plugins["bench-max-tasks"].max = 0


def _max(dask_scheduler):
    return dask_scheduler.plugins["bench-max-tasks"].max


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10_000)
    args = p.parse_args(argv)
    n = args.n
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.register_plugin(MaxTasks())
        rows = []
        for label, run in [
            ("dask_coro yield loop", lambda: client.compute(loop(n)).result()),
            ("worker_client submit().result() loop", lambda: client.submit(wc_loop, n, pure=False).result()),
        ]:
            client.run_on_scheduler(_reset)
            start = time.perf_counter()
            assert run() == sum(range(1, n + 1))
            elapsed = time.perf_counter() - start
            rows.append((label, elapsed, client.run_on_scheduler(_max)))
    print(f"| N = {n} | total s | per yield ms | most keys on the scheduler |")
    print("|---|---|---|---|")
    for label, elapsed, most in rows:
        print(f"| {label} | {elapsed:.1f} | {elapsed / n * 1000:.2f} | {most} |")
    print(f"\nratio dask_coro / worker_client: {rows[0][1] / rows[1][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
