from __future__ import annotations

import copy
import logging
import os
import sys

import dask
import pytest

# The tests are laid out as the package is, a folder per part (tests/core/,
# tests/groups/, ...), with no __init__.py: pytest imports each test module
# under its bare name (test_group), from its folder, so the names of test
# modules are unique across folders (pytest refuses two of one name). The
# shared modules (helpers, bodies, workloads, ...) are in this folder.
# Worker processes started by the tests (LocalCluster, `dask worker`, scripts)
# import the test modules' functions by that bare name: this folder and every
# test folder are importable, here and in every process started from here.
HERE = os.path.dirname(os.path.abspath(__file__))
FOLDERS = [
    HERE,
    *sorted(
        os.path.join(HERE, name)
        for name in os.listdir(HERE)
        if os.path.isdir(os.path.join(HERE, name)) and name != "__pycache__"
    ),
]
for folder in reversed(FOLDERS):
    if folder not in sys.path:
        sys.path.insert(0, folder)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (*FOLDERS, os.environ.get("PYTHONPATH")) if p
)

import ast_guard  # noqa: E402 (importable from this folder once the path is set)

# Worker processes this process starts (LocalCluster, Nanny) fork from one
# server process that imported distributed, dask_coro and the libraries the
# tests' tasks use once, instead of each importing them again as "spawn", the
# default, does: the suite's worker processes cost about a third of its CPU.
# They still import the test modules themselves, and take the sys.path,
# working folder and configuration (Nanny passes it) of this process when
# started. Programs the tests run as scripts, and `dask worker` processes,
# keep the default, as a user's do.
dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
from distributed.utils import get_mp_context  # noqa: E402

# get_mp_context sets distributed's own preload once; this one replaces it.
get_mp_context().set_forkserver_preload(
    ["distributed", "dask_coro", "dask.array", "dask.dataframe", "numpy", "pandas", "greenlet"]
)

# CPython 3.11 before 3.11.8 shares the AST constructor's recursion count
# between threads: a body's ast.literal_eval fails now and then while another
# thread builds a tree (tests/ast_guard.py, tests/runtime/test_ast_race.py).
if ast_guard.AFFECTED:
    ast_guard.install()


_formatter = logging.Formatter()


def pytest_addoption(parser):
    parser.addoption(
        "--validate",
        action="store_true",
        help="run with distributed.scheduler.validate and distributed.worker.validate "
        "on (distributed checks its state machines after every transition), in this "
        "process and in every worker process the tests start",
    )


    parser.addoption(
        "--chaos-runs",
        type=int,
        default=1,
        help="rounds of the chaos workloads (tests marked chaos) under random worker kills",
    )
    parser.addoption(
        "--chaos-kills",
        type=int,
        default=5,
        help="at most this many kills per chaos workload (0: no limit), so a round's time "
        "has a bound on a loaded machine",
    )
    parser.addoption(
        "--release-examples",
        type=int,
        default=8,
        help="random DAGs the worker-release property test runs (tests/release/test_release_property.py)",
    )
    parser.addoption(
        "--conformance-examples",
        type=int,
        default=60,
        help="random programs the conformance test runs on every path (tests/runtime/test_conformance.py)",
    )
    parser.addoption(
        "--chaos-baseline-tasks",
        type=int,
        default=600,
        help="size of the plain Dask graph run under the same killer, for comparison",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "chaos: workers SIGKILLed at random while workloads run (see --chaos-runs)",
    )
    config.addinivalue_line(
        "markers",
        "inline: run with coroutine calls run inline (coro.inline.enabled, the "
        "default); unmarked tests run every coroutine call as a task of its own",
    )
    config.addinivalue_line(
        "markers",
        "segment_pool(nbytes, idle=None): run with coro.stream.segment-pool at nbytes (unmarked: 0, none "
        "kept), and coro.stream.segment-pool-idle at idle if given",
    )
    config.addinivalue_line(
        "markers",
        "validated: always run with distributed's state-machine checks on, as "
        "--validate runs every test (the files where dask_coro's plugins change "
        "the scheduler's and workers' state)",
    )


#: Test modules that make shared-memory segments or count the host's
#: (``shm.segments()`` lists all of /dev/shm): one xdist group, run one after
#: another, so that no test counts another's segments.
DEV_SHM = frozenset(
    {
        "test_chaos",
        "test_demo",
        "test_docs_programs",
        "test_lifetimes",
        "test_lifetimes_processes",
        "test_misuse",
        "test_multihost",
        "test_notebooks",
        "test_packaging",
        "test_readme",
        "test_shm_faults",
        "test_shm_local",
        "test_tls",
    }
)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``--dist loadgroup``, pyproject.toml), a module's
    tests run on one xdist worker, in order: a module's tests may share its
    fixtures and files, and a test never runs beside one of its own module."""
    for item in items:
        module = item.path.stem
        item.add_marker(pytest.mark.xdist_group("dev-shm" if module in DEV_SHM else module))


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
    settings = {"coro.inline.enabled": on}
    # A worker keeps its streams' segments for later streams (tied to it, so
    # the ledger is never empty while it lives): off but where a test says
    # (``segment_pool``), as tests check that a stream leaves nothing behind.
    pool = request.node.get_closest_marker("segment_pool")
    pool_bytes = pool.args[0] if pool is not None else 0
    monkeypatch.setenv("DASK_CORO__STREAM__SEGMENT_POOL", str(pool_bytes))
    original["coro"].setdefault("stream", {})["segment-pool"] = pool_bytes
    settings["coro.stream.segment-pool"] = pool_bytes
    idle = pool.kwargs.get("idle") if pool is not None else None
    if idle is not None:
        monkeypatch.setenv("DASK_CORO__STREAM__SEGMENT_POOL_IDLE", str(idle))
        original["coro"]["stream"]["segment-pool-idle"] = idle
        settings["coro.stream.segment-pool-idle"] = idle
    validating = request.config.getoption("--validate") or (
        request.node.get_closest_marker("validated") is not None
    )
    if validating:
        for part in ("scheduler", "worker"):
            monkeypatch.setenv(f"DASK_DISTRIBUTED__{part.upper()}__VALIDATE", "True")
            original.setdefault("distributed", {}).setdefault(part, {})["validate"] = True
            settings[f"distributed.{part}.validate"] = True
        # A Nanny (LocalCluster's worker processes) passes validate=False to
        # its worker unless told otherwise, whatever the configuration says.
        from distributed import Nanny

        init = Nanny.__init__

        def validating_init(self, *args, **kwargs):
            kwargs.setdefault("validate", True)
            init(self, *args, **kwargs)

        monkeypatch.setattr(Nanny, "__init__", validating_init)
    monkeypatch.setattr(utils_test, "original_config", original)
    # pytest keeps every log record of a test (its report and caplog), and
    # a record's exc_info keeps the traceback's frames, with their locals,
    # alive: after a worker was lost, Scheduler.remove_worker's frame and in
    # it the removed WorkerState, whose ``executing`` still maps forgotten
    # TaskStates. When such a key is submitted again (a re-run coroutine's
    # children have the same keys), the scheduler's queue finds the
    # forgotten TaskState, equal to the new one (dask/distributed #7504),
    # and validation asserts. Outside pytest nothing keeps the records. Here
    # a record's traceback is formatted when the record is made, and let go of.
    make = logging.getLogRecordFactory()

    def record_without_frames(*args, **kwargs):
        record = make(*args, **kwargs)
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = _formatter.formatException(record.exc_info)
            record.exc_info = None
        return record

    logging.setLogRecordFactory(record_without_frames)
    request.addfinalizer(lambda: logging.setLogRecordFactory(make))
    with dask.config.set(settings):
        yield


@pytest.fixture(autouse=True)
def _fresh_timings():
    """Each test starts with no function measured in this process (its
    in-process workers' durations, ``runtime/timings.py``): whether a plain
    child runs beside its parent never depends on the tests run before."""
    from dask_coro.runtime.timings import TIMINGS, Timings

    TIMINGS.__dict__.update(Timings().__dict__)
    yield
    TIMINGS.__dict__.update(Timings().__dict__)


@pytest.fixture(params=["compiled", "pure"])
def engine(request, monkeypatch):
    """Runs a test once on each engine (docs/development.md): the compiled
    loop (``dask_coro.core._cengine``, when built) and the pure one, the
    reference, in this process and in any worker process the test starts
    (``DASK_CORO_PURE``). A trampoline takes its loop when it is made, so
    tests that make one through the runtime run on the engine asked for.
    The compiled one not built: its runs skip, unless
    ``DASK_CORO_REQUIRE_COMPILED`` is set (CI), where they fail."""
    from dask_coro.core import accel

    if request.param == "pure":
        monkeypatch.setattr(accel, "cengine", None)
        monkeypatch.setenv(accel.PURE_ENV, "1")
        # A worker process forked from the forkserver has the engine the
        # server imported: start them fresh, so they read DASK_CORO_PURE.
        import distributed.utils_test as utils_test

        method = {"distributed.worker.multiprocessing-method": "spawn"}
        utils_test.original_config.setdefault("distributed", {}).setdefault("worker", {})[
            "multiprocessing-method"
        ] = "spawn"
        with dask.config.set(method):
            yield request.param
        return
    if accel.cengine is None:
        if os.environ.get("DASK_CORO_REQUIRE_COMPILED", "") not in ("", "0"):
            pytest.fail(f"the compiled engine is required, but not in use ({accel.why})")
        pytest.skip(f"the compiled engine is not in use ({accel.why})")
    yield request.param
