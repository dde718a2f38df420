"""Scheduler side of inline execution: how many more tasks the cluster could
start right now, for workers deciding whether to hand inline work out."""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .._internals.distributed_private import add_handlers, idle_threads

NAME = "dask-coro-inline"


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
        add_handlers(scheduler, rpc={"dask_coro_idle": self.handle_idle})

    def handle_idle(self) -> int:
        return idle_threads(self.scheduler)
