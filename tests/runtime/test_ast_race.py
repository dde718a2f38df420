"""Coroutine bodies that build ASTs (``ast.literal_eval``, ``ast.parse``) while
a garbage collection runs Python code: CPython 3.11 before 3.11.8 shares the
AST constructor's recursion count between threads (gh-106905), so a body's
``ast.literal_eval`` failed now and then in the conformance suite with
``SystemError: AST constructor recursion depth mismatch``. Greenlets are not
the cause: a parked greenlet killed by a collection inside the constructor
leaves the count right; another tree built meanwhile does not. The test
session builds trees with collection held off (``tests/ast_guard.py``,
installed by ``tests/conftest.py`` on those releases); docs/limitations.md
says what users can do.
"""

from __future__ import annotations

import ast
import gc
import threading
import time

import dask
import greenlet
import pytest
from ast_guard import AFFECTED, original_parse

from dask_coro import coroutine, result

#: A program as the conformance suite passes one: a repr, decoded in the body.
_SRC = repr(tuple((i, [str(i)] * 3, {i: (i,)}) for i in range(300)))
_ROUNDS = 50
_finalized = [0]


class _Garbage:
    """A cycle: only a collection frees it. Its finalizer runs Python code
    (a collection inside the constructor may then hand the GIL to another
    thread) or builds a tree itself (another body decoding, on this thread)."""

    def __init__(self, parses: bool):
        self.me = self
        self.parses = parses

    def __del__(self) -> None:
        _finalized[0] += 1
        if self.parses:
            ast.literal_eval("(1, 2)")
        else:
            sum(range(200))


@coroutine
def _one() -> int:
    return 1


@coroutine
def _decodes(rounds: int, parses: bool, seconds: float = 0.0) -> int:
    """Waits once from plain code (its stack parks in a loop greenlet and is
    resumed there), then decodes the program ``rounds`` times (or for
    ``seconds``), leaving garbage for the collector before each."""
    (one,) = result([_one()])
    n = 0
    end = time.monotonic() + seconds
    while n < rounds or time.monotonic() < end:
        for _ in range(20):
            _Garbage(parses)
        assert ast.literal_eval(_SRC)[1] == (1, ["1"] * 3, {1: (1,)})
        n += one
    return n


def _run(rounds: int, parses: bool, seconds: float = 0.0) -> int:
    (n,) = dask.compute(_decodes(rounds, parses, seconds), scheduler="sync")
    return n  # type: ignore[no-any-return]


@pytest.fixture
def unguarded(monkeypatch):
    """``ast.parse`` as the interpreter has it, without the session's guard."""
    monkeypatch.setattr(ast, "parse", original_parse)


@pytest.mark.skipif(not AFFECTED, reason="the interpreter's AST constructor has no shared count")
def test_the_interpreter_race_without_the_guard(unguarded):
    """The cause, on this interpreter: a tree built by a finalizer that a
    collection inside the body's ``literal_eval`` runs breaks the body's."""
    with pytest.raises(SystemError, match="AST constructor recursion depth mismatch"):
        _run(_ROUNDS, parses=True)


def test_a_body_decodes_while_finalizers_build_trees():
    """Failed before the session's guard (the first round, on 3.11.7)."""
    _finalized[0] = 0
    assert _run(_ROUNDS, parses=True) == _ROUNDS
    gc.collect()
    assert _finalized[0] >= 20 * _ROUNDS  # the collector did run, outside the parses


def test_bodies_decode_in_two_threads():
    """The conformance failure: two workers' threads run bodies that decode.
    Failed before the session's guard (within 0.1 s, on 3.11.7)."""
    out: list = []

    def work() -> None:
        try:
            out.append(_run(1, parses=False, seconds=1.0))
        except BaseException as e:
            out.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [type(x) for x in out] == [int, int], out


_inside = [False]  # in ast.literal_eval now


def _parked(parses: bool, killed: list) -> None:
    try:
        greenlet.getcurrent().parent.switch()  # parked, never resumed
    finally:
        killed.append(_inside[0])
        if parses:
            ast.literal_eval("(1, 2)")


class _Holder:
    def __init__(self, glet: greenlet.greenlet):
        self.glet = glet
        self.me = self


@pytest.mark.parametrize("parses", [False, True])
def test_parked_greenlets_killed_inside_the_constructor(unguarded, parses):
    """Unfinished greenlets, held only by cycles, killed (``GreenletExit``) by
    a collection inside ``literal_eval``: greenlet keeps the recursion count
    right across the kill. Only a greenlet that builds a tree as it unwinds
    breaks it (on the affected releases), as any finalizer that does would."""
    killed: list = []
    error = None
    for _ in range(_ROUNDS):
        for _ in range(10):
            g = greenlet.greenlet(_parked)
            g.switch(parses, killed)
            _Holder(g)
            del g
        _inside[0] = True
        try:
            ast.literal_eval(_SRC)
        except SystemError as e:
            error = e
            break
        finally:
            _inside[0] = False
    gc.collect()
    assert any(killed)  # some were killed inside literal_eval
    if parses and AFFECTED:
        assert error is not None and "recursion depth mismatch" in str(error)
    else:
        assert error is None
