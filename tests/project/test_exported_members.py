"""dask_coro's public namespace."""

from __future__ import annotations
import __future__

import importlib
import importlib.metadata
import types

import pytest

import dask_coro


def test_all_is_importable():
    for name in dask_coro.__all__:
        assert hasattr(dask_coro, name), name
        exec(f"from dask_coro import {name}", {})


def test_all_has_no_duplicates_and_is_sorted():
    assert len(set(dask_coro.__all__)) == len(dask_coro.__all__)
    assert list(dask_coro.__all__) == sorted(dask_coro.__all__)


def test_all_matches_public_names():
    # Submodules, ``from __future__ import annotations`` and the preload hook
    # ``dask_setup`` are not API; lazily imported names (PEP 562) are.
    public = {
        name
        for name, value in vars(dask_coro).items()
        if not name.startswith("_")
        and not isinstance(value, (types.ModuleType, __future__._Feature))
        and name != "dask_setup"
    } | set(dask_coro._LAZY)
    assert public == set(dask_coro.__all__)


def test_all_exact():
    assert set(dask_coro.__all__) == {
        "BadYieldError",
        "BaseExceptionError",
        "Child",
        "CoroutineCancelledError",
        "CoroutineCall",
        "CoroutineFunction",
        "DaskCoroError",
        "DurablePlugin",
        "Group",
        "InlinePlugin",
        "LifetimesPlugin",
        "NotInTaskError",
        "Promise",
        "PromiseError",
        "PromisePlugin",
        "ReleasePlugin",
        "Stream",
        "StreamPlugin",
        "StreamReplayInconsistentError",
        "Tree",
        "TreePlugin",
        "VersionMismatchError",
        "coroutine",
        "current_key",
        "engine",
        "emit",
        "gather",
        "forget_run",
        "group",
        "progress",
        "progress_async",
        "release_abandoned",
        "result",
        "runs",
        "stream",
        "tie",
        "tree",
    }


def test_star_import():
    ns: dict = {}
    exec("from dask_coro import *", ns)
    assert {k for k in ns if k != "__builtins__"} == set(dask_coro.__all__)


def test_exported_objects_are_the_implementations():
    from dask_coro import _context, _exceptions
    from dask_coro.runtime import call as _api

    assert dask_coro.coroutine is _api.coroutine
    assert dask_coro.gather is _api.gather
    assert dask_coro.CoroutineCall is _api.CoroutineCall
    assert dask_coro.CoroutineFunction is _api.CoroutineFunction
    assert dask_coro.current_key is _context.current_key
    assert dask_coro.BadYieldError is _exceptions.BadYieldError
    assert dask_coro.NotInTaskError is _exceptions.NotInTaskError
    assert dask_coro.DaskCoroError is _exceptions.DaskCoroError


def test_exception_hierarchy():
    assert issubclass(dask_coro.BadYieldError, dask_coro.DaskCoroError)
    assert issubclass(dask_coro.BadYieldError, TypeError)
    assert issubclass(dask_coro.NotInTaskError, dask_coro.DaskCoroError)
    assert issubclass(dask_coro.NotInTaskError, RuntimeError)
    assert issubclass(dask_coro.DaskCoroError, Exception)


def test_version_matches_metadata():
    assert dask_coro.__version__ == importlib.metadata.version("dask-coro")


def test_console_script_entry_point_resolves():
    # pyproject.toml declares ``dask-coro = "dask_coro.__main__:main"``.
    (ep,) = [
        ep
        for ep in importlib.metadata.entry_points(group="console_scripts")
        if ep.name == "dask-coro"
    ]
    assert ep.value == "dask_coro.__main__:main"
    module = importlib.import_module(ep.module)
    assert callable(getattr(module, ep.attr))


def test_py_typed_marker_shipped():
    import pathlib

    assert (pathlib.Path(dask_coro.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("name", ["coroutine", "gather", "current_key"])
def test_public_functions_documented(name):
    assert getattr(dask_coro, name).__doc__
