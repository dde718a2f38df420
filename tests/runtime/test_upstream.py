"""A bug of distributed's own, reproduced without dask_coro, and how dask_coro
keeps clear of it.

dask/distributed #7504: the scheduler's queue (``Scheduler.queued``, a
``HeapSet``) keeps a set and a heap of weak references; a task discarded
from the queue (released, not popped) stays in the heap. TaskStates compare
by key, so when the key is forgotten while its old TaskState is still alive
(anything may hold it: a log record's traceback, a removed worker's
``executing``), and the same key is queued again as a new TaskState, the
queue's ``peek`` hands back the old, forgotten object. With
``distributed.scheduler.validate``, ``stimulus_queue_slots_maybe_opened``
asserts ``qts.state == "queued"`` on it; the handler fails and the worker's
stream with it. Without validation the scheduler moves the key's new task,
rightly. Coroutines submit the same keys again by design (a re-run parent's
children), which is how the chaos test met it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from distributed import Event
from distributed.utils_test import async_poll_for, gen_cluster, inc

from dask_coro.diagnostics.scheduler import NAME as TREE
from dask_coro.diagnostics.scheduler import TreePlugin

VALIDATE = {"distributed.scheduler.validate": True, "distributed.worker.validate": True}


def _block(event):
    event.wait()
    return 0


async def _requeue_a_forgotten_key(c, s):
    """The key ``x-i`` of a queued task is forgotten while its TaskState is
    kept alive, then submitted again and queued while the queue's one slot
    is taken; then the slot opens. Returns the results and the old
    TaskState."""
    gate = Event("gate", client=c)
    blocker = c.submit(_block, gate, key="blocker")
    await async_poll_for(lambda: "blocker" in s.tasks and s.tasks["blocker"].state == "processing", 10)
    # A group larger than twice the threads is root-ish: queued.
    xs = {i: c.submit(inc, i, key=f"x-{i}") for i in range(6)}
    await async_poll_for(lambda: len(s.queued) >= 4, 10)
    key = next(iter(s.queued.sorted())).key
    i = int(key.split("-")[1])
    old = s.tasks[key]  # whatever keeps a forgotten TaskState alive
    del xs[i]
    await async_poll_for(lambda: key not in s.tasks, 10)
    assert old.state == "forgotten"
    again = c.submit(inc, i, key=key)
    await async_poll_for(lambda: key in s.tasks and s.tasks[key].state == "queued", 10)
    await gate.set()
    results = await c.gather([again, blocker, *xs.values()])
    return results, old, i


_PLAIN = textwrap.dedent(
    """
    import asyncio, sys
    sys.modules["dask_coro"] = None  # dask_coro absent: importing it fails
    import dask
    from distributed import Client, Scheduler, Worker
    sys.path.insert(0, {tests!r})
    from test_upstream import _requeue_a_forgotten_key

    async def main():
        with dask.config.set({{"distributed.scheduler.validate": True}}):
            async with Scheduler(dashboard_address=":0", validate=True) as s, \\
                    Worker(s.address, nthreads=1, validate=True), \\
                    Client(s.address, asynchronous=True) as c:
                results, old, i = await asyncio.wait_for(_requeue_a_forgotten_key(c, s), 30)
                print("RESULTS", results[0] == i + 1, results[1:] and results[1] == 0)

    asyncio.run(main())
    """
)


@pytest.mark.xfail(
    strict=True,
    reason="dask/distributed #7504: under validation the scheduler's queue hands back a "
    "forgotten TaskState of a key queued again, and stimulus_queue_slots_maybe_opened "
    "asserts on its state (this passes once distributed fixes it)",
)
def test_plain_distributed_requeues_a_forgotten_key_under_validation():
    """No dask_coro in the process: a key forgotten and submitted again while
    its old TaskState is alive trips distributed's validation, and the
    computation does not finish (the worker's stream closes with the
    handler's error)."""
    import os

    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [sys.executable, "-c", _PLAIN.format(tests=tests)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert "AssertionError: forgotten" not in out, out[-3000:]
    assert "RESULTS True True" in proc.stdout, out[-3000:]


@gen_cluster(client=True, nthreads=[("", 1)], config=VALIDATE)
async def test_the_tree_plugin_cleans_the_queue_of_a_forgotten_requeued_key(c, s, a):
    """The same program with dask_coro's TreePlugin on the scheduler: the
    submission that queues the key again drops the stale heap entry, so
    validation passes, and every result is plain Dask's (``inc``)."""
    await c.register_plugin(TreePlugin())
    plugin = s.plugins[TREE]
    results, old, i = await _requeue_a_forgotten_key(c, s)
    assert results[0] == inc(i) and results[1] == 0
    assert sorted(results[2:]) == sorted(inc(j) for j in range(6) if j != i)
    assert plugin.queue_cleanings == 1
    del old


@pytest.mark.xfail(
    strict=True,
    reason="distributed keeps a key for the fire-and-forget client for ever when "
    "fire_and_forget asks for it after the task finished (the memory transition is where "
    "it lets go); dask_coro's DurablePlugin lets go of it then (this passes once "
    "distributed does)",
)
@gen_cluster(client=True, nthreads=[("", 1)])
async def test_plain_distributed_keeps_a_late_fire_and_forget_key(c, s, a):
    """No dask_coro plugin on this cluster."""
    from distributed import fire_and_forget

    f = c.submit(inc, 1, key="late-ff")
    assert await f == 2
    fire_and_forget(f)
    del f
    await async_poll_for(lambda: "late-ff" not in s.tasks, timeout=5)
