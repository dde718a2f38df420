"""Fair progress between coroutine trees on one worker (docs/running.md,
"Threads: lanes"): a step of an older tree waiting for a thread of the pool
is served before a younger tree's, and a younger tree's step running calls
inline gives its thread back at its next inline call.

gen_cluster workers share this process: bodies signal each other with
``threading.Event`` objects in module state. No timing assertions: each
test waits on conditions, and the outcome (who saw whom end) is decided by
the order of events.
"""

from __future__ import annotations

import threading
import time

import dask
import pytest
from distributed.utils_test import async_poll_for, gen_cluster

import dask_coro
from dask_coro import coroutine

pytestmark = pytest.mark.inline

FLAGS: dict[str, threading.Event] = {}
TICKS: list[int] = []


def gate() -> int:
    """A plain task that holds its thread until the test opens it."""
    FLAGS["open"].wait(60)
    return 1


@coroutine
def older(where):
    with dask.annotate(workers=[where]):
        # Waits on the cluster: seceded, its thread is free meanwhile.
        x = yield dask.delayed(gate, pure=False)()
    FLAGS["older-done"].set()
    return x + 1


@coroutine
def tick():
    TICKS.append(1)
    time.sleep(0.005)
    return FLAGS["older-done"].is_set()


@coroutine
def younger(n):
    # One step: every call runs inline on the thread the step holds.
    for i in range(n):
        if (yield tick()):
            return i
    return None


@gen_cluster(client=True, nthreads=[("", 1), ("", 1)], timeout=90)
async def test_older_tree_resumes_while_a_younger_one_runs_inline(c, s, a, b):
    """The issue's starvation on one thread: an older tree waits for a child
    while a younger tree takes the thread and runs thousands of calls inline
    in one step. Once the child is done, the older tree gets the thread back
    at the younger tree's next inline call (before, it waited for the
    younger tree's whole step), so the younger tree sees it end."""
    FLAGS.update({"open": threading.Event(), "older-done": threading.Event()})
    TICKS.clear()
    fo = c.compute(older(b.address), workers=[a.address])
    await async_poll_for(lambda: a.state.tasks.get(fo.key) is not None
                         and a.state.tasks[fo.key].state == "long-running", timeout=30)
    fy = c.compute(younger(2_000), workers=[a.address])
    await async_poll_for(lambda: len(TICKS) > 3, timeout=30)
    FLAGS["open"].set()
    assert await fo == 2
    seen = await fy
    assert seen is not None, "the older tree ended only after the younger one's whole step"
    pauses = a.plugins["dask-coro-key-watcher"].lanes.seats.pauses
    assert pauses >= 1


STEPS: list[str] = []


@coroutine
def leaf_step(name, seconds):
    STEPS.append(name)
    time.sleep(seconds)
    return 1


@coroutine
def strategy(name, steps, seconds):
    x = 0
    for _ in range(steps):  # one step of the body: every call runs inline
        x += yield leaf_step(name, seconds)
    return name


@coroutine
def first_of(slow_on, fast_on):
    with dask_coro.group() as g:
        with dask.annotate(workers=[slow_on]):
            g.spawn(strategy("slow", 40, 0.05))
        with dask.annotate(workers=[fast_on]):
            g.spawn(strategy("fast", 2, 0.01))
        _, name = yield g.next()
        return name, STEPS.count("slow")


@gen_cluster(client=True, nthreads=[("", 1), ("", 1)], timeout=90)
async def test_first_of_does_not_wait_for_the_losers_inline_chain(c, s, a, b):
    """The race of docs/groups.md on 1-thread workers, the slow strategy on
    its parent's worker: its chain of 40 inline calls holds the only thread
    there. The parent, woken by next() once the fast one answers, gets the
    thread at the chain's next inline call (the same tree's step held it a
    time slice) instead of after all 40 calls; plain Dask's
    ``wait(FIRST_COMPLETED)`` in a ``worker_client`` task answers as soon."""
    STEPS.clear()
    name, slow_steps = await c.compute(first_of(a.address, b.address), workers=[a.address])
    assert name == "fast"
    assert slow_steps < 40, "the parent resumed only after the loser's whole chain"
    assert a.plugins["dask-coro-key-watcher"].lanes.seats.pauses >= 1
