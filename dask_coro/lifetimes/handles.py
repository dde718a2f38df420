"""Whether shared arrays unpickle as handles here (pure)."""

from __future__ import annotations

from contextvars import ContextVar

#: Set while a scheduler deserializes a task graph (see
#: ``lifetimes.scheduler.keep_handles``): the scheduler only passes task
#: arguments on, so a shared array's handle stays a handle, mapping nothing.
shm_as_handles: ContextVar[bool] = ContextVar("dask_coro.shm_as_handles", default=False)

#: While a worker answers ``get_data``: the host of the worker asking for the
#: data (``who``; for a client, the host its connection comes from). A shared
#: array sent to another host travels as a copy of its bytes (see
#: ``lifetimes.shm``). None elsewhere: the array travels as a handle.
recipient_host: ContextVar[tuple[str, str] | None] = ContextVar("dask_coro.recipient_host", default=None)
