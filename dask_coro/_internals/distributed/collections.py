"""``distributed.collections``: ``HeapSet``, the scheduler's queue of tasks
(``Scheduler.queued``).
"""

from __future__ import annotations

import heapq
from typing import Any


def queue_entries(scheduler: Any) -> int:
    """How many entries the heap of the scheduler's queue holds, stale ones
    included (``Scheduler.queued``, a ``HeapSet``: ``_heap``)."""
    return len(scheduler.queued._heap)


def drop_stale_queue_entries(scheduler: Any) -> int:
    """Rebuild the heap of the scheduler's queue with the entries whose task
    is the very ``TaskState`` in the queue; the number dropped.

    ``distributed.collections.HeapSet`` keeps a set (``_data``) and a heap of
    weak references (``_heap``); ``discard`` removes a task from the set
    only, and ``peek`` skips heap entries whose object is not in the set.
    TaskStates compare by key, so a forgotten TaskState still alive, whose
    key is queued again as a new TaskState, is found "in" the set: ``peek``
    hands back the forgotten object (dask/distributed #7504).
    ``Scheduler.stimulus_queue_slots_maybe_opened`` then transitions the key
    (the new task, correctly), but under ``distributed.scheduler.validate``
    asserts the peeked object's state first. O(queue)."""
    q = scheduler.queued
    ids = {id(ts) for ts in q._data}
    heap = [entry for entry in q._heap if id(entry[2]()) in ids]
    dropped = len(q._heap) - len(heap)
    if dropped:
        heapq.heapify(heap)
        q._heap = heap
        q._sorted = False
    return dropped
