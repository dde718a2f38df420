"""One run of fib(n) (generator) or afib(n) (``async def``, two awaits) inline,
without a cluster, for counting machine instructions per inline call under
callgrind: run it for two n and divide the difference by the calls between.

Run: PYTHONHASHSEED=0 valgrind --tool=callgrind python benchmarks/count_inline.py fib 16
     (and 10; fib(n) makes 2 F(n+1) - 1 calls: 3,193 and 177)
"""

from __future__ import annotations

import sys

import dask

from dask_coro import coroutine


@coroutine
async def afib(i):
    if i < 2:
        return i
    return (await afib(i - 1)) + (await afib(i - 2))


@coroutine
def fib(i):
    if i < 2:
        return i
    a, b = yield [fib(i - 1), fib(i - 2)]
    return a + b


if __name__ == "__main__":
    f = {"afib": afib, "fib": fib}[sys.argv[1]]
    dask.compute(f(int(sys.argv[2])), scheduler="sync")
