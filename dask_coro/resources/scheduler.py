"""Scheduler side: ``ResourcePlugin`` keeps ``WorkerState.used_resources``
in step with what waiting coroutines lent.

distributed counts a task's resources as used on its worker from the moment
it is processing there until it leaves processing (``acquire_resources``,
``release_resources``). A worker tells, on its stream, when a coroutine
lent them and took them back (``OP``); the plugin subtracts and adds them
again. A task that leaves processing while they are lent has them
subtracted a second time by distributed, which the plugin makes up for in
its ``transition`` hook. The count is what the dashboard's worker page
shows; placement reads the workers' totals, never it.
"""

from __future__ import annotations

import logging
from typing import Any

from dask.typing import Key
from distributed.diagnostics.plugin import SchedulerPlugin

from .._internals.distributed.core import add_handlers
from .._internals.distributed.scheduler import count_resources, processing_task

logger = logging.getLogger("dask_coro")

#: Stream op a worker sends: a coroutine lent (``lent`` true) or took back its resources.
OP = "dask-coro-resources"


class ResourcePlugin(SchedulerPlugin):
    name = "dask-coro-resources"
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None
        # Keys whose resources are lent: the WorkerState and what was lent.
        self.lent: dict[Key, tuple[Any, dict[str, float]]] = {}

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        add_handlers(scheduler, stream={OP: self.handle})

    def handle(
        self, key: Key, run_id: int, lent: bool, resources: dict[str, float],
        worker: str = "", **kwargs: Any,
    ) -> None:
        """``worker`` says the run ``run_id`` of ``key`` lent (or took back)
        ``resources``; a message of a stale run is ignored."""
        found = processing_task(self.scheduler, key, worker, run_id)
        if found is None:
            return
        _, ws = found
        if lent:
            if key in self.lent:
                return
            self.lent[key] = (ws, dict(resources))
            count_resources(self.scheduler, ws, resources, used=False)
        else:
            held = self.lent.pop(key, None)
            if held is not None:
                count_resources(self.scheduler, held[0], held[1], used=True)

    def transition(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start != "processing" or key not in self.lent:
            return
        # distributed released them as the task left processing
        # (Scheduler._exit_processing_common): they were lent, so count them
        # back, on the worker it released them from.
        ws, resources = self.lent.pop(key)
        count_resources(self.scheduler, ws, resources, used=True)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        for key in [k for k, (ws, _) in self.lent.items() if ws.address == worker]:
            del self.lent[key]
