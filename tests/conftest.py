from __future__ import annotations

import copy
import os
import sys

import dask
import pytest

# Worker processes started by the tests (LocalCluster, `dask worker`) import
# the test modules' functions by name; make this folder importable for them.
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (HERE, os.environ.get("PYTHONPATH")) if p
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "inline: run with coroutine calls run inline (coro.inline.enabled, the "
        "default); unmarked tests run every coroutine call as a task of its own",
    )


@pytest.fixture(autouse=True)
def _inline_setting(request, monkeypatch):
    """Most tests check what happens to coroutine calls as tasks (keys, trees,
    cancellation of children, workers dying under them): they run with inline
    execution off, in this process and in any worker process they start
    (Nanny passes dask.config on; `dask worker` reads the environment). Tests
    marked ``inline`` run with the shipped default, on."""
    on = request.node.get_closest_marker("inline") is not None
    monkeypatch.setenv("DASK_CORO__INLINE__ENABLED", str(on))
    # gen_cluster resets dask.config to utils_test.original_config first.
    import distributed.utils_test as utils_test

    original = copy.deepcopy(utils_test.original_config)
    original.setdefault("coro", {}).setdefault("inline", {})["enabled"] = on
    monkeypatch.setattr(utils_test, "original_config", original)
    with dask.config.set({"coro.inline.enabled": on}):
        yield
