"""Task context: which key is running here (pure but for a look at
distributed's own task context, when distributed is loaded)."""

from __future__ import annotations

import asyncio
import sys
import weakref
from contextvars import ContextVar
from typing import Any

from dask.typing import Key

from ._exceptions import NotInTaskError

#: Set inside the context every coroutine step runs in (worker and local driver).
running_key: ContextVar[Key] = ContextVar("dask_coro.running_key")


def current_key() -> Key:
    """The key of the task running this code.

    Works in ``@coroutine`` bodies (generator and ``async def``, on a worker or
    in the in-process driver), in ordinary tasks on a distributed worker's
    thread pool, and in a plain ``async def`` task on a worker when it is the
    only async task executing there.

    Raises
    ------
    NotInTaskError
        Outside of a task, or where the key cannot be told apart.
    """
    key = running_key.get(None)
    if key is not None:
        return key
    if sys.modules.get("distributed") is not None:  # else no task of distributed runs here
        from distributed.worker import get_worker

        from ._internals.distributed.worker import thread_task_key
        from ._internals.distributed.worker_state_machine import async_tasks_executing

        key = thread_task_key()
        if key is not None:
            return key
        try:
            worker = get_worker()
        except ValueError:
            pass
        else:
            # An async task runs on the event loop, where distributed sets no
            # key (Worker.execute -> _run_task_async). If it is the only async
            # task executing, it is us.
            async_keys = async_tasks_executing(worker)
            if len(async_keys) == 1:
                return async_keys[0]
            if async_keys:
                raise NotInTaskError(
                    f"current_key() cannot tell which of {len(async_keys)} async tasks "
                    "executing on this worker is calling it; decorate the function "
                    "with @dask_coro.coroutine, which always knows its key"
                )
    raise NotInTaskError(
        "current_key() was called outside of a task; call it from a @coroutine "
        "body or from a function running as a task on a distributed worker"
    )


#: Set inside the context every coroutine step runs in, by its runner:
#: ``gather_in_task(value)`` computes ``value`` for an ``await
#: dask_coro.gather(value)`` that an asyncio Task the body made drives (a
#: body's ``asyncio.wait_for``), and gives an asyncio future of the running
#: loop for it (``runtime.aio.in_task``). Tasks copy the context they are made in.
gather_in_task: ContextVar[Any] = ContextVar("dask_coro.gather_in_task")


#: The event loops coroutine bodies step on (a worker's lanes, a thread's
#: loop for local runs: runtime.lanes, runtime.aio). A step is a body's own
#: code, which may block its thread as a task's may: not a loop to keep free.
body_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def on_event_loop() -> bool:
    """Whether an asyncio event loop runs in this thread (where waiting would
    block it), other than a coroutine body's own."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return loop not in body_loops
