"""Scheduler side of lifetimes: feeds the pure ``Ledger`` from scheduler events
and hands owed releases to workers.

The scheduler keeps ids, keys, hosts and worker addresses, nothing else: a
release callable never reaches it (workers keep them, see
``_lifetimes_worker``), so it never deserializes user code for this.

Messages:

- ``dask_coro_tie`` (RPC from a worker, answered): ids, one key. Answers
  whether the key was alive; a dead key's tie releases at once.
- ``dask-coro-tie`` (worker's batched stream): ids a finished task's result
  holds. The worker sends it from its ``transition`` hook, so it reaches us
  before that task's ``task-finished`` and therefore before the dependencies
  that handed the ids over can be forgotten.
- ``dask_coro_release`` (RPC to a worker): run these releases; the answer
  acknowledges them.
- ``dask_coro_lifetimes_leaving`` (RPC from a closing worker): answered with
  the releases it must run before it goes, if it is its host's last worker.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from dask.typing import Key
from distributed.comm import get_address_host
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.protocol.pickle import dumps

from .._config import get_timedelta
from .._internals.distributed.core import add_handlers, wrap_stream_handler
from .._internals.distributed.scheduler import store_worker_plugin
from .handles import shm_as_handles
from .ledger import Ledger, Origin
from .worker import LifetimesWorkerPlugin

logger = logging.getLogger("dask_coro")

NAME = "dask-coro-lifetimes"


class LifetimesPlugin(SchedulerPlugin):
    """Ties resources to keys and releases them when the last key is forgotten.

    Installed on first use by ``dask_coro.tie`` (and ``dask_coro.shm``), by
    ``client.register_plugin(LifetimesPlugin())``, or by
    ``dask scheduler --preload dask_coro``; installing it again is a no-op.
    ``start`` does not yield to the event loop, so two concurrent
    registrations cannot both install it (``Scheduler.register_scheduler_plugin``
    checks the name, then awaits ``start``, then adds the plugin).
    """

    name = NAME
    idempotent = True

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.scheduler: Any = None
        self._ready: asyncio.Future[None] | None = None
        self._dispatch_scheduled = False
        self._calls: set[asyncio.Task[None]] = set()
        self._warned_hosts: set[str] = set()
        self._leaving: set[str] = set()  # workers that said they are closing

    def keeps(self, key: Key, copy: bool) -> bool:
        """A key resources are tied to stays until the scheduler lets go of
        it, its copies too (``LifetimesExtension.keeper``: worker release asks)."""
        return self.ledger.ties(key)

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        add_handlers(
            scheduler,
            rpc={
                "dask_coro_tie": self.handle_tie,
                "dask_coro_lifetimes_ready": self.handle_ready,
                "dask_coro_lifetimes_leaving": self.handle_leaving,
            },
            stream={"dask-coro-tie": self.handle_result_ties},
        )
        keep_handles(scheduler)
        # Every worker, present and future, runs releases and ties results.
        # Stored before we yield so a worker joining meanwhile gets it too
        # (Scheduler.add_worker sends ``worker_plugins`` with its answer).
        plugin = dumps(LifetimesWorkerPlugin(token=scheduler.id))
        store_worker_plugin(scheduler, LifetimesWorkerPlugin.name, plugin)
        self._ready = asyncio.ensure_future(
            scheduler.broadcast(
                msg={"op": "plugin-add", "plugin": plugin, "name": LifetimesWorkerPlugin.name},
                on_error="ignore",  # a worker dying meanwhile gets it on its return
            )
        )

    async def before_close(self) -> None:
        """The scheduler is closing: every key goes. Hand out all releases to
        the workers still here and give them ``coro.lifetimes.close-timeout``
        to run."""
        self.ledger.forget_all()
        self._dispatch()
        if self._calls:
            timeout = get_timedelta("coro.lifetimes.close-timeout")
            await asyncio.wait(list(self._calls), timeout=timeout)

    async def close(self) -> None:
        for call in list(self._calls):
            call.cancel()

    # -- handlers ------------------------------------------------------------

    async def handle_ready(self) -> dict[str, str]:
        """Answers once every worker present at install time has our worker
        plugin, with the token naming this cluster's release registry."""
        assert self._ready is not None
        await asyncio.shield(self._ready)
        return {"token": self.scheduler.id}

    def handle_leaving(self, worker: str) -> list[str]:
        """``worker`` is closing. If no other worker of its host stays, it is
        the last one out and runs the host's releases itself (see
        ``Ledger.host_emptied``). Handled one at a time on the event loop, so
        of workers closing together exactly the last to ask takes them."""
        self._leaving.add(worker)
        ws = self.scheduler.workers.get(worker)
        host = ws.host if ws is not None else _host_of(worker)
        if any(
            other.host == host and address not in self._leaving
            for address, other in self.scheduler.workers.items()
        ):
            return []
        return self.ledger.host_emptied(host)

    def handle_tie(
        self, rids: list[str], key: Key | None, worker: str, host_bound: bool = False, spare: bool = False
    ) -> dict[str, bool]:
        if spare:  # tied to the worker itself (``shm.Spares``), while it is here
            key = spare_key(worker)
        assert key is not None
        alive = self._tie(list(rids), key, worker, host_bound)
        if not alive:  # tie() warns the caller; this is for the scheduler's log
            logger.info(
                "%s tied to key %r, which the scheduler has already forgotten; "
                "released now",
                list(rids),
                key,
            )
        return {"alive": alive}

    def handle_result_ties(self, rids: list[str], key: Key, worker: str) -> None:
        # Only shared-memory segments are found in results: host-bound.
        if not self._tie(rids, key, worker, host_bound=True):
            logger.warning(
                "the result of %r holds %s but that key was forgotten before it "
                "finished; released now",
                key,
                list(rids),
            )

    def hand_over(self, rids: list[str], old: Key, new: Key | None, worker: str) -> None:
        """Called on the scheduler by a feature: ``rids``, tied to ``old``,
        are tied to ``new`` instead (None: to no key, released unless another
        key holds them). A stream's producer ties the segments of its items
        to its own key before they exist, and hands each over to the item's
        key once published."""
        if new is not None:
            self._tie(list(rids), new, worker, host_bound=True)
        for rid in rids:
            self.ledger.untie(rid, old)
        if self.ledger.owed:
            self._dispatch_soon()

    def _tie(self, rids: list[str], key: Key, worker: str, host_bound: bool = False) -> bool:
        ws = self.scheduler.workers.get(worker)
        # A worker that has just left still tied these on its host.
        host = ws.host if ws is not None else _host_of(worker)
        alive = key in self.scheduler.tasks or (key == spare_key(worker) and worker in self.scheduler.workers)
        for rid in rids:
            self.ledger.tie(rid, key, Origin(host, worker, host_bound), key_alive=alive)
        if not alive:
            self._dispatch_soon()
        return alive

    # -- scheduler hooks -----------------------------------------------------

    def transition(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "forgotten" and self.ledger.ties(key):
            self.ledger.forget(key)
            self._dispatch_soon()
        elif finish in ("released", "erred") and self.ledger.ties(key):
            # The result left the cluster: shared memory holding it goes now,
            # though the key may stay known for long (an erred dependent's
            # future, kept alive by its own traceback, keeps it).
            self.ledger.data_gone(key)
            if self.ledger.owed:
                self._dispatch_soon()

    def restart(self, scheduler: Any) -> None:
        # Scheduler.restart clears task state without "forgotten" transitions.
        self.ledger.forget_all()
        self._dispatch_soon()

    def add_worker(self, scheduler: Any, worker: str) -> None:
        if self.ledger.owed:
            self._dispatch_soon()

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self._leaving.discard(worker)
        self.ledger.worker_left(worker)
        self.ledger.forget(spare_key(worker))  # its spare segments, released by another worker of its host
        self._dispatch_soon()

    # -- handing releases out ------------------------------------------------

    def _dispatch_soon(self) -> None:
        # Many keys are forgotten in one scheduler step; hand their releases
        # out together, one call per worker.
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        workers = {address: ws.host for address, ws in self.scheduler.workers.items()}
        for worker, rids in self.ledger.assign(workers).items():
            call = asyncio.ensure_future(self._release(worker, rids))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
        for host in self.ledger.waiting_hosts(workers) - self._warned_hosts:
            self._warned_hosts.add(host)
            logger.warning(
                "releases are owed on host %s, which has no worker now; they run "
                "when a worker on that host joins",
                host,
            )

    async def _release(self, worker: str, rids: list[str]) -> None:
        try:
            # Bounded: a call to a worker that has just joined in a dead one's
            # place was seen to hang, the release never handed to another.
            await asyncio.wait_for(
                self.scheduler.rpc(worker).dask_coro_release(rids=rids),
                get_timedelta("coro.lifetimes.close-timeout"),
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.ledger.failed(worker, rids)
            if worker in self.scheduler.workers:
                logger.info("releasing %s on %s failed (%r); retrying", rids, worker, e)
                # Between attempts to hand out a release whose call failed while
                # its worker stayed (say a worker without our plugin yet).
                await asyncio.sleep(get_timedelta("coro.lifetimes.retry-delay"))
            self._dispatch_soon()
        else:
            self.ledger.acknowledged(worker, rids)


def spare_key(worker: str) -> tuple[str, str]:
    """What a worker's spare segments (``shm.Spares``) are tied to: no
    task's key; forgotten once the worker leaves."""
    return ("dask-coro-spares", worker)


def keep_handles(scheduler: Any) -> None:
    """Make the scheduler deserialize task graphs with shared arrays left as
    handles. ``Scheduler.update_graph`` unpickles the graph inside the handler
    (``deserialize(expr_ser.header, expr_ser.frames)``), so a context variable
    set around it reaches ``shm._attach``; without this the scheduler would
    map every segment passed as a task argument, and keep it mapped as long
    as it keeps the message (its batched streams log recent messages)."""

    def wrap(handler: Any) -> Any:
        async def update_graph(**kwargs: Any) -> Any:
            token = shm_as_handles.set(True)
            try:
                return await handler(**kwargs)
            finally:
                shm_as_handles.reset(token)

        return update_graph

    wrap_stream_handler(scheduler, "update-graph", wrap, "_dask_coro_keeps_handles")


def _host_of(address: str) -> str:
    return get_address_host(address)
