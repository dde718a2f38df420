"""The runtime: the call object and the runners that run it.

``call`` makes a coroutine call a lazy ``Delayed`` and puts a ``CoroutineTask``
in the graph; ``worker`` runs it on a distributed worker's event loop (steps
on the thread pool, one message per yield, no thread held while waiting);
``local`` runs it in-process under any other scheduler; ``scheduler`` tells
workers running calls inline how many threads are idle. The runners are
injected into ``CoroutineTask`` here, so the call object imports no runner.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from ..core.engine import Request
from .aio import in_task
from .call import CoroutineTask
from .local import run_local


def _run_on_worker(task: CoroutineTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The worker runner's coroutine when called on a distributed worker's
    event loop, else None."""
    if sys.modules.get("distributed") is None:  # not imported, or blocked: no worker
        return None
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    # Imported here, not above: importing dask_coro does not import distributed.
    from .worker import run_if_on_worker

    return run_if_on_worker(task, args, kwargs)


CoroutineTask.runners = (_run_on_worker, run_local)
Request.in_task = in_task
