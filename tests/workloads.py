"""Coroutines shared by the cluster tests (importable by worker processes)."""

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
    return list(range(random.randint(0, 10)))


@coroutine
def inc(x):
    return x + 1


@coroutine
def my_len(L):
    return len(L)


@coroutine
def process_all():
    L = generate_data()
    n = yield my_len(L)
    processed = [inc(L[i]) for i in range(n)]
    total = yield sum(processed)
    return total


@coroutine
def process_all_checked():
    """process_all, also returning the list it saw, to check the total."""
    L = generate_data()
    n = yield my_len(L)
    processed = [inc(L[i]) for i in range(n)]
    total = yield sum(processed)
    data = yield L
    return total, data


def sequential_fib(i):
    return i if i < 2 else sequential_fib(i - 1) + sequential_fib(i - 2)
