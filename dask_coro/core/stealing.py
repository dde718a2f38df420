"""Which unstarted inline calls the engine hands out, and when.

Pure. ``Trampoline`` (``engine.py``) inherits these methods: its loop asks
for them only off the hot path (idle capacity reported, a wait coming, a
value computed in place whose call was handed out), so an inline call pays
nothing for them. The policy (Cilk's lazy task creation): while the caller
reports idle threads (``Idle.n``), the oldest frames' unstarted calls are
handed out, the biggest work first; before the stack waits, every unstarted
call is (*promoted*), so work that could run does run while this stack
waits; a call that runs on the stack, or that a value computed in place
needs, is never handed out (it would run twice).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .calls import EMPTY as _EMPTY
from .calls import NOT_DONE, Failed

#: An ``engine.Frame`` (not imported: the engine imports this module).
_Frame = Any


class Idle:
    """Idle capacity elsewhere, as the caller last learned it: ``n`` leaves
    may be promoted now. The trampoline only reads it."""

    __slots__ = ("n",)

    def __init__(self, n: int = 0):
        self.n = n


_NO_IDLE = Idle(0)


class Stealing:
    """Handing out and promoting a trampoline's unstarted calls (a mixin of
    ``Trampoline``, which sets ``stack`` and ``call_type``)."""

    stack: list[_Frame]
    call_type: Any
    short: Any  # Callable[[call], bool] | None: a call never handed out

    def _running(self) -> set[int]:
        """The calls being run by frames on the stack, by id: the same call
        object at another, unstarted position must not be handed out (it
        would run twice); it reuses the value when its turn comes. A value
        computed in place that is running (``__dask_coro_needs__``) runs its
        calls itself: those also yielded, or needed, elsewhere on the stack
        count as running too (handed out there, or from its own frame, they
        would be planned at two places, under two keys)."""
        out: set[int] = set()
        call_type = self.call_type
        evaluating: list[tuple[_Frame, Any, Sequence[Any]]] = []
        for f in self.stack[1:]:
            if f.up is None:
                continue
            leaf = f.up.leaves[f.at]
            out.add(id(leaf))
            if type(leaf) is not call_type:
                needs = getattr(leaf, "__dask_coro_needs__", ())
                if needs:
                    evaluating.append((f, leaf, needs))
        if evaluating:
            out.update(self._shared(evaluating))
        return out

    def _shared(self, evaluating: list[tuple[_Frame, Any, Sequence[Any]]]) -> set[int]:
        """The calls of running values computed in place (``(frame, leaf,
        needs)``) that another frame's yield, or another value computed in
        place, holds too, by id."""
        call_type = self.call_type
        holders: dict[int, set[int]] = {}  # id(call) -> ids of frames and leaves holding it
        for f in self.stack:
            for leaf in getattr(f, "leaves", ()):
                holders.setdefault(id(leaf), set()).add(id(f))
                if type(leaf) is not call_type:
                    for c in getattr(leaf, "__dask_coro_needs__", ()):
                        holders.setdefault(id(c), set()).add(id(leaf))
        out: set[int] = set()
        for f, leaf, needs in evaluating:
            mine = {id(f), id(leaf)}
            for c in needs:
                if holders.get(id(c), mine) - mine:
                    out.add(id(c))
        return out

    def _kept(self, leaf: Any, running: set[int]) -> bool:
        """Whether ``leaf`` must not be handed out now: it is running (see
        ``_running``), or it is a value computed in place that needs a call
        that is (handed out, it would plan that call as a task: a second
        run)."""
        if id(leaf) in running:
            return True
        if type(leaf) is self.call_type:
            return False
        return any(id(c) in running for c in getattr(leaf, "__dask_coro_needs__", ()))

    def _steal(self, n: int) -> list[tuple[_Frame, list[int]]]:
        """Promote up to ``n`` unstarted leaves, the oldest frames' first (the
        biggest work, as Cilk's thieves take), from the end of each frame's
        list; never the top frame's next leaf, which this stack is about to
        run (handing it out would only make the stack wait for it), nor a
        call not worth a task (``Trampoline.short``: an idle thread would
        spend a round trip on microseconds of work this stack does at once).
        Before a wait every unstarted call is still promoted, short or not
        (``_promote_all``): the wait may be for what one of them does."""
        batches = []
        running = self._running()
        short = self.short
        top = self.stack[-1]
        for frame in self.stack:
            start = frame.next + 1 if frame is top else frame.next
            if len(frame.todo) <= start:
                continue
            todo = list(frame.todo)
            rest = todo[start:]
            taken = [
                p for p in rest
                if not self._kept(frame.leaves[p], running)
                and not (short is not None and type(frame.leaves[p]) is self.call_type and short(frame.leaves[p]))
            ][-n:]
            if not taken:
                continue
            frame.todo = todo[:start] + [p for p in rest if p not in taken]
            n -= self._to_remote(frame, taken)
            if frame.sent < len(frame.remote):
                batches.append((frame, list(frame.remote[frame.sent :])))
                frame.sent = len(frame.remote)
            if n <= 0:
                break
        return batches

    def _has_unstarted(self) -> bool:
        running = self._running()
        return any(
            not self._kept(f.leaves[p], running) for f in self.stack for p in f.todo[f.next :]
        )

    def _promote_all(self) -> list[tuple[_Frame, list[int]]]:
        """Turn every unstarted inline leaf remote; the leaves not handed out
        yet, by frame."""
        batches = []
        running = self._running()
        for frame in self.stack:
            rest = frame.todo[frame.next :]
            if rest:
                keep = [p for p in rest if self._kept(frame.leaves[p], running)]
                frame.todo = [*frame.todo[: frame.next], *keep]
                self._to_remote(frame, [p for p in rest if p not in keep])
            if frame.sent < len(frame.remote):
                batches.append((frame, list(frame.remote[frame.sent :])))
                frame.sent = len(frame.remote)
        return batches

    @staticmethod
    def _to_remote(frame: _Frame, positions: Sequence[int]) -> int:
        """Hand ``positions`` to the caller, but for calls computed already
        (one that raised is handed out: its task raises its error); how many
        were handed."""
        if frame.remote is _EMPTY:
            frame.remote = []
        remote = frame.remote
        assert isinstance(remote, list)
        n = 0
        for p in positions:
            done = frame.leaves[p].__dask_coro_value__
            if done is not NOT_DONE and type(done) is not Failed:
                frame.results[p] = done
            else:
                remote.append(p)
                n += 1
        return n


def _needs_handed_out(leaf: Any) -> bool:
    """Whether a call that ``leaf`` (a value computed in place) would run
    itself has been handed out as a task: it has a key now (no function to
    run here) and no value."""
    for c in getattr(leaf, "__dask_coro_needs__", ()):
        if c.__dask_coro_inline__ is None and c.__dask_coro_value__ is NOT_DONE:
            return True
    return False
