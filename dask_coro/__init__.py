"""dask_coro: coroutine tasks for Dask distributed."""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

import dask as _dask

if _TYPE_CHECKING:
    from typing import Any

from . import (
    _config,  # noqa: F401  (adds the coro.* defaults to dask's config)
    _features,  # noqa: F401  (registers each feature's extension)
)
from ._context import current_key as current_key
from ._exceptions import BadYieldError as BadYieldError
from ._exceptions import BaseExceptionError as BaseExceptionError
from ._exceptions import CoroutineCancelledError as CoroutineCancelledError
from ._exceptions import DaskCoroError as DaskCoroError
from ._exceptions import NotInTaskError as NotInTaskError
from ._exceptions import PromiseError as PromiseError
from ._exceptions import StreamReplayInconsistentError as StreamReplayInconsistentError
from ._exceptions import VersionMismatchError as VersionMismatchError
from .core import accel as _accel
from .durable.api import forget_run as forget_run
from .durable.api import runs as runs
from .groups.api import Child as Child
from .groups.api import Group as Group
from .groups.api import group as group
from .promise.client import Promise as Promise
from .runtime.call import CoroutineCall as CoroutineCall
from .runtime.call import CoroutineFunction as CoroutineFunction
from .runtime.call import coroutine as coroutine
from .runtime.call import gather as gather
from .runtime.result import result as result
from .stream.api import Stream as Stream
from .stream.api import emit as emit
from .stream.api import stream as stream

#: The engine that runs coroutine bodies in this process: ``"compiled"`` (the
#: optional C accelerator, built where ``pip install`` found a C compiler) or
#: ``"pure"`` (Python; also where ``DASK_CORO_PURE=1`` is set). Both give the
#: same results; see docs/running.md, "Which engine runs".
engine: str = _accel.ENGINE

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0"

# dask/distributed #1663 sketched coroutine tasks as ``@dask.coroutine``: after
# ``import dask_coro`` that spelling works, and is this ``coroutine``. A
# ``dask.coroutine`` that dask (or anyone before us) defined is left alone.
if not hasattr(_dask, "coroutine"):
    _dask.coroutine = coroutine  # type: ignore[attr-defined]

# These import distributed, which importing dask_coro does not.
_LAZY = {
    "tie": (".lifetimes.tie", "tie"),
    "release_abandoned": (".lifetimes.registry", "release_abandoned"),
    "progress": (".diagnostics.client", "progress"),
    "progress_async": (".diagnostics.client", "progress_async"),
    "tree": (".diagnostics.client", "tree"),
    "Tree": (".diagnostics.client", "Tree"),
    "TreePlugin": (".diagnostics.scheduler", "TreePlugin"),
    "DurablePlugin": (".durability.scheduler", "DurablePlugin"),
    "ReleasePlugin": (".release.scheduler", "ReleasePlugin"),
    "LifetimesPlugin": (".lifetimes.scheduler", "LifetimesPlugin"),
    "PromisePlugin": (".promise.scheduler", "PromisePlugin"),
    "InlinePlugin": (".runtime.scheduler", "InlinePlugin"),
    "StreamPlugin": (".stream.scheduler", "StreamPlugin"),
}


def __getattr__(name: str) -> Any:  # PEP 562
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(_importlib.import_module(module, __name__), attr)
    if name == "shm":  # needs numpy
        return _importlib.import_module(".shm", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


async def dask_setup(server: Any) -> None:
    """Preload hook: ``dask scheduler --preload dask_coro`` installs the
    scheduler plugins of every enabled extension (``runtime/extensions.py``);
    ``dask worker --preload dask_coro`` asks its scheduler to install them.
    Installing them again later (first use) is a no-op."""
    from .runtime.extensions import preload

    await preload(server)


__all__ = [
    "BadYieldError",
    "BaseExceptionError",
    "Child",
    "CoroutineCall",
    "CoroutineCancelledError",
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
    "emit",
    "engine",
    "forget_run",
    "gather",
    "group",
    "progress",
    "progress_async",
    "release_abandoned",
    "result",
    "runs",
    "stream",
    "tie",
    "tree",
]
