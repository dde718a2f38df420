"""The pure book of resources lent by waiting coroutines on one worker.

A coroutine task given ``resources={"GPU": 1}`` holds them while its body
runs. While it waits it gives them back (*lends* them): its children, or any
task, may use them. Before its body goes on it must *take* them back, and
waits until the worker has them free, as a task waits for its resources in
distributed's ``constrained`` queue. Runs waiting to take are served in
priority order (distributed's: lower first), and one whose resources are not
free blocks those behind it, so a run that needs more than another is never
passed over for ever; which of the free resources the worker's queued tasks
get first is distributed's (``WorkerState._ensure_computing`` hands out what
a finished task frees in the same step).

No distributed, no event loop: the worker plugin (``resources/worker.py``)
feeds it and carries out what it answers.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Mapping
from typing import Any


def fits(available: Mapping[str, float], needed: Mapping[str, float]) -> bool:
    """Whether ``needed`` is free in ``available`` (a resource the worker
    does not have is not free)."""
    return all(available.get(r, 0) >= n for r, n in needed.items())


class Lending:
    """What each run lent, and which runs wait to take it back."""

    def __init__(self) -> None:
        self.lent: dict[Hashable, dict[str, float]] = {}
        # (priority, arrival, key): served lowest first; arrival breaks ties.
        self._queue: list[tuple[tuple[Any, ...], int, Hashable]] = []
        self._waiting: dict[Hashable, int] = {}  # key -> its arrival in the queue
        self._arrivals = itertools.count()

    def lend(self, key: Hashable, resources: Mapping[str, float]) -> None:
        if key in self.lent:
            raise ValueError(f"{key!r} lent its resources already")
        self.lent[key] = dict(resources)

    def wait(self, key: Hashable, priority: tuple[Any, ...]) -> None:
        """``key`` wants its resources back, with the task's ``priority``."""
        if key not in self.lent:
            raise KeyError(f"{key!r} lent nothing")
        if key not in self._waiting:
            arrival = self._waiting[key] = next(self._arrivals)
            heapq.heappush(self._queue, (priority, arrival, key))

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def grants(
        self, available: Mapping[str, float], can_take: Callable[[Hashable], bool] = lambda key: True
    ) -> list[Hashable]:
        """The waiting runs that may take their resources back now, in order:
        each in turn while what it lent is free in ``available`` (less what
        those before it take), stopping at the first whose is not. A run
        ``can_take`` refuses (cancelled meanwhile) is passed over. Answers
        only: ``taken`` records each grant carried out."""
        left = dict(available)
        out = []
        for _, arrival, key in sorted(self._queue):
            if self._waiting.get(key) != arrival:
                continue  # taken or withdrawn since
            if not can_take(key):
                continue
            need = self.lent[key]
            if not fits(left, need):
                break
            for r, n in need.items():
                left[r] -= n
            out.append(key)
        return out

    def taken(self, key: Hashable) -> dict[str, float]:
        """``key`` took back what it lent: forget it."""
        self._waiting.pop(key, None)
        self._compact()
        return self.lent.pop(key)

    def forget(self, key: Hashable) -> dict[str, float] | None:
        """``key`` ends with its resources lent (cancelled, its worker
        closing): nothing to take back, as the worker no longer counts them
        as its task's. What it had lent, or None."""
        self._waiting.pop(key, None)
        self._compact()
        return self.lent.pop(key, None)

    def _compact(self) -> None:
        # Withdrawn entries stay in the heap until it is mostly stale.
        if len(self._queue) > 2 * len(self._waiting) + 8:
            self._queue = [e for e in self._queue if self._waiting.get(e[2]) == e[1]]
            heapq.heapify(self._queue)
