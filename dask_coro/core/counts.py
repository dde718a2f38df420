"""Counting the calls a trampoline runs inline, for progress and the tree.

Pure. ``Trampoline`` (``engine.py``) inherits these methods. Its loop keeps
a run of calls of one function in a local list (``[func, n]``) and adds it
here every ``check_every`` calls and whenever it stops, so an inline call
costs a comparison and an increment when counting, nothing more, and a
test of a local when not.
"""

from __future__ import annotations

from typing import Any

from .calls import unwrap as _unwrap


class Counting:
    """Calls run inline, per function (a mixin of ``Trampoline``, which sets
    ``calls``, None when it does not count, and ``stack``)."""

    calls: dict[Any, list[int]] | None
    stack: list[Any]  # of engine.Frame (not imported: the engine imports this module)

    def call_counts(self) -> dict[Any, tuple[int, int, int]]:
        """``{func: (started, done, failed)}`` of the calls run inline (not
        the root): done is started, less failed, less those on the stack.
        Safe to read from another thread while the loop runs (the figures
        then trail by up to ``check_every`` calls, done never below 0);
        exact once it stopped.
        A body closed before it ended (``close``) counts as failed."""
        calls = self.calls
        if calls is None:
            return {}
        running: dict[Any, int] = {}
        for frame in self.stack[1:]:  # a copy (atomic): the loop may push meanwhile
            func = _unwrap(frame.func)
            running[func] = running.get(func, 0) + 1
        return {
            f: (c[0], max(c[0] - c[1] - running.get(f, 0), 0), c[1])
            for f, c in list(calls.items())
        }

    def _failed(self, func: Any) -> None:
        """A call of ``func`` run inline raised (or was closed)."""
        calls = self.calls
        if calls is not None:
            func = _unwrap(func)
            c = calls.get(func)
            if c is None:
                c = calls[func] = [0, 0]
            c[1] += 1

    def _started(self, func: Any, n: int) -> None:
        calls = self.calls
        assert calls is not None
        func = _unwrap(func)
        c = calls.get(func)
        if c is None:
            c = calls[func] = [0, 0]
        c[0] += n
