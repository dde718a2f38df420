"""The writer: each child of a durable run stored as it finishes, on the
worker that computed it.

``StoreWriter`` (a worker plugin, on every worker) sees each task's
transition from executing to memory or error on the worker's event loop; a
task annotated with its run's root (``RUN``, by the extension) has its value
(or error) written to the store by a thread of ``WRITES``: neither the
event loop nor a body's thread waits for the store.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .. import _config
from .._exceptions import CoroutineCancelledError
from .._internals.distributed.worker_state_machine import (
    local_data,
    worker_task_annotations,
    worker_task_error,
)
from .local import RUN, WRITES, store_of_settings

logger = logging.getLogger("dask_coro")

_RAN = ("executing", "long-running")


class StoreWriter(WorkerPlugin):
    name = "dask-coro-store-writer"
    idempotent = True

    def __init__(self) -> None:
        self.worker: Any = None

    def setup(self, worker: Any) -> None:
        self.worker = worker

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if (finish != "memory" and finish != "error") or start not in _RAN:
            return
        worker = self.worker
        if worker is None:
            return
        root = worker_task_annotations(worker, key).get(RUN)
        if root is None:
            return
        if finish == "memory":
            found = local_data(worker, [key])
            if found is None:
                return
            value, error = found[0], False
        else:
            value, error = worker_task_error(worker, key), True
            if value is None or isinstance(value, CoroutineCancelledError):
                return
        try:
            store = store_of_settings()
        except Exception as e:  # said at the run's yields (the extension)
            logger.debug("dask_coro: %r not stored: %r", key, e)
            return
        if store is not None:
            WRITES.submit(_write, store, root, key, value, error)


def _write(store: Any, root: Any, key: Any, value: Any, error: bool) -> None:
    try:
        limit = _config.get_size("coro.durability.store-bytes")
    except ValueError as e:
        logger.warning("dask_coro: %s; the store is not bounded", e)
        limit = None
    if not BUDGET.room(store, root, limit):
        return  # computed again by a resume
    try:
        written = store.write_child(root, key, value, error, again=True)  # no look first: one PUT on S3
    except FileNotFoundError:
        BUDGET.ended(store, root)  # the run finished, or was forgotten, meanwhile
        return
    except Exception as e:
        logger.warning("dask_coro: the result of %r not stored in %s: %r", key, store.location, e)
        return
    BUDGET.wrote(store, root, written)


class StoreBudget:
    """``coro.durability.store-bytes``: per store and run, the bytes of the
    entries this process wrote; once they reach the bound, the run's next
    children are not stored. A resume replays a run from its start: the
    first children stored are the ones it reuses first, and for a loop
    (each step needing the one before) a resume computes as many children
    again whichever ones were kept. Any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[tuple[str, Any], int] = {}

    def room(self, store: Any, root: Any, limit: int | None) -> bool:
        """Whether a child of ``root`` may be stored (below ``limit``)."""
        if limit is None:
            return True
        with self.lock:
            return self.runs.get((store.location, root), 0) < limit

    def wrote(self, store: Any, root: Any, nbytes: int) -> None:
        if nbytes:
            name = (store.location, root)
            with self.lock:
                self.runs[name] = self.runs.get(name, 0) + nbytes

    def ended(self, store: Any, root: Any) -> None:
        with self.lock:
            self.runs.pop((store.location, root), None)


BUDGET = StoreBudget()
