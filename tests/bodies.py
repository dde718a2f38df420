"""The small bodies and fixtures the test modules share, defined once.

Worker processes import these functions by this module's name (tests/ is
on their ``PYTHONPATH``: tests/conftest.py). Keys derive from a function's
name, so a test that looks for the keys of ``sq`` finds them whichever
module it imports ``sq`` from. A body that does more than the one line
below (logs a call, waits on a flag) stays in its module."""

from __future__ import annotations

from distributed import Event

from dask_coro import coroutine, emit
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


@coroutine
def after(name, x):
    """``x`` once the distributed Event ``name`` is set."""
    Event(name).wait()
    return x


@coroutine
def fails_after(k):
    """A stream's producer: emits 0 .. k-1, then raises ValueError."""
    for i in range(k):
        yield emit(i)
    raise ValueError(f"failed after {k}")


@coroutine
def yields_one_by_one(child, n):
    """The sum of ``child(i)`` for ``i < n``, a yield each: a sequential loop."""
    total = 0
    for i in range(n):
        total += yield child(i)
    return total


def first_items_one_by_one(child, n):
    """For ``yield from`` in a body: yields ``child(i)`` for ``i < n``, one
    at a time, letting go of each result before the next; the sum of their
    first items."""
    total = 0
    for i in range(n):
        a = yield child(i)
        total += a[0]
        del a
    return total


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
