"""Durable runs' hooks into the runtime (``runtime/extensions.py``).

With ``coro.durability.store`` set, every coroutine tree is a durable run,
named by its root's key. A run's children carry the root's key (``RUN``),
so the writer (``worker.py``, installed on every worker before the first
coroutine runs) stores each one's value or error as it finishes. A run
lists what its root's run stored when it starts, off the loop (a batched
store's batches read then, together); before a yield's tasks are sent,
those stored are given as values (``supplied``), never computed again. A root whose run finished gets its stored value and
its body never runs; one that returns stores its value and drops its
children; one that raises keeps them, for a run again. Either first has
every worker write (or drop) its open batches of the run (``writes.py``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from ..core.engine import Raised, Returned
from ..runtime.extensions import Extension, Run, register
from .local import READS, RUN, store_of_settings
from .store import Found, Store, token_of

logger = logging.getLogger("dask_coro")


class _Note:
    """What the extension keeps per run (``run.notes["durable"]``)."""

    __slots__ = ("error", "given", "groups", "listing", "root", "store", "top")

    def __init__(self, root: Any, top: bool, store: Store | None, error: Exception | None):
        self.root = root
        self.top = top  # the root of the tree
        self.store = store
        self.error = error  # the store could not be opened: raised at each yield
        self.given = False  # its own outcome came from the store
        self.listing: asyncio.Future[tuple[Found | None, set[str]]] | None = None
        self.groups: dict[int, Any] = {}  # its groups' deliveries, by number (``order.GroupLog``)


def _listing(store: Store, root: Any, top: bool) -> tuple[Found | None, set[str]]:
    """A root's stored result if it finished (else the run is running from
    now), and the children stored for it."""
    if top:
        meta = store.meta(root) or {}
        found = store.result(root, meta)
        if found is not None:
            return found, set()
        store.started(root, meta)
    return None, store.stored_children(root)


class DurableRunsExtension(Extension):
    name = "durable"
    setting = "coro.durability.store"
    what = "stores each child's result for a durable run"
    at_first_use = True

    def worker_plugin(self) -> Any:
        from .worker import StoreWriter

        return StoreWriter()

    def run_started(self, run: Run) -> None:
        given = run.annotations().get(RUN)
        top = given is None
        root = run.key if top else given
        try:
            store = store_of_settings()
            error = None
        except Exception as e:
            store, error = None, e
        note = run.notes[self.name] = _Note(root, top, store, error)
        if store is not None:
            note.listing = run.loop.run_in_executor(READS, _listing, store, root, top)

    def annotations(self, run: Run) -> dict[str, Any] | None:
        note = run.notes.get(self.name)
        return None if note is None else {RUN: note.root}

    async def submitting(self, run: Run, client: Any, graph: dict[Any, Any]) -> list[Any]:
        note = run.notes.get(self.name)
        if note is not None and note.error is not None:
            raise note.error
        return []

    async def supplied(self, run: Run, keys: list[Any]) -> dict[Any, Any]:
        note: _Note | None = run.notes.get(self.name)
        if note is None or note.listing is None or note.store is None:
            return {}
        try:
            own, names = await asyncio.shield(note.listing)
        except Exception as e:
            logger.warning("dask_coro: the store %s could not be read: %r", note.store.location, e)
            note.listing = None
            return {}
        if keys == [run.key]:
            if own is None:
                return {}
            note.given = True
            return {run.key: Raised(own.value) if own.error else Returned(own.value)}
        store = note.store
        hits = [k for k in keys if store.child_name(k) in names and token_of(k) is not None]
        if not hits:
            return {}
        found = await run.loop.run_in_executor(READS, store.get_children, note.root, hits)
        return {k: Raised(f.value) if f.error else Returned(f.value) for k, f in found.items()}

    def computing(self, key: Any) -> None:
        if "distributed" not in sys.modules:
            return  # no Client to reconnect
        from .client import computing

        computing(key)

    async def run_ended(self, run: Run, outcome: Any) -> None:
        note: _Note | None = run.notes.get(self.name)
        if note is None or not note.top or note.given or note.store is None or outcome is None:
            return
        if note.listing is not None and not note.listing.done():
            await asyncio.wait([note.listing])
        store = note.store
        if store.batched:
            # Every worker's open batches of the run written first (the run
            # failed: its store complete for a run again) or dropped (it
            # finished: nothing of it lands after its children are deleted).
            from .writes import flush_everywhere

            await flush_everywhere(run.client, note.root, drop=type(outcome) is Returned)
        if type(outcome) is Returned:
            await run.loop.run_in_executor(READS, store.finished, note.root, outcome.value)
        else:
            await run.loop.run_in_executor(READS, store.failed, note.root)


DURABLE_RUNS = register(DurableRunsExtension())
