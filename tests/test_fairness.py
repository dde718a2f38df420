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
