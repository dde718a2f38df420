"""The seed examples: recursive fib (generator and async) and process_all, a
list of unknown length. Used by ``python -m dask_coro`` and importable by
workers, so they pickle by reference."""

from __future__ import annotations

import random

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
    return list(range(random.randint(0, 10)))  # a list of unknown length


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
