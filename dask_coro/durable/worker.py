"""The writer: each child of a durable run stored as it finishes, on the
worker that computed it.

``StoreWriter`` (a worker plugin, on every worker) sees each task's
transition from executing to memory or error on the worker's event loop; a
task annotated with its run's root (``RUN``, by the extension) has its value
(or error) written to the store by a thread of ``WRITES``, on its own or in
its run's next batch (``writes.py``): neither the event loop nor a body's
thread waits for the store.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .._exceptions import CoroutineCancelledError
from .._internals.distributed.worker_state_machine import (
    local_data,
    worker_task_annotations,
    worker_task_error,
    worker_task_gives_data,
)
from .local import RUN, WRITES, store_of_settings
from .writes import BATCHES, FLUSH_TIMEOUT, window, write

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
        if root is None or worker_task_gives_data(worker, key):
            return  # no run's, or a value given from the store (a resume): stored already
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
        if store is None:
            return
        wait = window() if store.batched else 0.0
        if wait > 0:
            BATCHES.add(store, root, key, value, error, wait)
        else:
            WRITES.submit(write, store, root, key, value, error)

    async def teardown(self, worker: Any) -> None:
        """A worker that closes writes its open batches first (within ``FLUSH_TIMEOUT``)."""
        if BATCHES.waiting():
            try:
                await asyncio.wait_for(asyncio.wrap_future(BATCHES.flush()), FLUSH_TIMEOUT)
            except asyncio.TimeoutError:
                logger.warning("dask_coro: entries of durable runs not all stored as the worker closed")
