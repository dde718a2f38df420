"""Scheduler side of durability: ``DurablePlugin``.

Children that finished are held as a ``Variable`` or ``Queue`` holds keys:
on behalf of a client of the plugin's own (``client_desires_keys``), here
one per parent, ``dask-coro-held-<parent>``, so they outlive the worker's
client that submitted them. When the parent ends (memory, erred, forgotten)
its children are let go of, on the next turn of the event loop (not inside a
transition).

A coroutine lost with its worker while it waited on its children was not
running code that could have killed the worker, so it should not count
toward ``distributed.scheduler.allowed-failures``. ``Scheduler.remove_worker``
counts every task that was processing on the lost worker before any plugin
hears of it, so the count is given ahead: while a parent has children with
work left (it waits), its ``suspicious`` count is one lower, and the lost
worker's increment takes that credit instead of failing it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from dask.typing import Key
from distributed.diagnostics.plugin import SchedulerPlugin

from .._internals import distributed_private as private
from ..diagnostics.scheduler import children_by_parent
from .book import HoldBook

logger = logging.getLogger("dask_coro")

NAME = "dask-coro-durable"
_ENDED = ("memory", "erred", "forgotten")


def holder(parent: Key) -> str:
    """The scheduler-side client that holds ``parent``'s children."""
    return f"dask-coro-held-{parent!r}"


class DurablePlugin(SchedulerPlugin):
    """Installed by the first coroutine that submits children on each worker
    (when ``coro.durability.hold-children`` is on), by
    ``client.register_plugin(DurablePlugin())`` or by
    ``dask scheduler --preload dask_coro``; installing it again is a no-op."""

    name = NAME
    idempotent = True

    def __init__(self) -> None:
        self.book = HoldBook()
        self.where: dict[Key, str] = {}  # parent -> address of the worker running it
        self.left: dict[Key, str] = {}  # parent -> the worker it last left
        self.credited: set[Key] = set()  # waiting parents, their suspicion given ahead
        self.forgiven = 0  # how many lost waiting parents were not counted
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def update_graph(
        self, scheduler: Any, *, annotations: dict[str, dict[Key, Any]] | None = None, **kwargs: Any
    ) -> None:
        for parent, keys in children_by_parent(annotations).items():
            ts = scheduler.tasks.get(parent)
            if ts is None or ts.state in _ENDED:
                continue  # a parent that ended meanwhile holds nothing
            self.book.adopt(parent, [k for k in keys if k in scheduler.tasks], self._state)
            if ts.processing_on is not None:
                self.where[parent] = ts.processing_on.address
            self._credit(parent)

    def transition(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        parent = self.book.moved(key, start, finish)
        if parent is not None:
            self._credit(parent)
        if start == "memory" and finish == "released":
            # Its data died with a worker: held no more, so that it is not
            # kept computing for nobody (a re-run yielding it asks anew). The
            # transitions reporting the loss have already recommended it
            # "waiting" (transition_memory_released: it was wanted), so it may
            # be sent to a worker once before this release gets there.
            parent = self.book.lost(key)
            if parent is not None:
                asyncio.get_running_loop().call_soon(self._let_go_of, parent, key)
        if finish == "memory":
            parent = self.book.finished(key)
            if parent is not None:
                # Held now, before the worker's client lets go of it.
                self.scheduler.client_desires_keys(keys=[key], client=holder(parent))
        if self.book.is_parent(key):
            if start == "processing" and key in self.where:
                # Where it last ran: remove_worker moves a lost worker's
                # tasks on before plugins hear of the loss.
                self.left[key] = self.where.pop(key)
            if finish == "processing":
                ws = self.scheduler.tasks[key].processing_on
                if ws is not None:
                    self.where[key] = ws.address
            elif finish in _ENDED:
                self.where.pop(key, None)
                self.left.pop(key, None)
                self._uncredit(key)
                children = self.book.end(key)
                asyncio.get_running_loop().call_soon(self._let_go, key, children)
        if finish == "forgotten":
            self.book.forget(key)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        for parent, address in list(self.left.items()):
            if address != worker:
                continue
            del self.left[parent]
            if parent in self.credited:
                # The lost worker's count took the credit: not counted.
                self.credited.discard(parent)
                ts = scheduler.tasks.get(parent)
                if ts is not None:
                    private.adjust_suspicion(ts, 0, prefix=-1)
                self.forgiven += 1
                self._credit(parent)  # still waiting on children of its own

    # -- helpers -------------------------------------------------------------

    def _state(self, key: Key) -> str | None:
        ts = self.scheduler.tasks.get(key)
        return None if ts is None else ts.state

    def _credit(self, parent: Key) -> None:
        """Give the count ahead while ``parent`` waits; take it back when not."""
        ts = self.scheduler.tasks.get(parent)
        if ts is None:
            self.credited.discard(parent)
            return
        if self.book.waiting(parent):
            if parent not in self.credited and ts.state not in _ENDED:
                self.credited.add(parent)
                private.adjust_suspicion(ts, -1)
        else:
            self._uncredit(parent)

    def _uncredit(self, parent: Key) -> None:
        if parent in self.credited:
            self.credited.discard(parent)
            ts = self.scheduler.tasks.get(parent)
            if ts is not None:
                private.adjust_suspicion(ts, 1)

    def _let_go_of(self, parent: Key, child: Key) -> None:
        s = self.scheduler
        ts = s.tasks.get(child)
        client = s.clients.get(holder(parent))
        if ts is None or client is None or ts not in client.wants_what:
            return
        if self.book.parent_of.get(child) == parent and child in self.book.held.get(parent, ()):
            return  # finished again meanwhile, and held again
        s.client_releases_keys(keys=[child], client=holder(parent), stimulus_id=f"dask-coro-lost-{parent}")

    def _let_go(self, parent: Key, children: list[Key]) -> None:
        s = self.scheduler
        client = holder(parent)
        if client not in s.clients:
            return
        keys = [k for k in children if k in s.tasks]
        if keys:
            s.client_releases_keys(keys=keys, client=client, stimulus_id=f"dask-coro-let-go-{parent}")
        private.drop_client_state(s, client)
