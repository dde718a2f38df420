"""10,000 pending promises on a 1-thread worker: time to create them, to resolve them one by one from a client, and the check that their dependent sums right.

Run: python benchmarks/bench_promises.py [--n 10000]
"""

from __future__ import annotations

import argparse
import sys
import time

import dask
from distributed import Client, LocalCluster

from dask_coro import Promise


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10_000)
    n = p.parse_args(argv).n
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        start = time.perf_counter()
        promises = [Promise() for _ in range(n)]
        created = time.perf_counter() - start
        total = client.compute(dask.delayed(sum)(promises))
        time.sleep(1)
        assert not total.done()  # every promise is parked, the sum waits
        start = time.perf_counter()
        for i, q in enumerate(promises):
            q.resolve_with(i)
        resolved = time.perf_counter() - start
        assert total.result() == n * (n - 1) // 2
    print(f"| pending promises | create s | resolve s | per resolve ms |")
    print("|---|---|---|---|")
    print(f"| {n} | {created:.1f} | {resolved:.1f} | {resolved / n * 1000:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
