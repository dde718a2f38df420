"""Which children the scheduler holds for which coroutine (pure: no dask,
no distributed).

A coroutine's children are submitted by its worker's client, which releases
each result once the coroutine has resumed, and which dies with the worker.
The book keeps, per parent key, the children held on its behalf from their
submission, so that a parent re-run elsewhere finds them (their keys derive
from the parent's key, the yield and the position), finished or still
running, until the parent ends. A child the parent gives up on while it has
work left (a sibling failed) is let go of, and then cancelled as any unwanted
task; one consumed may be let go of for the budget (``budget.py``). Only the
parent's current run gives a child up or consumes it: the book counts its
runs (one ends when the parent leaves its worker without ending), so the
releases of a run whose worker retired or closed are told apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the type checker only: this module does not import dask
    from dask.typing import Key

#: Task states in which a child still has work to do.
UNFINISHED = frozenset({"released", "waiting", "queued", "no-worker", "processing"})


class HoldBook:
    """parent -> children held for it (from their submission); child -> its
    parent (every child, held or let go of), and its inverse, parent -> every
    child; per parent, how many of its children have work left (``open``):
    while any has, the parent is waiting on them. Each event costs O(the keys
    it names): ending a parent touches its own children, never another
    parent's."""

    def __init__(self) -> None:
        self.held: dict[Key, set[Key]] = {}
        self.parent_of: dict[Key, Key] = {}
        self.children: dict[Key, set[Key]] = {}  # parent -> its keys in parent_of
        self.open: dict[Key, int] = {}
        # per parent, children forgotten before they finished (their
        # submitter's client went, with its worker): still waited for, until
        # the parent submits again
        self.orphans: dict[Key, int] = {}
        # per parent, its run: one more each time it leaves a worker without
        # ending (lost, retired, rescheduled); per child, the run of its
        # parent that last asked for it. A child the parent's run let go of
        # while it has work left was given up on only if that run asked for
        # it: the releases of a run that left its worker (a retired worker's
        # client letting go as it closes) are not the parent's choice.
        self.run: dict[Key, int] = {}
        self.asked: dict[Key, int] = {}

    def adopt(self, parent: Key, children: Iterable[Key], state: Callable[[Key], str | None]) -> list[Key]:
        """``parent`` submitted ``children`` (``state(key)``: their task state
        now): the ones to hold for it from now on."""
        n = 0
        new = []
        held = self.held.setdefault(parent, set())
        for k in children:
            if k == parent or k in self.parent_of:
                continue
            self.parent_of[k] = parent
            self.children.setdefault(parent, set()).add(k)
            self.asked[k] = self.run.get(parent, 0)
            held.add(k)
            new.append(k)
            n += state(k) in UNFINISHED
        n -= self.orphans.pop(parent, 0)
        if n:
            self.open[parent] = max(0, self.open.get(parent, 0) + n)
        return new

    def ask(self, child: Key) -> None:
        """The parent's current run asked for ``child`` (submitted it, or
        asked for it again)."""
        parent = self.parent_of.get(child)
        if parent is not None:
            self.asked[child] = self.run.get(parent, 0)

    def left(self, parent: Key) -> None:
        """``parent`` left its worker without ending: what its run asked for
        is no longer asked for, until a new run asks again."""
        if parent in self.held:
            self.run[parent] = self.run.get(parent, 0) + 1

    def asked_now(self, child: Key) -> bool:
        """Whether the current run of ``child``'s parent asked for it."""
        parent = self.parent_of.get(child)
        return parent is not None and self.asked.get(child) == self.run.get(parent, 0)

    def is_parent(self, key: Key) -> bool:
        return key in self.held

    def finished(self, child: Key) -> Key | None:
        """``child`` is in memory: the parent to hold it for, if it is not
        held already (it was let go of when its data was lost, and computed
        again for its parent)."""
        parent = self.parent_of.get(child)
        if parent is None:
            return None
        held = self.held.setdefault(parent, set())
        if child in held:
            return None
        held.add(child)
        return parent

    def lost(self, child: Key) -> Key | None:
        """A held ``child``'s data is gone (its worker died), or it is let go
        of (its parent gave up on it, or the budget): the parent to let go of
        it for. A re-run that yields it again submits it again; nothing else
        should recompute it."""
        parent = self.parent_of.get(child)
        held = self.held.get(parent) if parent is not None else None
        if held is None or child not in held:
            return None
        held.discard(child)
        return parent

    def moved(self, child: Key, start: str, finish: str) -> Key | None:
        """A child moved from ``start`` to ``finish``: its parent, if that
        changed whether the parent has children with work left."""
        parent = self.parent_of.get(child)
        if parent is None:
            return None
        was, now = start in UNFINISHED, finish in UNFINISHED
        if was and finish == "forgotten":
            self.orphans[parent] = self.orphans.get(parent, 0) + 1
            return None  # still waited for
        if was == now:
            return None
        before = self.open.get(parent, 0)
        after = max(0, before + (1 if now else -1))
        self.open[parent] = after
        return parent if (before == 0) != (after == 0) else None

    def waiting(self, parent: Key) -> bool:
        """Whether ``parent`` has a child with work left: a parent lost with
        its worker then was waiting, not running code of its own."""
        return self.open.get(parent, 0) > 0

    def end(self, parent: Key) -> list[Key]:
        """``parent`` ended (finished, failed or forgotten): the children
        held for it, to let go of. A child that is a parent keeps its own."""
        held = self.held.pop(parent, set())
        self.open.pop(parent, None)
        self.orphans.pop(parent, None)
        self.run.pop(parent, None)
        for k in self.children.pop(parent, ()):
            del self.parent_of[k]
            self.asked.pop(k, None)
        return list(held)

    def forget(self, child: Key) -> None:
        """``child`` is gone from the scheduler (forgotten)."""
        parent = self.parent_of.pop(child, None)
        self.asked.pop(child, None)
        if parent is not None:
            siblings = self.children[parent]
            siblings.discard(child)
            if not siblings:
                del self.children[parent]
            held = self.held.get(parent)
            if held is not None:
                held.discard(child)
