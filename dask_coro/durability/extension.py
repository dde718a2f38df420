"""Durability's hooks into the runtime (``runtime/extensions.py``).

With ``coro.durability.hold-children``: the first coroutine on each worker
installs ``DurablePlugin``; every child a coroutine submits carries its key
(the runtime's ``PARENT``: ``parent``), for which the plugin holds it; and a run let go
of because its worker closes says so (``RUN_LEFT``) on its client's stream,
ahead of its releases, so the plugin keeps its children for the re-run (a
killed worker's client sends nothing).
"""

from __future__ import annotations

import logging
from typing import Any

from ..runtime.extensions import Extension, Run, register

logger = logging.getLogger("dask_coro")


class DurableExtension(Extension):
    name = "durability"
    setting = "coro.durability.hold-children"
    what = "holds children for a coroutine re-run"
    at_first_use = True
    parent = True
    keeper = "dask-coro-durable"  # DurablePlugin.keeps: held for their coroutine

    def scheduler_plugin(self) -> Any:
        from .scheduler import DurablePlugin

        return DurablePlugin()

    def run_left(self, run: Run) -> None:
        from .._internals.distributed.client import send_on_client_stream
        from .._internals.distributed.worker import worker_is_closing
        from .scheduler import RUN_LEFT

        client = run.client
        if client is None or not worker_is_closing(run.worker):
            return
        try:
            send_on_client_stream(client, {"op": RUN_LEFT, "key": run.key, "address": run.worker.address})
        except Exception as e:  # the client closed first: it sends no release either
            logger.debug("coroutine %r: %s not sent: %r", run.key, RUN_LEFT, e)


DURABLE = register(DurableExtension())
