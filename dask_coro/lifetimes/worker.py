"""Worker side of lifetimes: the worker plugin.

It runs the releases the scheduler hands out (from the host's ``registry``),
and ties the ids a finished task's result holds (shared-memory arrays) to
that task's key.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from dask.typing import Key
from distributed.comm.addressing import get_address_host
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.utils import offload

from .._config import get_timedelta
from .._internals.distributed.core import add_handlers, wrap_rpc_handler
from .._internals.distributed.worker import (
    as_worker,
    fast_memory_value,
    scheduler_stream_open,
    send_on_worker_stream,
    worker_is_closing,
)
from .handles import recipient_host
from .registry import (
    file_name,
    registry_dir,
    release_cluster,
    remove_record,
    run_record,
    write_record,
)

logger = logging.getLogger("dask_coro")

NAME = "dask-coro-lifetimes"


class LifetimesWorkerPlugin(WorkerPlugin):
    """Runs releases the scheduler hands out, and ties the ids a finished
    task's result holds (shared-memory arrays) to that task's key."""

    name = NAME

    def __init__(self, token: str | None = None) -> None:
        self.token = token  # the scheduler's id, names this cluster's registry
        self.worker: Any = None
        # ids this worker has told the scheduler a key ties (drops duplicates)
        self.sent_ties: dict[Key, set[str]] = {}

    def ready(self) -> bool:
        """Set up on its worker, with its cluster's registry. A task's thread
        may find it in ``Worker.plugins`` before its ``setup`` ran:
        ``Worker.plugin_add`` stores it first, then sets it up on the event
        loop."""
        return self.token is not None and self.worker is not None

    def setup(self, worker: Any) -> None:
        self.worker = worker
        add_handlers(worker, rpc={"dask_coro_release": self.release})
        # Shared arrays sent to another host travel as bytes (lifetimes.shm).
        wrap_rpc_handler(worker, "get_data", _naming_the_recipient(worker), mark="_dask_coro_recipient")

    async def teardown(self, worker: Any) -> None:
        # The release handler stays: a closing worker is still on the
        # scheduler's list and may be handed a release until it has left (a
        # replacing plugin's setup takes the handler over).
        if not worker_is_closing(worker):
            return  # replaced by a new registration, not closing
        # Read outside the try: a bad setting is an error, not a slow scheduler.
        timeout = get_timedelta("coro.lifetimes.leave-timeout")
        if not scheduler_stream_open(worker):
            # The scheduler is gone (its stream broke, which is why we close):
            # nobody will name our releases. If nothing listens at its address
            # any more, run what this host's registry owes for it, and go.
            if self.token is not None:
                rids = await offload(release_cluster, self.token)
                if rids:
                    logger.info("scheduler of %s gone: ran %d releases", worker.address, len(rids))
            return
        # Worker.close tears plugins down while the scheduler still reaches
        # us: if we are the last worker of this host, run its releases now.
        try:
            rids = await asyncio.wait_for(
                worker.scheduler.dask_coro_lifetimes_leaving(worker=worker.address),
                timeout,
            )
        except Exception as e:  # scheduler gone or too slow: they wait for a worker
            logger.info("closing worker %s could not ask for releases: %r", worker.address, e)
            return
        if rids:
            await self.release(rids)

    # -- registry ------------------------------------------------------------

    def _path(self, rid: str) -> str:
        assert self.token is not None
        return os.path.join(registry_dir(self.token), file_name(rid))

    def record(self, rid: str, release: Callable[[str], object]) -> bool:
        """Write ``release`` for ``rid`` on this host; answers whether it is new."""
        return write_record(self._path(rid), self.worker.scheduler.address, rid, release)

    def forget_record(self, rid: str) -> None:
        remove_record(self._path(rid))

    async def release(self, rids: list[str]) -> None:
        # get_worker() works in a release, as in a task (offload copies the
        # context).
        with as_worker(self.worker):
            await offload(self._release_all, rids)  # one thread hop for a batch

    def _release_all(self, rids: list[str]) -> None:
        for rid in rids:
            try:
                self._release_one(rid)
            except Exception:  # the others are released all the same
                logger.exception("release of %r failed on %s", rid, self.worker.address)

    def _release_one(self, rid: str) -> None:
        # Nothing recorded: released already by a worker that died before
        # acknowledging, or tied on a host whose registry we cannot see.
        if run_record(self._path(rid), rid, self.worker.address) is None:
            logger.debug("release of %r: nothing recorded on this host", rid)

    # -- results that hold resources -----------------------------------------

    def transition(self, key: Key, start: str, finish: str, **kwargs: Any) -> None:
        # A result computed here, or fetched from another worker (it may hold
        # this host's copy of another host's shared array: shm._host_copy).
        if finish == "memory" and start in ("executing", "long-running", "flight"):
            shm = sys.modules.get("dask_coro.lifetimes.shm")
            if shm is None or not shm.any_attached():
                return
            value = fast_memory_value(self.worker, key)
            rids = shm.segments_in(value) - self.sent_ties.get(key, set())
            if rids:
                self.sent_ties.setdefault(key, set()).update(rids)
                # Ordered before this task's task-finished message, which the
                # worker sends after its transition hooks ran
                # (WorkerState._transition -> _notify_plugins, then
                # Worker._handle_instructions).
                send_on_worker_stream(
                    self.worker, {"op": "dask-coro-tie", "rids": sorted(rids), "key": key}
                )
        elif finish in ("released", "forgotten"):
            self.sent_ties.pop(key, None)


def _naming_the_recipient(worker: Any) -> Callable[[Any], Any]:
    """Wraps ``Worker.get_data``, which serializes what it sends while it
    runs: the data's serializers learn which host asks (``who``, the asking
    worker's address; a client's connection otherwise). A shared array goes
    to each other host once (``shm.sending_to``)."""

    def wrap(get_data: Any) -> Any:
        async def get_data_naming_the_recipient(
            comm: Any, keys: Any = (), who: str | None = None, **kwargs: Any
        ) -> Any:
            here = get_address_host(worker.address)
            to = get_address_host(who or comm.peer_address)
            token = recipient_host.set((here, to))
            shm = sys.modules.get("dask_coro.lifetimes.shm")
            try:
                if to == here or shm is None or not shm.any_attached():
                    return await get_data(comm, keys=keys, who=who, **kwargs)
                if who is None:  # a client: it gets a plain array
                    return await get_data(comm, keys=keys, who=who, **kwargs)
                held = [(k, s) for k in keys for s in shm.segments_held(fast_memory_value(worker, k))]
                sending = shm.sending_to(held, to)
                if not sending.claim():
                    return {"status": "busy"}  # distributed's answer: later, or elsewhere
                out: Any = None
                try:
                    out = await get_data(comm, keys=keys, who=who, **kwargs)
                    return out
                finally:
                    # Status.dont_reply: written, and the asking worker said
                    # "OK" once it had deserialized it (its host's copy exists);
                    # a dict is distributed's own "busy".
                    sending.done(sent=out is not None and not isinstance(out, dict))
            finally:
                recipient_host.reset(token)

        return get_data_naming_the_recipient

    return wrap
