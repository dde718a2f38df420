"""How many bytes of consumed children the scheduler holds on each worker
(pure: no dask, no distributed).

Holding a child its coroutine has not consumed yet costs nothing: the
coroutine's worker client wants it anyway. Holding one the coroutine has
consumed (resumed with, then let go of) keeps in memory what plain Dask would
have freed, so those are the bytes the hold adds. The budget bounds them per
worker, as memory is per worker: past it, the oldest consumed children on
that worker are let go of (a re-run parent then computes them again), and a
consumed child larger than the whole budget is let go of at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the type checker only: this module does not import dask
    from dask.typing import Key


class HoldBudget:
    """Consumed held children, per worker, oldest first, with their bytes.

    ``limit(worker)`` is the budget of a worker in bytes, None for no bound.
    """

    def __init__(self, limit: Callable[[str], int | None]) -> None:
        self.limit = limit
        self.where: dict[Key, str] = {}  # child -> the worker charged for it
        self.size: dict[Key, int] = {}  # child -> its bytes
        # worker -> its consumed children, in the order they were consumed
        # (a dict keeps insertion order: the first key is the oldest)
        self.on: dict[str, dict[Key, None]] = {}
        self.spent: dict[str, int] = {}

    def charge(self, child: Key, worker: str, nbytes: int) -> list[Key]:
        """``child`` (``nbytes``, in memory on ``worker``) was consumed and
        only the hold keeps it: the children to let go of now, oldest first
        (``child`` itself if it alone is over the budget)."""
        self.discharge(child)
        self.where[child] = worker
        self.size[child] = max(0, nbytes)
        self.on.setdefault(worker, {})[child] = None
        self.spent[worker] = self.spent.get(worker, 0) + self.size[child]
        return self.over(worker)

    def over(self, worker: str) -> list[Key]:
        """The oldest consumed children on ``worker`` past its budget, no
        longer charged: to let go of."""
        limit = self.limit(worker)
        out: list[Key] = []
        if limit is None:
            return out
        children = self.on.get(worker)
        while children and self.spent[worker] > limit:
            child = next(iter(children))
            self.discharge(child)
            out.append(child)
        return out

    def discharge(self, child: Key) -> None:
        """``child`` is no longer a consumed child only the hold keeps (asked
        for again, let go of, lost or forgotten)."""
        worker = self.where.pop(child, None)
        if worker is None:
            return
        nbytes = self.size.pop(child)
        children = self.on[worker]
        del children[child]
        self.spent[worker] -= nbytes
        if not children:
            del self.on[worker]
            del self.spent[worker]

    def left(self, worker: str, moved_to: Callable[[Key], str | None]) -> list[str]:
        """``worker`` left the cluster: each child charged to it is charged
        to ``moved_to(child)`` (a worker still holding its data, e.g. where
        ``retire_workers`` copied it) or, with None (its data is gone), no
        longer charged. The workers charged more, whose budget to check."""
        children = list(self.on.get(worker, ()))
        grown = []
        for child in children:
            nbytes = self.size[child]
            self.discharge(child)
            to = moved_to(child)
            if to is not None:
                self.where[child] = to
                self.size[child] = nbytes
                self.on.setdefault(to, {})[child] = None
                self.spent[to] = self.spent.get(to, 0) + nbytes
                if to not in grown:
                    grown.append(to)
        return grown

    def charged(self, child: Key) -> bool:
        return child in self.where
