"""A durable run as a user's program runs it, for tests/durable/test_durable.py:
``python durable_program.py STORE FOLDER N SLOW``.

A LocalCluster of worker processes computes ``run(N)`` under the root key
``durable-program``: N children, every one appending its index to
``FOLDER/executions`` when it starts; those from index N - SLOW on wait
while the file ``FOLDER/hold`` exists (the same calls, so the same keys,
held or not). Prints the value."""

from __future__ import annotations

import os
import sys
import time

import dask
from distributed import Client, LocalCluster

from dask_coro import coroutine


def child(i: int, folder: str, slow: bool) -> int:
    with open(os.path.join(folder, "executions"), "a") as f:
        f.write(f"{i}\n")
    while slow and os.path.exists(os.path.join(folder, "hold")):
        time.sleep(0.05)
    return i * i


@coroutine
def run(n: int, folder: str, slow: int):
    squares = yield [dask.delayed(child)(i, folder, i >= n - slow) for i in range(n)]
    return sum(squares)


@coroutine
def pinned(n: int, folder: str, slow: int, fast_on: str, slow_on: str):
    """``run``'s children, the fast ones on ``fast_on`` (where the root runs
    too), the slow ones on ``slow_on``; either may move if its worker is lost."""
    with dask.annotate(workers=[fast_on], allow_other_workers=True):
        fast = [dask.delayed(child)(i, folder, False) for i in range(n - slow)]
    with dask.annotate(workers=[slow_on], allow_other_workers=True):
        held = [dask.delayed(child)(i, folder, True) for i in range(n - slow, n)]
    squares = yield [*fast, *held]
    return sum(squares)


def main() -> None:
    store, folder, n, slow = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    # A worker is sent no more tasks than it has threads (queued on the
    # scheduler instead): none waits behind a held child on a busy worker
    # while a thread is free on the other.
    settings = {"coro.durability.store": store, "distributed.scheduler.worker-saturation": 1.0}
    with dask.config.set(settings):
        with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster:
            with Client(cluster) as client:
                value = client.compute(run(n, folder, slow, dask_key_name="durable-program")).result()
    print(value, flush=True)


if __name__ == "__main__":
    main()
