"""The pure part of a group: its children, its limit, and the order it
delivers them in.

No distributed, no event loop, no thread: the glue (``group/api.py`` and
``group/worker.py``) feeds it what happened (a child spawned, finished,
was cancelled) and does what it answers (start these children, deliver that
one). Tests drive it alone (``tests/groups/test_group_book.py``).

A child moves through::

    spawned -> QUEUED -----------> STARTED -> DONE -> DELIVERED
                 (over the limit)     \\          \\
                                       +-> CANCELLED (the group closed first)

``limit`` bounds the children STARTED and not yet DONE; the rest wait
QUEUED, as plain objects in the parent (no key, task, thread or slot): one
``Child`` (six slots) and its place in a deque. DONE children wait to be
delivered in the order they finished (``ready``), unless a replay prescribes
another: a parent run again after its worker died is given the children it
had already been given, in the same order (``replay``), and only then goes on
in completion order.

A *stream* child (``Group.spawn`` of a ``dask_coro.stream``) is delivered
once per item: each item it hands out joins ``ready`` (``emitted``), in the
stream's order, and the child stays STARTED (its producer runs, holding a
place under the limit) until its end (``finished``). An error ends it as a
last item; a value ends it with nothing to deliver, so a stream's last item
may be followed by no delivery at all. A replay names a stream child once
per item it was given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from dask.delayed import Delayed

from ..core.classify import spawn_classifier
from ..core.structure import Path, Structure

QUEUED = 0
STARTED = 1
DONE = 2
DELIVERED = 3
CANCELLED = 4

_NAMES = ("queued", "started", "done", "delivered", "cancelled")


class Child:
    """One child of a group: what ``Group.spawn`` returns (the handle).

    ``index`` is its place in spawn order (its key derives from it on a
    cluster). ``obj`` is what was spawned, as ``shaped`` keeps it (one value
    to compute, or the ``Structure`` of a list, a dict, a plain value...),
    dropped once it started (the task holds it then) or ended. ``outcome``
    is ``(True, value)`` or ``(False, error)`` once DONE, dropped once
    delivered.
    """

    __slots__ = ("group", "index", "obj", "state", "outcome", "items", "__weakref__")

    def __init__(self, group: Any, index: int, obj: Any, stream: bool = False):
        self.group = group
        self.index = index
        self.obj = obj
        self.state = QUEUED
        self.outcome: tuple[bool, Any] | None = None
        #: A stream child's outcomes not yet delivered (its items, then maybe
        #: its error), in order; None for any other child.
        self.items: deque[tuple[bool, Any]] | None = deque() if stream else None

    def done(self) -> bool:
        """Whether this child has ended: finished (delivered or not) or cancelled."""
        return self.state >= DONE

    def cancelled(self) -> bool:
        return self.state == CANCELLED

    def cancel(self) -> None:
        """Cancel this child: queued, it never starts; a coroutine child is
        closed at its current yield; a running plain function runs on and its
        result is dropped. It is never delivered: a body waiting in
        ``next()`` for the last children left, cancelled from another thread
        or task, hears that none is left. No-op once delivered."""
        self.group.cancel_child(self)

    def __repr__(self) -> str:
        name = getattr(self.group, "name", "group")
        return f"<child {self.index} of {name} ({_NAMES[self.state]})>"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled with a child's error that names it (a task's error goes to
        # the client): its place and name, not its group, which lives here.
        return _detached, (self.index, getattr(self.group, "name", "group"), self.state)


class _Detached:
    """A child's handle away from its group (unpickled): its name only."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def cancel_child(self, child: Child) -> None:
        pass  # its group is in another process, or gone


def _detached(index: int, name: str, state: int) -> Child:
    child = Child(_Detached(name), index, None)
    child.state = state
    return child


def shaped(x: Any, group: str, index: int) -> Any:
    """What a group keeps of ``x``, spawned as child ``index``: ``x`` itself
    if it is one value to compute (a call, a ``Delayed``, a Future, a
    collection), else its ``Structure`` (``core/structure.py``, as a yield
    of ``x`` walks it: its leaves to compute, in one message, and the shape
    to give their values back in; no leaf for a plain value). Raises the
    ``BadYieldError`` a yield of ``x`` would."""
    if isinstance(x, Delayed):
        return x  # the common case, without a walk
    structure = Structure(x, spawn_classifier(group, index))
    if structure.paths == [()]:
        return structure.leaves[0]
    return structure


def leaves(obj: Any) -> list[Any]:
    """The values to compute of a child kept as ``shaped`` made it."""
    return obj.leaves if type(obj) is Structure else [obj]


def paths(obj: Any) -> list[Path]:
    """Where each of ``leaves(obj)`` sits in what was spawned."""
    return obj.paths if type(obj) is Structure else [()]


def rebuild(obj: Any, values: list[Any]) -> Any:
    """The value of a child kept as ``shaped`` made it, from its leaves'."""
    return obj.rebuild(values) if type(obj) is Structure else values[0]


def check_limit(limit: Any) -> None:
    """A group's ``limit=``: a wrong type is a ``TypeError``, a number
    below 1 a ``ValueError`` (as for its ``timeout=``)."""
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"group limit= must be a positive int or None, not {limit!r}")
    if limit < 1:
        raise ValueError(f"group limit= must be >= 1, not {limit!r}")


class GroupBook:
    """The children of one group and what to do next (see the module).

    ``spawn`` returns the new child and whether to start it now; ``finished``
    records a started child's outcome and returns the queued children to
    start in its place; ``take`` names the next child to deliver, or None
    (wait for one to finish); ``cancel_all`` says what to stop.
    """

    __slots__ = ("limit", "children", "queued", "started", "ready", "left", "replay", "replayed",
                 "delivered", "closed", "ended")

    def __init__(self, limit: int | None = None, replay: Iterable[int] = ()):
        check_limit(limit)
        self.limit = limit
        self.children: list[Child] = []  # by index; a child stays while the group lives
        self.queued: deque[Child] = deque()  # spawned over the limit, oldest first
        self.started = 0  # STARTED, not DONE
        self.ready: deque[Child] = deque()  # DONE, not delivered: completion order
        self.left = 0  # spawned, not delivered nor cancelled: len(group)
        #: Indices a previous run of the parent delivered, in that order:
        #: delivered first, in that order, whatever order they finish in now.
        self.replay: list[int] = list(replay)
        self.replayed = 0
        #: Indices delivered by this run, in order (what a replay would need).
        self.delivered: list[int] = []
        self.closed = False
        #: Children that ended done, failed, or cancelled before they ended
        #: (``counts``).
        self.ended = [0, 0, 0]

    def spawn(self, group: Any, obj: Any, stream: bool = False) -> tuple[Child, bool]:
        """A new child of ``obj`` (a stream child: delivered per item); True
        if it starts now (within the limit)."""
        if self.closed:
            raise RuntimeError("spawn() on a group that was closed")
        child = Child(group, len(self.children), obj, stream)
        self.children.append(child)
        self.left += 1
        if self.limit is None or self.started < self.limit:
            child.state = STARTED
            self.started += 1
            return child, True
        self.queued.append(child)
        return child, False

    def finished(self, child: Child, ok: bool, value: Any) -> list[Child]:
        """``child`` (started) ended with ``value`` (``ok``) or an error; the
        queued children to start now, in spawn order. A child cancelled
        meanwhile stays cancelled: its outcome is dropped."""
        if child.state != STARTED:
            return []
        self.started -= 1
        child.state = DONE
        child.obj = None
        self.ended[0 if ok else 1] += 1
        items = child.items
        if items is None:
            child.outcome = (ok, value)
            self.ready.append(child)
        elif not ok:
            items.append((False, value))  # delivered after the items before it
            self.ready.append(child)
        elif not items:
            self._delivered(child)  # its end is nothing to deliver
        return self._fill()

    def emitted(self, child: Child, value: Any) -> None:
        """Stream child ``child`` (started) handed out ``value``: delivered
        after its items before it. Dropped if the child was cancelled."""
        if child.state != STARTED or child.items is None:
            return
        child.items.append((True, value))
        self.ready.append(child)

    def _fill(self) -> list[Child]:
        out = []
        queued = self.queued
        while queued and (self.limit is None or self.started < self.limit):
            c = queued.popleft()
            c.state = STARTED
            self.started += 1
            out.append(c)
        return out

    def take(self) -> Child | None:
        """The next child to deliver, now DELIVERED (its outcome is the
        caller's: ``pop_outcome``), or None if none may be delivered yet.
        A replay's next child first; else the first to have finished."""
        if self.replayed < len(self.replay):
            index = self.replay[self.replayed]
            if index >= len(self.children):
                return None  # not spawned yet by this run
            child = self.children[index]
            if child.state != DONE and not child.items:
                return None  # wait for that one (a stream child: its next item)
            self.replayed += 1
            self.ready.remove(child)
        elif self.ready:
            child = self.ready.popleft()
        else:
            return None
        self.delivered.append(child.index)
        items = child.items
        if items is not None:
            child.outcome = items.popleft()
            if child.state == STARTED or items:
                return child  # more to come from this stream
        self._delivered(child)
        return child

    def _delivered(self, child: Child) -> None:
        child.state = DELIVERED
        self.left -= 1

    def replaying(self) -> Child | None:
        """The child a replay waits for next (spawned, not done), or None."""
        if self.replayed < len(self.replay):
            index = self.replay[self.replayed]
            if index < len(self.children):
                return self.children[index]
        return None

    def pending(self) -> list[Child]:
        """Children spawned and not yet delivered nor cancelled, in spawn order."""
        return [c for c in self.children if c.state in (QUEUED, STARTED, DONE)]

    def first_started(self) -> Child | None:
        """The oldest child started and not done (without a cluster, the next
        to run), or, with none started, None."""
        want = self.replaying()
        if want is not None and want.state == STARTED and not want.items:
            return want
        for c in self.children:
            if c.state == STARTED:
                return c
        return None

    def cancel(self, child: Child) -> bool:
        """Cancel one child; True if it was started (its task must be
        stopped), False if it was queued (dropped here) or had ended."""
        state = child.state
        if state == QUEUED:
            self.queued.remove(child)
        elif state == STARTED:
            self.started -= 1
        elif state != DONE:
            return False
        if state != DONE:
            self.ended[2] += 1
        if state == DONE or child.items:
            self.ready = deque(c for c in self.ready if c is not child)
        child.state = CANCELLED
        child.obj = None
        child.outcome = None
        if child.items is not None:
            child.items.clear()
        self.left -= 1
        return state == STARTED

    def undelivered_errors(self) -> list[tuple[Child, BaseException]]:
        """The children that ended with an error not yet delivered (a
        stream child: its error after items not yet delivered), in spawn
        order, with that error: what closing the group would drop."""
        return [(c, e) for c in self.children for e in self.undelivered_errors_of(c)]

    @staticmethod
    def undelivered_errors_of(child: Child) -> list[BaseException]:
        """The errors ``child`` ended with that were not delivered yet (none
        unless it ended: a started child's end is not known, a cancelled
        one's is of no one)."""
        if child.state != DONE:
            return []
        outcomes = [child.outcome] if child.items is None else list(child.items)
        return [value for ok, value in (o for o in outcomes if o is not None) if not ok]

    def cancel_all(self) -> list[Child]:
        """Close the group: every child not delivered is cancelled; the ones
        that were started (their tasks to stop), in spawn order."""
        self.closed = True
        out = []
        for c in self.children:
            if c.state in (QUEUED, STARTED, DONE) and self.cancel(c):
                out.append(c)
        self.queued.clear()
        return out

    def fill(self) -> list[Child]:
        """Queued children that may start now (after a cancel freed room)."""
        return [] if self.closed else self._fill()

    def counts(self) -> list[int]:
        """The children by state, each counted once: queued (over the limit),
        started and not ended, ended done, ended failed (a stream child: by
        its producer's end), cancelled before they ended. A child cancelled
        after it ended, before it was delivered, counts as it ended."""
        return [len(self.queued), self.started, *self.ended]

    def __len__(self) -> int:
        return self.left
