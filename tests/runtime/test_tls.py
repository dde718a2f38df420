"""dask_coro on a cluster secured with TLS (``Security.temporary()``: a
self-signed certificate for scheduler, workers and client): coroutines, a
promise and a shared-memory array, as on a plain cluster."""

from __future__ import annotations

import time

import pytest
from distributed import Client, LocalCluster
from distributed.security import Security

from dask_coro import shm
from dask_coro.examples import fib, logical_task, shared_totals

pytest.importorskip("cryptography")  # Security.temporary() makes its certificate with it


@pytest.mark.inline
@pytest.mark.timeout(120)
def test_fib_promise_and_shared_array_over_tls():
    sec = Security.temporary()
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
        protocol="tls", security=sec,
    ) as lc, Client(lc, security=sec) as client:
        assert lc.scheduler_address.startswith("tls://")
        assert all(w.startswith("tls://") for w in client.nthreads())
        assert client.compute(fib(15)).result(timeout=60) == 610
        assert (logical_task(5) + 1).compute() == 101
        assert shared_totals(100_000, 2).compute() == [100_000.0, 100_000.0]
        deadline = time.monotonic() + 20
        while shm.segments() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not shm.segments()
