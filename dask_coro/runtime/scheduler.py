"""Scheduler side of inline execution: how many more tasks the cluster could
start right now, for workers deciding whether to hand inline work out."""

from __future__ import annotations

import math
from typing import Any

from distributed.core import Status
from distributed.diagnostics.plugin import SchedulerPlugin

NAME = "dask-coro-inline"


def idle_threads(scheduler: Any) -> int:
    """Free threads on running workers, less the tasks already waiting for one.

    A seceded (long-running) task holds no thread, as in distributed's own
    ``_task_slots_available``. With queuing on, ``Scheduler.idle_task_count``
    holds exactly the workers that have a free slot; else look at them all."""
    if math.isinf(scheduler.WORKER_SATURATION):
        workers = scheduler.workers.values()
    else:
        workers = scheduler.idle_task_count
    free = 0
    for ws in workers:
        if ws.status == Status.running:
            free += max(0, ws.nthreads - (len(ws.processing) - len(ws.long_running)))
    return max(0, free - len(scheduler.queued) - len(scheduler.unrunnable))


class InlinePlugin(SchedulerPlugin):
    """Answers ``dask_coro_idle`` for workers running coroutines inline.

    Installed by the first worker that runs a coroutine inline (one round
    trip), by ``client.register_plugin(InlinePlugin())`` or by
    ``dask scheduler --preload dask_coro``; installing it again is a no-op."""

    name = NAME
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers["dask_coro_idle"] = self.handle_idle

    def handle_idle(self) -> int:
        return idle_threads(self.scheduler)
