"""fib(n) with every call a task: dask_coro versus worker_client(), wall time and peak worker threads.

Run: python benchmarks/bench_fib.py [--n 10 12] [--repeat 3]
A smoke benchmark (2 worker processes x 1 thread); it prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from distributed import Client, LocalCluster, worker_client

from dask_coro.examples import fib as coro_fib


def wc_fib(i):
    if i < 2:
        return i
    with worker_client() as c:
        a, b = c.gather([c.submit(wc_fib, i - 1, pure=False), c.submit(wc_fib, i - 2, pure=False)])
    return a + b


class ThreadPeak:
    """Samples the worker processes' thread counts in the background."""

    def __init__(self, client: Client):
        self.client = client
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                counts = self.client.run(threading.active_count)
                self.peak = max(self.peak, max(counts.values()))
            except Exception:
                pass
            self._stop.wait(0.05)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def measure(fn, n: int, repeat: int) -> tuple[float, int]:
    """Median wall time and peak worker threads, on a fresh cluster (threads
    that worker_client leaves behind would otherwise count for the next run)."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        times, peak = [], 0
        for _ in range(repeat):
            with ThreadPeak(client) as p:
                start = time.perf_counter()
                fn(client, n)
                times.append(time.perf_counter() - start)
            peak = max(peak, p.peak)
    return statistics.median(times), peak


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, nargs="+", default=[10, 12])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    print("| n | tasks | dask_coro s | worker_client s | ratio | peak worker threads: dask_coro | worker_client |")
    print("|---|---|---|---|---|---|---|")
    for n in args.n:
        tasks = 2 * _fib(n + 1) - 1
        tc, pc = measure(lambda c, n: c.compute(coro_fib(n)).result(), n, args.repeat)
        tw, pw = measure(lambda c, n: c.submit(wc_fib, n, pure=False).result(), n, args.repeat)
        print(f"| {n} | {tasks} | {tc:.2f} | {tw:.2f} | {tc / tw:.2f} | {pc} | {pw} |", flush=True)
    return 0


def _fib(i: int) -> int:
    return i if i < 2 else _fib(i - 1) + _fib(i - 2)


if __name__ == "__main__":
    sys.exit(main())
