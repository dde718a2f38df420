"""Every exception dask_coro raises.

Hierarchy::

    DaskCoroError                      base of everything below
    ├── BadYieldError (TypeError)      a coroutine yielded or awaited something it may not
    ├── NotInTaskError (RuntimeError)  a task-context accessor was called outside a task
    ├── PromiseError (RuntimeError)    a Promise was misused, or can never get a value
    └── CoroutineCancelledError        the scheduler cancelled the task running a
        (asyncio.CancelledError)       coroutine; the body sees GeneratorExit
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
    """The scheduler cancelled the task running this coroutine.

    The body itself sees ``GeneratorExit`` at its current ``yield``/``await``
    (``finally`` blocks run); the task then ends with this error, which the
    worker discards because the task was cancelled. It appears in worker logs.
    """


class PromiseError(DaskCoroError, RuntimeError):
    """A ``Promise`` was misused, or can never get a value."""
