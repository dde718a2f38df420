"""fib for the C prototype: dask_coro.examples.fib's body under ``_ccall.coroutine``."""

from __future__ import annotations

import _ccall


@_ccall.coroutine
def fib(i):
    if i < 2:
        return i
    a, b = yield [fib(i - 1), fib(i - 2)]
    return a + b


def run(n: int, tramp: _ccall.Trampoline | None = None):
    """fib(n) as a worker would wire it: counting per function, a cancelled()
    callback asked every 256 calls, the stop flag read before each call."""
    tramp = tramp or _ccall.Trampoline(cancelled=lambda: False)
    return tramp.run(fib(n))
