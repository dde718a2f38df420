"""A client, scheduler or worker with another dask_coro version: a clear error
naming both versions and the process, at the first coroutine task it sees."""

from __future__ import annotations

import pytest
from helpers import cli_cluster, workers_now

import dask_coro
from dask_coro.examples import fib

FAKE = "0.0.0+other"


def _preload(tmp_path):
    path = tmp_path / "other_version.py"
    path.write_text(f"import dask_coro\ndask_coro.__version__ = {FAKE!r}\n")
    return str(path)


def test_a_worker_with_another_version_fails_the_task_naming_both(tmp_path):
    with cli_cluster(tmp_path, 1, worker_args=("--preload", _preload(tmp_path))) as client:
        worker = next(iter(workers_now(client)))
        with pytest.raises(dask_coro.VersionMismatchError) as e:
            client.compute(fib(5)).result(timeout=60)
    message = str(e.value)
    assert f"dask_coro {dask_coro.__version__}" in message and f"dask_coro {FAKE}" in message
    assert f"worker {worker}" in message


def test_a_scheduler_with_another_version_refuses_the_graph_naming_both(tmp_path):
    with cli_cluster(tmp_path, 1, scheduler_args=("--preload", _preload(tmp_path))) as client:
        # distributed's "Error during deserialization of the task graph",
        # caused by ours.
        with pytest.raises(RuntimeError, match="deserialization of the task graph") as e:
            client.compute(fib(5)).result(timeout=60)
    assert isinstance(e.value.__cause__, dask_coro.VersionMismatchError)
    message = str(e.value.__cause__)
    assert f"dask_coro {dask_coro.__version__}" in message and f"dask_coro {FAKE}" in message
    assert "the scheduler tcp://127.0.0.1:" in message


def test_the_same_version_everywhere_runs(tmp_path):
    with cli_cluster(tmp_path, 1) as client:
        assert client.compute(fib(10)).result(timeout=60) == 55
