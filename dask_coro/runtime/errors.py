"""The error a parent gets from a child: the one a task's Future would give.

A child that is a task on a cluster reaches its parent through distributed:
the worker sends its error pickled (``distributed.core.error_message``: the
exception, ``tblib``-installed so its causes and tracebacks travel, truncated
to ``distributed.admin.max-error-length``; one that does not survive a
pickle round trip is replaced by ``Exception(repr(e))``), and a
``StopIteration`` the client raises inside its coroutines becomes
``RuntimeError("coroutine raised StopIteration")`` (PEP 479). Whether a call
runs inline or as a task depends on whether an idle thread took it, so an
inline child's error, and a child's computed without a cluster, becomes the
same here (``task_error``): one answer on every path.

Nothing is pickled unless a child raised; a picklable error is returned as
it is (the same object, its traceback kept). The root's own error is left
alone: the scheduler running it reports it as for any task.

Plain Python and dask only (no distributed: local runs work without it);
``tests/internals/test_internals.py`` pins ``task_error`` against distributed's own
``error_message`` and ``clean_exception``.
"""

from __future__ import annotations

import pickle

import cloudpickle
import dask


def task_error(e: BaseException) -> BaseException:
    """What a parent catches at its yield when a child raised ``e``, as if
    the child were a task on a cluster. ``SystemExit``, ``KeyboardInterrupt``
    and other ``BaseException``s that are not ``Exception``s are left alone
    (distributed passes the first two on; a coroutine parent is given the
    original of the rest, ``BaseExceptionError``)."""
    if not isinstance(e, Exception):
        return e
    if isinstance(e, StopIteration):
        # distributed.client: ``Future.result()`` and ``Client.gather`` raise
        # a task's error inside a coroutine, where PEP 479 turns this one
        # into RuntimeError (with the original as its cause).
        out = RuntimeError("coroutine raised StopIteration")
        out.__cause__ = e
        return out
    limit = dask.config.get("distributed.admin.max-error-length", 10000)
    text = str(e)
    if limit is not None and len(text) > limit:  # distributed.utils.truncate_exception
        try:
            e = type(e)("Long error message", text[:limit])
        except Exception:
            e = Exception("Long error message", type(e), text[:limit])
    try:
        _install_tblib(e)
        pickle.loads(cloudpickle.dumps(e))
    except Exception:
        return Exception(repr(e))  # distributed.core.error_message's stand-in
    return e


def _install_tblib(e: BaseException) -> None:
    """``tblib.pickling_support.install`` of ``e`` and its causes, as
    ``error_message`` does before it pickles (tblib pickles an exception
    without calling its ``__init__``, so one whose constructor takes other
    arguments than its ``args`` survives). Without tblib (distributed not
    installed) the plain pickle round trip decides."""
    try:
        from tblib import pickling_support
    except ImportError:
        return
    causes = []
    c = e.__cause__
    while c is not None:  # distributed.core.collect_causes
        causes.append(c)
        c = c.__cause__
    pickling_support.install(e, *causes)
