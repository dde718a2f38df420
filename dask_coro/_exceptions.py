"""Every exception dask_coro raises.

Hierarchy::

    DaskCoroError (Exception)          base of the errors below
    ├── BadYieldError (TypeError)      a coroutine yielded or awaited something it may not
    ├── BaseExceptionError             on a cluster, a coroutine raised a BaseException
    │                                  subclass a client cannot receive (``.error`` holds it)
    ├── NotInTaskError (RuntimeError)  a task-context accessor was called outside a task
    ├── PromiseError (RuntimeError)    a Promise was misused, or can never get a value
    ├── StreamReplayInconsistentError  a stream's producer, run again after its worker
    │   (RuntimeError)                 died, emitted an item other than its first run's
    └── VersionMismatchError           a task made by one dask_coro version reached a
        (RuntimeError)                 process with another

    CoroutineCancelledError            the scheduler cancelled the task running a
    (asyncio.CancelledError,           coroutine; the body sees GeneratorExit
     a BaseException)

Cancellation is not an error: like ``asyncio.CancelledError`` and trio's
``Cancelled`` it derives from ``BaseException`` only, so an ``except
Exception`` (in user code, in a plugin, in a retry loop) cannot swallow it.

Two more are internal and never reach a user: ``Rejected`` (the classifier
refuses a yielded object; the runner turns it into a ``BadYieldError``) and
``Released`` (the worker runner learnt that the scheduler released its key).
"""

from __future__ import annotations

import asyncio


class DaskCoroError(Exception):
    """Base class of all dask_coro errors."""


class BadYieldError(DaskCoroError, TypeError):
    """A coroutine yielded (or awaited) an object dask_coro cannot compute."""


class BaseExceptionError(DaskCoroError):
    """On a cluster, a coroutine's body raised a ``BaseException`` that is not
    an ``Exception`` (nor ``SystemExit`` or ``KeyboardInterrupt``, which
    distributed handles itself): its task ends with this error instead,
    which ``error`` holds. A body's own ``asyncio.CancelledError`` is one
    too: a task ending with it would be taken for the task's cancellation
    (distributed reschedules it, and it would raise again for ever).

    distributed records such an exception as the task's error, but a client
    waiting for the task never returns: ``Future.result()`` re-raises it
    inside ``distributed.utils.sync``'s tornado coroutine, whose runner
    (``tornado.gen.Runner.run``) catches ``Exception`` only, so the waiting
    thread is never woken. A coroutine *parent* is given the original at its
    yield, as inline and without a cluster.
    """

    def __init__(self, message: str, error: BaseException):
        super().__init__(message, error)
        self.error = error

    def __str__(self) -> str:
        return str(self.args[0])


class NotInTaskError(DaskCoroError, RuntimeError):
    """A function that needs a running task was called outside of one."""


class CoroutineCancelledError(asyncio.CancelledError):
    """The scheduler cancelled the task running this coroutine.

    The body itself sees ``GeneratorExit`` at its current ``yield``/``await``
    (``finally`` blocks run); the task then ends with this error, which the
    worker discards because the task was cancelled. It appears in worker logs.
    """


class PromiseError(DaskCoroError, RuntimeError):
    """A ``Promise`` was misused, or can never get a value."""


class StreamReplayInconsistentError(DaskCoroError, RuntimeError):
    """A stream's producer run again (its worker died) emitted, at an index
    its first run had published, an item with another token
    (``dask.base.tokenize``): its consumer may have taken the first one
    already, so the stream cannot go on (Ray's
    ``StreamingGeneratorReplayInconsistentError``)."""


class VersionMismatchError(DaskCoroError, RuntimeError):
    """A coroutine task made by one dask_coro version was unpickled by a
    process (the scheduler, a worker) with another."""


# -- internal ------------------------------------------------------------------


class Rejected(Exception):
    """Internal: ``is_lazy`` refuses an object; carries a hint for the user.

    A function registered with ``dask_coro.core.classify.is_lazy`` may raise it
    to refuse a type with a better message than the default."""

    def __init__(self, hint: str = ""):
        self.hint = hint


class Released(Exception):
    """Internal: the scheduler released the key of the running coroutine."""
