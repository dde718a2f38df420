"""The examples of dask/distributed #1663: recursive fib (generator and async) and process_all, a
list of unknown length, as the README writes them. Used by ``python -m dask_coro`` and
importable by workers, so they pickle by reference."""

from __future__ import annotations

import dask

import dask_coro
from dask_coro import coroutine


@coroutine
def fib(i):
    if i < 2:
        return i
    a, b = yield [fib(i - 1), fib(i - 2)]
    return a + b


@coroutine
async def afib(i):
    if i < 2:
        return i
    a, b = await dask_coro.gather([afib(i - 1), afib(i - 2)])
    return a + b


@coroutine
def generate_data():
    # A list whose length only the cluster knows. #1663 draws it at random; the
    # README's fixed one makes the demo print what the README says (55).
    return list(range(10))


@coroutine
def inc(x):
    return x + 1


@coroutine
def my_len(L):
    return len(L)


@coroutine
def process_all():
    L = generate_data()  # a lazy call, nothing waits
    n = yield my_len(L)
    processed = [inc(L[i]) for i in range(n)]
    total = yield sum(processed)
    return total


@coroutine
def array_total(a):
    return float(a.sum())


@coroutine
def shared_totals(n, readers):
    """One array in shared memory, read by ``readers`` tasks without a copy;
    its segment is released when this task's key is forgotten."""
    from dask_coro import shm

    a = shm.empty(n)  # tied to this coroutine's key
    a[:] = 1.0
    totals = yield [array_total(a) for _ in range(readers)]  # each gets a handle
    return totals


# -- Promise: the README's example -----------------------------------------------


@dask.delayed
def initial(x):
    return list(range(x))


@dask.delayed
def subtask(s):
    return s * 10


@dask.delayed
def aggregate(sub):
    return sum(sub)


@dask.delayed
def subprocess(initial_results, result_promise):
    sub = [subtask(s) for s in initial_results]
    result_promise.resolve_with(aggregate(sub))  # rewire and return at once


def logical_task(x):
    """A Promise that downstream work may depend on at once; a task decides
    at run time what computes it. Needs a distributed Client."""
    p = dask_coro.Promise()
    p.resolve_with(subprocess(initial(x), p))
    return p
