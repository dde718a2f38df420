"""Durable roots on a client: sent again when the client reconnects.

A scheduler lost under a live client (restarted at the same address, with
new workers) loses every task; distributed's client then cancels every
future (dask/distributed #436). A durable run is computed again from its
store by any new scheduler, so a client keeps the graphs it sent of its
durable roots (a coroutine call computed or persisted with
``coro.durability.store`` set: the ``computing`` hook, then the submission
that holds it), for as long as it holds one of their futures; when it
reconnects, those futures are kept pending instead of cancelled, and the
graphs are sent again with the same keys: the roots resume from the store
and the futures finish with their values.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .._internals.dask_private import expression_holds_any
from .._internals.distributed.client import (
    keeping_on_reconnect,
    submission_expr,
    submission_keys,
    watch_submissions,
)

Submission = tuple[tuple[Any, ...], dict[str, Any]]

#: Per thread: the roots computed (``computing``) since its last submission.
_PENDING = threading.local()
#: Per client: its submissions that hold durable roots.
_BOOKS: weakref.WeakKeyDictionary[Any, list[Submission]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def computing(key: Any) -> None:
    """A coroutine call ``key`` is computed with the store set: the next
    submission of this thread that holds it is kept."""
    watch_submissions(_seen)
    keeping_on_reconnect(held)
    pending = getattr(_PENDING, "keys", None)
    if pending is None:
        pending = _PENDING.keys = set()
    pending.add(key)


def _seen(client: Any, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    pending = getattr(_PENDING, "keys", None)
    if not pending:
        return
    _PENDING.keys = None
    if task is not None:  # a task's children: they go with its cluster
        return
    if not expression_holds_any(submission_expr(args, kwargs), pending):
        return
    with _LOCK:
        book = _BOOKS.setdefault(client, [])
        book[:] = [s for s in book if _holds(client, s)]
        book.append((args, kwargs))


def _holds(client: Any, submission: Submission) -> bool:
    futures = client.futures
    return any(k in futures for k in submission_keys(*submission))


def held(client: Any) -> list[Submission]:
    """The submissions of durable roots ``client`` still holds a future of."""
    with _LOCK:
        book = _BOOKS.get(client)
        if not book:
            return []
        book[:] = [s for s in book if _holds(client, s)]
        return list(book)
