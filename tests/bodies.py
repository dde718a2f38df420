"""The small bodies and fixtures the test modules share, defined once.

Worker processes import these functions by this module's name (tests/ is
on their ``PYTHONPATH``: tests/conftest.py). Keys derive from a function's
name, so a test that looks for the keys of ``sq`` finds them whichever
module it imports ``sq`` from. A body that does more than the one line
below (logs a call, waits on a flag) stays in its module."""

from __future__ import annotations

from dask_coro import coroutine
from dask_coro.examples import inc  # noqa: F401 (the coroutine ``x + 1``, shared with the examples)


def plain_inc(x):
    """``x + 1`` as a plain function: a task's (``client.submit``,
    ``dask.delayed``), or called in a body."""
    return x + 1


@coroutine
def sq(x):
    return x * x


@coroutine
def add(x, y):
    return x + y


@coroutine
def leaf(x, k=0):
    return x + k


@coroutine
def boom(x):
    raise ValueError(f"boom {x}")  # BOOM-LINE


def cleared(*stores):
    """An autouse fixture that empties each of ``stores`` (a list, dict, set,
    or anything with ``clear()``: the module state in-process workers record
    into) before and after every test of the module that assigns it, as
    ``_clear = cleared(LOG)``."""
    import pytest  # not at the top: scripts (memcheck.py) import this module

    @pytest.fixture(autouse=True)
    def _clear():
        for store in stores:
            store.clear()
        yield
        for store in stores:
            store.clear()

    return _clear
