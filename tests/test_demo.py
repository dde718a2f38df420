"""``python -m dask_coro`` (and the ``dask-coro`` script): the README's main job."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from distributed import LocalCluster
from test_cluster import _free_port

pytestmark = pytest.mark.inline  # the demo runs with the shipped defaults


def demo(*args: str, timeout: float = 110) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dask_coro", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def check_results(out: str) -> None:
    assert re.search(r"^fib\(8\) +?= 21 +[0-9.]+ s$", out, re.M), out
    assert re.search(r"^afib\(8\) +?= 21 +[0-9.]+ s$", out, re.M), out
    assert re.search(r"^process_all\(\) +?= \d+ +[0-9.]+ s$", out, re.M), out
    assert re.search(r"^logical_task\(5\) \+ 1 +?= 101 +[0-9.]+ s$", out, re.M), out
    assert "shared_totals(80 MB, 4)      = [10000000.0, 10000000.0, 10000000.0, 10000000.0]" in out


def test_demo_on_an_embedded_cluster():
    out = demo("-n", "8", "--workers", "2", "--threads", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"on 2 workers, 2 threads; dashboard: http://\S+/status", out.stdout)
    check_results(out.stdout)
    assert "shared segments left         = 0" in out.stdout


def test_demo_against_an_existing_cluster():
    with LocalCluster(
        n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0"
    ) as cluster:
        out = demo("-n", "8", "--address", cluster.scheduler_address)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "on 1 workers, 2 threads" in out.stdout
    check_results(out.stdout)


def test_demo_unreachable_address_is_a_clear_error():
    address = f"tcp://127.0.0.1:{_free_port()}"
    out = demo("--address", address, timeout=60)
    assert out.returncode == 2
    assert f"error: cannot reach a scheduler at {address}" in out.stderr
    assert "Traceback" not in out.stderr


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "dask-coro")
    out = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--address" in out.stdout and "--release-abandoned" in out.stdout
