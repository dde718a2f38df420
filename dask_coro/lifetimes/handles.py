"""Whether shared arrays unpickle as handles here (pure)."""

from __future__ import annotations

from contextvars import ContextVar

#: Set while a scheduler deserializes a task graph (see
#: ``lifetimes.scheduler.keep_handles``): the scheduler only passes task
#: arguments on, so a shared array's handle stays a handle, mapping nothing.
shm_as_handles: ContextVar[bool] = ContextVar("dask_coro.shm_as_handles", default=False)
