"""Coroutines shared by the cluster tests (importable by worker processes)."""

from __future__ import annotations

import threading
from collections import defaultdict

import dask
from bodies import boom  # the modules that took it from here
from distributed import Variable
from filelog import append as _append

from dask_coro import coroutine, emit
from dask_coro.examples import afib, fib, generate_data, inc, my_len, process_all  # noqa: F401


def total_and_data(L):
    """process_all's steps over the list ``L`` (for ``yield from`` in a
    body): the total of ``inc`` over its items, then ``L`` itself."""
    n = yield my_len(L)
    processed = [inc(L[i]) for i in range(n)]
    total = yield sum(processed)
    data = yield L
    return total, data


@coroutine
def process_all_checked():
    """process_all, also returning the list it saw, to check the total."""
    return (yield from total_and_data(generate_data()))


@coroutine
def data_of_length(n):
    return list(range(n))


@coroutine
def process_all_pure(n):
    """process_all over a list of a length the body learns only by asking,
    made by a pure task. Under worker loss a lost result is computed again:
    a task that returns random values (generate_data) may then give a later
    consumer another list than an earlier one saw, in plain Dask as here."""
    return (yield from total_and_data(data_of_length(n)))


@coroutine
def does_not_catch():
    yield inc(1)
    yield [inc(2), boom(8)]
    return "unreachable"


def sequential_fib(i):
    return i if i < 2 else sequential_fib(i - 1) + sequential_fib(i - 2)


@coroutine
def endless(tag):
    """A stream's producer that never ends: it sets the Variable
    ``closed-{tag}`` when it is closed (cancelled)."""
    try:
        i = 0
        while True:
            yield emit(i)
            i += 1
    finally:
        Variable(f"closed-{tag}").set(True)


#: Flags the children of a cluster test and the test's own threads set and
#: wait on (gen_cluster's workers run in the test's process).
FLAGS: defaultdict[str, threading.Event] = defaultdict(threading.Event)


def held(tag):
    """Sets the flag ``started-{tag}``, then runs until the flag
    ``release-{tag}`` is set (60 s at most): a plain function that does not
    end on its own, which no cancel interrupts."""
    FLAGS[f"started-{tag}"].set()
    FLAGS[f"release-{tag}"].wait(60)
    return tag


@coroutine
def runs_until_released(tag):
    """``held`` as a child of a coroutine body."""
    return held(tag)


def watchdog(tag, act):
    """``act()`` from a thread of its own, as a watchdog's, once the flag
    ``started-{tag}`` is set."""

    def run():
        FLAGS[f"started-{tag}"].wait(60)
        act()

    threading.Thread(target=run, daemon=True).start()


@coroutine
def held_producer(tag):
    """A stream's producer that emits nothing until the flag ``release-{tag}``
    is set (``held``; it is submitted when its consumer first waits for an
    item, so that consumer waits while it is held), then one item."""
    yield runs_until_released(tag)
    yield emit(tag)


def list_leaf(i, folder):
    """A list of 1,000 ``i``, logging ``i`` to ``FOLDER/leaves`` when it runs."""
    _append(folder, "leaves", str(i))
    return [i] * 1000


def list_add(x, y):
    return [a + b for a, b in zip(x, y)]


def tree_sum(n, folder):
    """A tree reduction (plain Dask) of ``n`` ``list_leaf`` by ``list_add``:
    the keys ``leaf-{i}`` and ``add-{depth}-{i}``."""
    level = [dask.delayed(list_leaf, pure=True)(i, folder, dask_key_name=f"leaf-{i}") for i in range(n)]
    depth = 0
    while len(level) > 1:
        level = [
            dask.delayed(list_add, pure=True)(level[i], level[i + 1], dask_key_name=f"add-{depth}-{i}")
            for i in range(0, len(level), 2)
        ]
        depth += 1
    return level[0]
