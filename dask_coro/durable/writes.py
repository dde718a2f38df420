"""What a process writes to the store for its children (no distributed):
each entry on its own (a local directory), or the small entries of a run
written together, one batch per window (an fsspec URL, ``Store.batched``).

A child's entry is queued when its task finishes (``StoreWriter``); a
thread of ``WRITES`` pickles and writes it, so neither the event loop nor a
body's thread waits for the store. On a batched store, the entries a run's
children finish within ``coro.durability.store-batch-window`` of the first
are written as one object (one request), or sooner once ``BATCH_ENTRIES``
wait: an entry is stored once its batch is. A process killed meanwhile
loses the entries of its open window, and a resume computes those children
again. ``flush_run`` writes (or drops) a run's open windows at once: the
run's end asks it of every worker. A run that failed waits for its writes,
so that it has every child its workers finished stored for a run again. A
run that finished waits for none (its value does not wait for a gigabyte of
writes no resume will read): its open windows are dropped, and a write of it
still in flight deletes the run's children once it lands, so none is left
behind the run's end.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

from .. import _config
from .local import WRITES, stores
from .store import BATCH_ENTRIES, Store

logger = logging.getLogger("dask_coro")

#: How long a run's end waits for every worker's flush (``flush_run``).
FLUSH_TIMEOUT = 30.0


def write(store: Store, root: Any, key: Any, value: Any, error: bool) -> None:
    """Store a child's outcome now, an entry of its own (a thread of ``WRITES``)."""
    limit = _limit()
    if not BUDGET.room(store, root, limit):
        return  # computed again by a resume
    try:
        written = store.write_child(root, key, value, error, again=True)  # no look first: one PUT on S3
    except FileNotFoundError:
        BUDGET.ended(store, root)  # the run finished, or was forgotten, meanwhile
        return
    except Exception as e:
        logger.warning("dask_coro: the result of %r not stored in %s: %r", key, store.location, e)
        return
    BUDGET.wrote(store, root, written)


def write_batch(store: Store, root: Any, items: list[tuple[Any, Any, bool]]) -> None:
    """Store children's outcomes ``(key, value, error)`` together
    (``Store.write_children``; a thread of ``WRITES``)."""
    limit = _limit()
    entries = []
    for key, value, error in items:
        if not BUDGET.room(store, root, limit):
            break  # computed again by a resume
        try:
            parts = store.pack_child(key, value, error)
        except Exception as e:
            logger.warning("dask_coro: the result of %r not stored in %s: %r", key, store.location, e)
            continue
        if parts is not None:
            entries.append((key, parts))
            BUDGET.wrote(store, root, sum(memoryview(p).nbytes for p in parts))
    if not entries:
        return
    try:
        store.write_children(root, entries)
    except FileNotFoundError:
        BUDGET.ended(store, root)
    except Exception as e:
        keys = ", ".join(repr(k) for k, _ in entries)
        logger.warning("dask_coro: the results of %s not stored in %s: %r", keys, store.location, e)


def _limit() -> int | None:
    try:
        return _config.get_size("coro.durability.store-bytes")
    except ValueError as e:
        logger.warning("dask_coro: %s; the store is not bounded", e)
        return None


def window() -> float:
    """``coro.durability.store-batch-window`` in seconds."""
    try:
        return _config.get_timedelta("coro.durability.store-batch-window")
    except ValueError as e:
        logger.warning("dask_coro: %s; each entry is written on its own", e)
        return 0.0


class _Open:
    """A run's entries waiting for their batch, and when it is written."""

    __slots__ = ("due", "items")

    def __init__(self, due: float):
        self.due = due
        self.items: list[tuple[Any, Any, bool]] = []


class Batches:
    """Per process, the entries waiting to be written together, per store
    and run; a thread of its own hands each run's batch to ``WRITES`` when
    its window ends (and goes once none waits for a second). Any thread."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.open: dict[tuple[Store, Any], _Open] = {}
        self.writing: dict[tuple[Store, Any], int] = {}  # batches handed to WRITES, not written yet
        self.flushes: list[tuple[Any, Future[None]]] = []  # (root, or None for all; done once written)
        self.finished: set[tuple[Store, Any]] = set()  # runs that ended while a batch of theirs was written
        self.timer: threading.Thread | None = None

    def add(self, store: Store, root: Any, key: Any, value: Any, error: bool, window: float) -> None:
        name = (store, root)
        with self.cond:
            batch = self.open.get(name)
            if batch is None:
                batch = self.open[name] = _Open(time.monotonic() + window)
            batch.items.append((key, value, error))
            if len(batch.items) >= BATCH_ENTRIES:
                batch.due = 0.0
            if self.timer is None:
                self.timer = threading.Thread(target=self._run, name="dask-coro-store-batches", daemon=True)
                self.timer.start()
            elif batch.due == 0.0 or len(batch.items) == 1:
                self.cond.notify()

    def _run(self) -> None:
        idle = False
        while True:
            with self.cond:
                if not self.open:
                    if idle:
                        self.timer = None
                        return
                    idle = True
                    self.cond.wait(1.0)
                    continue
                idle = False
                now = time.monotonic()
                due = [name for name, batch in self.open.items() if batch.due <= now]
                if not due:
                    self.cond.wait(min(batch.due for batch in self.open.values()) - now)
                    continue
                ready = [(name, self.open.pop(name).items) for name in due]
                for name, _ in ready:
                    self.writing[name] = self.writing.get(name, 0) + 1
            for name, items in ready:
                WRITES.submit(self._write, name, items)

    def _write(self, name: tuple[Store, Any], items: list[tuple[Any, Any, bool]]) -> None:
        last_of_finished = False
        try:
            write_batch(name[0], name[1], items)
        finally:
            with self.cond:
                left = self.writing[name] - 1
                if left:
                    self.writing[name] = left
                else:
                    del self.writing[name]
                    if name in self.finished:
                        self.finished.discard(name)
                        last_of_finished = True
                self._wake()
        if last_of_finished:
            # The run finished while this was written: what landed after its
            # children were deleted goes too.
            try:
                name[0].drop_children(name[1])
            except Exception as e:
                logger.warning("dask_coro: the children of finished run %r not deleted: %r", name[1], e)

    def _wake(self) -> None:
        """Flushes whose runs have no batch being written, done (the lock held)."""
        keep = []
        for root, fut in self.flushes:
            if any(root is None or name[1] == root for name in self.writing):
                keep.append((root, fut))
            elif not fut.done():
                fut.set_result(None)
        self.flushes = keep

    def flush(self, root: Any = None, drop: bool = False) -> Future[None]:
        """The open batches of ``root`` (None: of every run) written now;
        done once none of them is being written. ``drop`` (the run
        finished): its open batches let go of, done at once, and its batches
        being written delete its children once they land."""
        fut: Future[None] = Future()
        with self.cond:
            names = [name for name in self.open if root is None or name[1] == root]
            ready = [(name, self.open.pop(name).items) for name in names]
            if drop:
                self.finished.update(name for name in self.writing if root is None or name[1] == root)
                fut.set_result(None)
                return fut
            for name, _ in ready:
                self.writing[name] = self.writing.get(name, 0) + 1
            self.flushes.append((root, fut))
            self._wake()
        for name, items in ready:
            WRITES.submit(self._write, name, items)
        return fut

    def waiting(self, root: Any = None) -> int:
        """Entries of ``root`` (None: of every run) not written yet."""
        with self.cond:
            n = sum(len(b.items) for name, b in self.open.items() if root is None or name[1] == root)
            return n + sum(k for name, k in self.writing.items() if root is None or name[1] == root)


BATCHES = Batches()


async def flush_run(root: Any, drop: bool = False) -> None:
    """This process's open batches of run ``root`` written (``drop``: let go
    of, the run finished), within ``FLUSH_TIMEOUT``, and the batches it read
    of the run let go of. On the event loop (``Client.run``'s function)."""
    try:
        await asyncio.wait_for(asyncio.wrap_future(BATCHES.flush(root, drop)), FLUSH_TIMEOUT)
    except asyncio.TimeoutError:
        logger.warning("dask_coro: the entries of run %r not all stored within %s s", root, FLUSH_TIMEOUT)
    for store in stores():
        store.forget_batches(root)


async def flush_everywhere(client: Any, root: Any, drop: bool) -> None:
    """``flush_run`` on every worker of ``client``'s cluster (None: in this
    process), waited for: the run of ``root`` ended."""
    try:
        if client is None:
            await flush_run(root, drop)
        else:
            await asyncio.wait_for(
                client.run(flush_run, root, drop, on_error="ignore"), FLUSH_TIMEOUT + 10
            )
    except Exception as e:  # a worker lost meanwhile: what it had open is computed again
        logger.warning("dask_coro: the entries of run %r not all flushed: %r", root, e)


class StoreBudget:
    """``coro.durability.store-bytes``: per store and run, the bytes of the
    entries this process wrote; once they reach the bound, the run's next
    children are not stored. A resume replays a run from its start: the
    first children stored are the ones it reuses first, and for a loop
    (each step needing the one before) a resume computes as many children
    again whichever ones were kept. Any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[tuple[str, Any], int] = {}

    def room(self, store: Any, root: Any, limit: int | None) -> bool:
        """Whether a child of ``root`` may be stored (below ``limit``)."""
        if limit is None:
            return True
        with self.lock:
            return self.runs.get((store.location, root), 0) < limit

    def wrote(self, store: Any, root: Any, nbytes: int) -> None:
        if nbytes:
            name = (store.location, root)
            with self.lock:
                self.runs[name] = self.runs.get(name, 0) + nbytes

    def ended(self, store: Any, root: Any) -> None:
        with self.lock:
            self.runs.pop((store.location, root), None)


BUDGET = StoreBudget()
