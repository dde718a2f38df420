"""``StreamPlugin``: tells a stream's consumer of its producer's items, and
its producer of what the consumer took.

A producer's worker stores each item it emits in its own memory, and
publishes it here on its stream to the scheduler (``PUBLISH``, ordered with
the producer's task-finished), which makes it a key the scheduler knows
(``Scheduler.update_data``, as ``Client.scatter`` does from inside a task),
held on behalf of a scheduler-side client named after the producer until
the consumer asks for a later item. The consumer asks for the items from
``index`` (``dask_coro_stream_next``), and waits here, without a thread,
until one is published or the producer's task ended. A producer with
``buffer`` items not taken waits here (``dask_coro_stream_room``) until the
consumer asks for the next one, or the producer's task is released (its
consumer let go of it: it is being cancelled).

The dashboard's Coroutines page shows each stream's items published and
taken: told to the tree's plugin (``TreePlugin.stream_progress``), in
process, as they change, when the tree is on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from distributed.comm.addressing import get_address_host
from distributed.diagnostics.plugin import SchedulerPlugin

from .._exceptions import DaskCoroError, StreamReplayInconsistentError
from .._internals.distributed.core import add_handlers
from .._internals.distributed.scheduler import (
    drop_client_state,
    fail_task,
    scheduler_plugin,
    send_to_worker,
)
from ..diagnostics.scheduler import NAME as TREE
from .book import ANNOTATION, ENDED, PUBLISH, Replay, StreamBook, item_key

logger = logging.getLogger("dask_coro")


#: Items a consumer took are let go of in batches of this many, or this many
#: seconds after the first of a batch.
LET_GO_BATCH = 4
LET_GO_DELAY = 0.02


def _holder(producer: Any) -> str:
    return f"dask-coro-stream-{producer}"


class StreamPlugin(SchedulerPlugin):
    name = "dask-coro-streams"

    def __init__(self) -> None:
        self.books: dict[Any, StreamBook] = {}
        self.changed: dict[Any, asyncio.Event] = {}
        self.scheduler: Any = None
        #: Items taken, by producer, not let go of yet (``_let_go``).
        self.letting: dict[Any, list[Any]] = {}
        self._flushing: asyncio.TimerHandle | None = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        add_handlers(
            scheduler,
            rpc={
                "dask_coro_stream_publish": self.publish,
                "dask_coro_stream_next": self.next,
                "dask_coro_stream_room": self.room,
            },
            stream={PUBLISH: self.publish},
        )

    def _book(self, key: Any) -> StreamBook:
        """The book of producer ``key``, made on first use (a consumer may ask
        before the producer's graph, sent on another stream, arrives)."""
        book = self.books.get(key)
        if book is None:
            book = self.books[key] = StreamBook(key)
            ts = self.scheduler.tasks.get(key)
            if ts is not None and ts.state in ENDED:
                book.ended = ts.state
        return book

    def _running_book(self, key: Any) -> StreamBook | None:
        """The book of a producer whose run sends (it publishes, it waits for
        room), None if the scheduler forgot it: its consumer let go of it,
        and the run has not heard yet. A book made then would never be
        dropped: no transition of the key follows."""
        return self._book(key) if key in self.scheduler.tasks else self.books.get(key)

    def _wake(self, key: Any) -> None:
        ev = self.changed.pop(key, None)
        if ev is not None:
            ev.set()

    async def _changed(self, key: Any) -> None:
        ev = self.changed.get(key)
        if ev is None:
            ev = self.changed[key] = asyncio.Event()
        await ev.wait()

    def _drop(self, worker: str, key: Any, index: int, shared: list[str] | None) -> None:
        """Let go of a re-run's copy of an item that is not published."""
        send_to_worker(
            self.scheduler, worker,
            {"op": "remove-replicas", "keys": [item_key(key, index)], "stimulus_id": "dask-coro-stream-replayed"},
        )
        self._hand_over(shared, key, None, worker)

    def _hand_over(self, shared: list[str] | None, key: Any, to: Any, worker: str) -> None:
        """The segments an item holds, tied to its producer's key ``key`` when
        it made them, are tied to the item's key ``to`` instead (None: let go
        of, the item is not published)."""
        if not shared:
            return
        from ..lifetimes.scheduler import NAME

        lifetimes = scheduler_plugin(self.scheduler, NAME)
        if lifetimes is None:  # pragma: no cover - the producer tied them through it
            logger.warning("stream %r: no lifetimes plugin to hand segments %s to", key, shared)
            return
        lifetimes.hand_over(shared, key, to, worker)

    def _progress(self, key: Any, book: StreamBook) -> None:
        """Tell the dashboard's plugin what ``key``'s stream published and
        its consumer took (no plugin: the tree is off)."""
        tree = scheduler_plugin(self.scheduler, TREE)
        if tree is None:
            return
        ts = self.scheduler.tasks.get(key)
        ann = ts.annotations.get(ANNOTATION) if ts is not None and ts.annotations else None
        buffer = ann.get("buffer") if isinstance(ann, dict) else None
        tree.stream_progress(key, book.published, book.taken, buffer)

    def _let_go(self, producer: Any, keys: list[Any], now: bool = False) -> None:
        """Let go of items taken: in batches of ``LET_GO_BATCH`` (each let go
        of costs its producer's worker a free-keys message, its answer, and a
        release call per segment), or ``LET_GO_DELAY`` after the first."""
        pending = self.letting.setdefault(producer, [])
        pending.extend(keys)
        if now or len(pending) >= LET_GO_BATCH:
            self._flush(producer)
        elif pending and self._flushing is None:
            self._flushing = asyncio.get_running_loop().call_later(LET_GO_DELAY, self._flush_all)

    def _flush(self, producer: Any) -> None:
        keys = self.letting.pop(producer, None)
        if keys:
            self.scheduler.client_releases_keys(keys=keys, client=_holder(producer), stimulus_id="dask-coro-stream-taken")
            drop_client_state(self.scheduler, _holder(producer))

    def _flush_all(self) -> None:
        self._flushing = None
        for producer in list(self.letting):
            self._flush(producer)

    # -- handlers ----------------------------------------------------------------

    def publish(
        self, key: Any, index: int, token: str, nbytes: int, worker: str, value: bytes | None = None,
        shared: list[str] | None = None,
    ) -> None:
        """Item ``index`` of ``key`` is in ``worker``'s memory (on the
        worker's stream, before the producer's task-finished), holding the
        shared-memory segments ``shared``, tied to ``key``: they go with the
        item's key from now on. An item an earlier run of the producer
        published is let go of on that worker; one that differs fails the
        producer."""
        book = self._running_book(key)
        if book is None:  # its consumer let go of it: nobody takes the item
            self._drop(worker, key, index, shared)
            return
        try:
            new = book.publish(index, token)
        except (Replay, ValueError) as e:
            error = StreamReplayInconsistentError(str(e)) if isinstance(e, Replay) else DaskCoroError(str(e))
            ts = self.scheduler.tasks.get(key)
            if ts is not None and ts.state == "processing":
                fail_task(self.scheduler, key, error, "dask-coro-stream-replay")
            self._drop(worker, key, index, shared)
            return
        if not new and index in book.held:
            ts = self.scheduler.tasks.get(book.held[index])
            # Published by a run whose worker died before the consumer took
            # it: this run's copy replaces the lost one.
            new = ts is None or not ts.who_has
        if not new:
            self._drop(worker, key, index, shared)
            return
        ik = book.held[index]
        if value is not None:
            book.values[index] = value
        self.scheduler.update_data(who_has={ik: [worker]}, nbytes={ik: nbytes}, client=_holder(key))
        if shared:
            book.hosts[index] = get_address_host(worker)
            self._hand_over(shared, key, ik, worker)
        self._progress(key, book)
        self._wake(key)

    async def next(
        self, key: Any, index: int, client: str | None = None, keep: list[int] | None = None,
        host: str | None = None,
    ) -> dict[str, Any]:
        """The keys of the items of ``key`` from ``index`` on, once there is
        one; else how the producer ended. With ``client``, that client
        wants the keys given (it holds them as futures). The items before
        ``index`` are let go of but those in ``keep`` (the consumer's body
        may still hold their shared memory: it says so at its next request).
        ``host``: the consumer's, to which items holding shared memory
        published there ride along."""
        book = self._book(key)
        if index < book.taken:
            # A consumer run again (its worker died) asks for items an
            # earlier run took, let go of since (holding every item taken
            # would make a stream's memory unbounded): its producer runs
            # again from its first item, under a key of its own.
            return {"keys": [], "ended": None, "values": None, "restart": book.taken}
        taken = book.taken
        self._let_go(key, book.take(index, keep or ()))
        if book.taken != taken:
            self._progress(key, book)
        self._wake(key)  # a producer waiting for room
        while True:
            ready = book.ready(index)
            if ready or book.ended is not None:
                if ready and client is not None:
                    self.scheduler.client_desires_keys(keys=ready, client=client)
                small = book.small(index, len(ready), host)
                return {"keys": ready, "ended": None if ready else book.ended, "values": small}
            await self._changed(key)

    async def room(self, key: Any, index: int, buffer: int) -> dict[str, Any]:
        """Once the producer may publish item ``index``: how many the
        consumer took; ``gone`` if the producer's task left processing."""
        book = self._running_book(key)
        if book is None:
            return {"taken": index, "gone": True}
        try:
            while True:
                if book.room(index, buffer):
                    return {"taken": book.taken, "gone": False}
                ts = self.scheduler.tasks.get(key)
                if ts is None or ts.state != "processing":
                    return {"taken": book.taken, "gone": True}
                book.blocked = index
                await self._changed(key)
        finally:
            book.blocked = None

    # -- hooks ---------------------------------------------------------------

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        book = self.books.get(key)
        if book is None:
            return
        if finish in ENDED:
            book.ended = finish
        elif start == "processing":
            book.ended = None  # released: run again (its worker died) or cancelled
        if finish in ENDED or start == "processing":
            tree = scheduler_plugin(self.scheduler, TREE)
            if tree is not None:
                tree.stream_ended(key, book.ended)
        if finish == "forgotten":
            del self.books[key]
            self._let_go(key, book.let_go(), now=True)
        self._wake(key)
