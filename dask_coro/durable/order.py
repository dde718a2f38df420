"""A durable run's groups: the order each delivered its children in, and its
first deadline, kept in the store (``runs/<run>/groups/<group>``).

The scheduler keeps them for a parent re-run after its worker died
(``durability/order.py``); a run resumed after the loss of its scheduler or
of its whole cluster finds them here instead. A group asks ``replay`` when
it opens (its stored deliveries and deadline) and tells ``delivered`` of
each child it gives the body, and of its deadline; the writes are
coalesced (at most one queued per group: it writes the latest order) and
made by the store's writer threads, in the order the group made them.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..runtime.extensions import Run
from .local import READS, WRITES
from .store import Store

logger = logging.getLogger("dask_coro")


class GroupLog:
    """What a group of a durable run delivered, as stored (``order``), and
    whether a write of it is queued."""

    __slots__ = ("deadline", "lock", "order", "queued", "writing")

    def __init__(self, deadline: float | None, order: list[int]):
        self.deadline = deadline
        self.order = order
        self.queued = False
        self.lock = threading.Lock()
        self.writing = threading.Lock()  # one write of the group at a time: the latest last


def _store_of(run: Run) -> tuple[Store, Any, dict[int, GroupLog]] | None:
    note = run.notes.get("durable")
    if note is None or note.store is None:
        return None
    return note.store, note.root, note.groups


async def replay(run: Run, group: int, scheduler_order: list[int]) -> dict[str, Any] | None:
    """What group ``group`` of ``run`` delivered in an earlier run, from the
    store (None without a store): its order, then what the scheduler's log
    (``scheduler_order``, this cluster's deliveries) has beyond it (the
    store's writes may lag), and its first deadline."""
    found = _store_of(run)
    if found is None:
        return None
    store, root, groups = found
    try:
        log = await run.loop.run_in_executor(READS, store.get_group, root, run.key, group)
    except Exception as e:
        logger.warning("dask_coro: the deliveries of group %s of %r not read from %s: %r", group, run.key, store.location, e)
        log = None
    log = log or {}
    order = [int(i) for i in log.get("order") or []]
    seen = set(order)
    order += [i for i in scheduler_order if i not in seen]
    deadline = log.get("deadline")
    deadline = float(deadline) if isinstance(deadline, (int, float)) else None
    groups[group] = GroupLog(deadline, list(order))
    return {"deadline": deadline, "order": order}


def delivered(run: Run, group: int, index: int | None = None, deadline: float | None = None) -> None:
    """Group ``group`` of ``run`` gave the body child ``index``, or has
    ``deadline`` (kept once: the first): stored (any thread)."""
    found = _store_of(run)
    if found is None:
        return
    store, root, groups = found
    log = groups.get(group)
    if log is None:
        log = groups.setdefault(group, GroupLog(None, []))
    with log.lock:
        if index is not None:
            log.order.append(index)
        if deadline is not None and log.deadline is None:
            log.deadline = deadline
        if log.queued:
            return  # the write queued takes this one too
        log.queued = True
    WRITES.submit(_write, store, root, run.key, group, log)


def _write(store: Store, root: Any, key: Any, group: int, log: GroupLog) -> None:
    with log.writing:
        with log.lock:
            log.queued = False
            value = {"deadline": log.deadline, "order": list(log.order)}
        try:
            store.put_group(root, key, group, value)
        except FileNotFoundError:
            pass  # the run finished, or was forgotten, meanwhile
        except Exception as e:
            logger.warning("dask_coro: the deliveries of group %s of %r not stored in %s: %r", group, key, store.location, e)
