"""``python -m dask_coro``: the demo of the README on an embedded LocalCluster."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import dask_coro
from dask_coro.examples import afib, fib, logical_task, process_all


def _timed(label: str, fn) -> None:
    start = time.perf_counter()
    value = fn()
    print(f"{label:<28} = {value!r:<8} {time.perf_counter() - start:7.2f} s", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dask_coro",
        description="Run the dask_coro demo (fib, async fib, process_all, a "
        "promise, shared memory).",
    )
    parser.add_argument("--address", help="scheduler address of an existing cluster")
    parser.add_argument("--workers", type=int, default=2, help="embedded cluster size")
    parser.add_argument("--threads", type=int, default=1, help="threads per worker")
    parser.add_argument("-n", type=int, default=20, help="fib(n) to compute")
    parser.add_argument(
        "--release-abandoned",
        action="store_true",
        help="instead of the demo: run the releases this host recorded for "
        "clusters that are gone (after a crash), and exit",
    )
    args = parser.parse_args(argv)
    if args.release_abandoned:
        released = dask_coro.release_abandoned()
        print(f"released {len(released)} resources of clusters that are gone")
        for rid in released:
            print(f"  {rid}")
        return 0

    from distributed import Client, LocalCluster

    if args.address:
        try:
            client = Client(args.address, timeout="10s")
        except OSError as e:
            print(f"error: cannot reach a scheduler at {args.address}: {e}", file=sys.stderr)
            return 2
        cluster = None
    else:
        cluster = LocalCluster(
            n_workers=args.workers,
            threads_per_worker=args.threads,
            processes=True,
            dashboard_address=":0",
        )
        client = Client(cluster)
    with client:
        nthreads = sum(client.nthreads().values())
        print(f"dask_coro {dask_coro.__version__} on {len(client.nthreads())} workers, "
              f"{nthreads} threads; dashboard: {client.dashboard_link}")
        _timed(f"fib({args.n})", lambda: fib(args.n).compute())
        _timed(f"afib({args.n})", lambda: client.compute(afib(args.n)).result())
        _timed("process_all()", lambda: process_all().compute())
        _timed("logical_task(5) + 1", lambda: (logical_task(5) + 1).compute())
        try:
            from dask_coro import shm
        except ImportError:
            print("shared memory: skipped (pip install 'dask-coro[shm]' for NumPy)")
        else:
            from dask_coro.examples import shared_totals

            n = 10_000_000  # 80 MB
            _timed("shared_totals(80 MB, 4)", lambda: shared_totals(n, 4).compute())
            if not args.address:  # the segments of this host
                deadline = time.monotonic() + 10
                while shm.segments() and time.monotonic() < deadline:
                    time.sleep(0.05)
                print(f"{'shared segments left':<28} = {len(shm.segments())}")
    if cluster is not None:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
