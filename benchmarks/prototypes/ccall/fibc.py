"""fib for the C prototype: dask_coro.examples.fib's body under ``_ccall.coroutine``."""

from __future__ import annotations

import _ccall


@_ccall.coroutine
def fib(i):
    if i < 2:
        return i
    a, b = yield [fib(i - 1), fib(i - 2)]
    return a + b


def _fib_body(i):
    if i < 2:
        return i
    a, b = yield [fibd(i - 1), fibd(i - 2)]
    return a + b


def _delayed_type():
    from dask.delayed import Delayed

    return _ccall.make_delayed_type(Delayed)


_delayed_type()
#: The same, its calls instances of a ``dask.delayed.Delayed`` subclass made in C.
fibd = _ccall.coroutine(_fib_body, delayed=True)


def run(n: int, tramp: _ccall.Trampoline | None = None):
    """fib(n) as a worker would wire it: counting per function, a cancelled()
    callback asked every 256 calls, the stop flag and an ``Idle``'s ``n`` read
    before each call (the annotations contextvar only if set_annotations_var
    was called: bench.py's ccall driver)."""
    from dask_coro.core.engine import Idle

    tramp = tramp or _ccall.Trampoline(cancelled=lambda: False, idle=Idle(0))
    return tramp.run(fib(n))
