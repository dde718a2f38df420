"""Every exception dask_coro raises.

Hierarchy::

    DaskCoroError                      base of everything below
    ├── BadYieldError (TypeError)      a coroutine yielded or awaited something it may not
    ├── NotInTaskError (RuntimeError)  a task-context accessor was called outside a task
    └── CoroutineCancelledError        the task running a coroutine was cancelled
        (asyncio.CancelledError)       by the scheduler; raised into ``yield`` / ``await``
"""

from __future__ import annotations

import asyncio


class DaskCoroError(Exception):
    """Base class of all dask_coro errors."""


class BadYieldError(DaskCoroError, TypeError):
    """A coroutine yielded (or awaited) an object dask_coro cannot compute."""


class NotInTaskError(DaskCoroError, RuntimeError):
    """A function that needs a running task was called outside of one."""


class CoroutineCancelledError(DaskCoroError, asyncio.CancelledError):
    """The task running this coroutine was cancelled (released by the scheduler).

    It is thrown into the coroutine at its current ``yield``/``await`` only through
    ``generator.close()``, i.e. as ``GeneratorExit``; this class is what the task
    itself ends with, so that logs name the reason.
    """
