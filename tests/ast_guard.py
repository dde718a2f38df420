"""``ast.parse`` that builds its tree with garbage collection held off, for the
test session on the CPython releases whose AST constructor races (3.11 before
3.11.8; ``tests/conftest.py`` installs it there).

The race (CPython gh-106905, fixed by GH-113035): the C code that turns a
parsed module into ``ast`` objects (``PyAST_mod2obj``) counts its recursion
depth in state the whole interpreter shares, and checks at the end that the
count came back to where it started. It runs no Python code of its own, so the
thread building a tree keeps the GIL, unless one of its allocations starts a
garbage collection: the finalizers, weakref callbacks and frees a collection
runs may run Python code (or release the GIL), and another thread, or code on
this one, that builds a tree meanwhile resets the shared count. The first tree
then fails with ``SystemError: AST constructor recursion depth mismatch
(before=N, after=M)``. ``ast.literal_eval`` and ``ast.parse`` build trees;
so does formatting a traceback on 3.11 (its ``^^^`` lines). A coroutine body
decoding a program while another worker's thread formats a traceback or
decodes its own, as the conformance suite does, hits it now and then.

With collection held off, building a tree runs no Python code: no other thread
builds one meanwhile, and no finalizer does on this thread. The collection
happens at the next allocation after the parse. Nothing is caught or retried.
Code that builds trees without ``ast.parse`` (``compile(..., ast.PyCF_ONLY_AST)``
called directly) is not covered.
"""

from __future__ import annotations

import ast
import gc
import sys
import threading
from typing import Any

#: Whether this interpreter has the race (tests/runtime/test_ast_race.py reproduces it).
AFFECTED = (3, 11) <= sys.version_info[:3] < (3, 11, 8)

#: ``ast.parse`` as the interpreter defines it.
original_parse = ast.parse

_lock = threading.Lock()
_holding = 0  # parses under way with collection held off
_was_enabled = False  # whether collection was on when the first of them began


def parse(*args: Any, **kwargs: Any) -> Any:
    """``ast.parse``, with garbage collection off while it runs."""
    global _holding, _was_enabled
    with _lock:
        if _holding == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holding += 1
    try:
        return original_parse(*args, **kwargs)
    finally:
        with _lock:
            _holding -= 1
            if _holding == 0 and _was_enabled:
                gc.enable()


def install() -> None:
    """Make ``ast.parse`` (and with it ``ast.literal_eval`` and traceback
    formatting, which look it up on the module) the guarded one."""
    ast.parse = parse  # type: ignore[assignment]
