"""A group's parent run again after its worker was SIGKILLed is given the
children it had already been given, in the same order, then goes on in
completion order; and keeps the first run's deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest
from bodies import after
from distributed import Event, Nanny, Queue
from distributed.utils_test import async_poll_for
from helpers import cluster

import dask_coro
from dask_coro import coroutine
from dask_coro.durability.order import DeliveryLog


async def _after_async(name, x):
    while not Event(name).is_set():
        await asyncio.sleep(0.02)
    return x


#: A small ``async def`` call: with inline calls on, it runs beside its
#: parent, without a task (``runtime/beside.py``).
after_async = coroutine(_after_async)


@coroutine
def replayed_parent(tag, n, beside=False):
    """Spawns ``n`` children, each ended by its Event, and puts each value
    it is given on the Queue ``tag`` with the run's id; with ``beside``, the
    children run beside it (async ones), else they are tasks."""
    run = uuid.uuid4().hex
    order = []
    child_of = after_async if beside else after
    with dask_coro.group() as g:
        for i in range(n):
            g.spawn(child_of(f"{tag}-{i}", i))
        while g:
            child, value = yield g.next()
            assert value == child.index
            order.append(value)
            Queue(tag).put([run, value])
    return order


async def _kill_the_parents_worker(s, nannies, key):
    await async_poll_for(lambda: key in s.tasks and s.tasks[key].processing_on is not None, timeout=30)
    address = s.tasks[key].processing_on.address
    (victim,) = [nanny for nanny in nannies if nanny.worker_address == address]
    os.kill(victim.process.process.pid, signal.SIGKILL)
    await async_poll_for(lambda: address not in s.workers, timeout=30)


async def _started(c, prefix, key_prefix, parent, *args, **kwargs):
    """``parent(tag, *args, **kwargs)`` computed under the key
    ``{key_prefix}-{tag}``, ``tag`` new; the Queue ``tag`` it reports on.
    Gives ``(tag, key, future, queue)``."""
    tag = f"{prefix}-{uuid.uuid4().hex}"
    key = f"{key_prefix}-{tag}"
    fut = c.compute(parent(tag, *args, dask_key_name=key, **kwargs))
    return tag, key, fut, await Queue(tag, client=c)


@cluster(nthreads=[("", 2)] * 2, Worker=Nanny, timeout=120)
async def test_a_re_run_parent_is_given_the_same_children_in_the_same_order(c, s, a, b):
    tag, key, fut, q = await _started(c, "rp", "rparent", replayed_parent, 6)
    first = [3, 0, 4]
    runs = set()
    for i in first:
        await Event(f"{tag}-{i}", client=c).set()
        run, got = await q.get(timeout=60)
        assert got == i
        runs.add(run)
    await _kill_the_parents_worker(s, (a, b), key)
    # The re-run finds 3, 0 and 4 finished (or computes them again at once:
    # their events are set) and is given them in the first run's order, not
    # in the order they come back now.
    replay = [await q.get(timeout=60) for _ in first]
    assert [v for _, v in replay] == first
    assert {r for r, _ in replay}.isdisjoint(runs)  # another run
    # Then completion order again.
    for i in [5, 1, 2]:
        await Event(f"{tag}-{i}", client=c).set()
        _, got = await q.get(timeout=60)
        assert got == i
    assert await fut == [3, 0, 4, 5, 1, 2]


@pytest.mark.inline
@cluster(nthreads=[("", 2)] * 2, Worker=Nanny, timeout=120)
async def test_a_re_run_parent_is_given_its_beside_children_in_the_same_order(c, s, a, b):
    tag, key, fut, q = await _started(c, "rb", "rbparent", replayed_parent, 5, beside=True)
    first = [2, 4]
    for i in first:
        await Event(f"{tag}-{i}", client=c).set()
        _, got = await q.get(timeout=60)
        assert got == i
    # No child was a task: they ran beside the parent.
    assert set(s.tasks) == {key}
    await _kill_the_parents_worker(s, (a, b), key)
    # The re-run runs them again (no key held them; their events are set, so
    # several finish at once) and is given 2 and 4 first, in that order.
    for i in [0, 1, 3]:
        await Event(f"{tag}-{i}", client=c).set()
    replay = [(await q.get(timeout=60))[1] for _ in range(5)]
    assert replay[:2] == first and sorted(replay[2:]) == [0, 1, 3]
    assert (await fut)[:2] == first


@coroutine
def deadline_parent(tag):
    with dask_coro.group(timeout=3600) as g:
        g.spawn(after(f"{tag}-0", 0))
        Queue(tag).put(g.deadline)
        yield g.next()
        return g.deadline


@cluster(nthreads=[("", 2)] * 2, Worker=Nanny, timeout=120)
async def test_a_re_run_parent_keeps_the_first_runs_deadline(c, s, a, b):
    tag, key, fut, q = await _started(c, "dl", "dparent", deadline_parent)
    first = await q.get(timeout=60)
    # The deadline reaches the scheduler on the run's stream before its
    # next message: wait until it holds it, then kill.
    plugin = s.plugins["dask-coro-durable"] if "dask-coro-durable" in s.plugins else None
    assert plugin is not None, list(s.plugins)
    await async_poll_for(lambda: plugin.deliveries.get(key, 0)["deadline"] is not None, timeout=30)
    await _kill_the_parents_worker(s, (a, b), key)
    await Event(f"{tag}-0", client=c).set()
    assert await fut == first


def test_delivery_log():
    log = DeliveryLog()
    assert log.get("p", 0) == {"deadline": None, "order": []}
    log.record("p", 0, deadline=5.0)
    log.record("p", 0, index=2)
    log.record("p", 0, index=0, deadline=9.0)  # a later deadline is not the first run's
    log.record("p", 1, index=1)
    assert log.get("p", 0) == {"deadline": 5.0, "order": [2, 0]}
    assert log.get("p", 1) == {"deadline": None, "order": [1]}
    log.end("p")
    assert log.get("p", 0) == {"deadline": None, "order": []}


@coroutine
def gated_items(tag, n):
    for i in range(n):
        yield after(f"{tag}-s{i}", None)
        yield dask_coro.emit(i * 10)
    return n


@coroutine
def stream_parent(tag):
    """A stream and a plain child in one group; each delivery on the Queue."""
    run = uuid.uuid4().hex
    got = []
    with dask_coro.group() as g:
        g.spawn(dask_coro.stream(gated_items(tag, 3), buffer=1))
        g.spawn(after(f"{tag}-p", "plain"))
        for child, value in g:
            got.append((child.index, value))
            Queue(tag).put([run, child.index, value])
    return got


@cluster(nthreads=[("", 2)] * 2, Worker=Nanny, timeout=120)
async def test_a_re_run_parent_is_given_a_streams_items_in_the_same_order(c, s, a, b):
    tag, key, fut, q = await _started(c, "rs", "rsparent", stream_parent)
    first = [(0, 0), (1, "plain"), (0, 10)]
    runs = set()
    for gate, want in zip(["s0", "p", "s1"], first, strict=True):
        await Event(f"{tag}-{gate}", client=c).set()
        run, *got = await q.get(timeout=60)
        assert tuple(got) == want
        runs.add(run)
    await _kill_the_parents_worker(s, (a, b), key)
    # The re-run reads the stream from its first item again and is given
    # item 0, the plain child and item 1 in the first run's order.
    replay = [await q.get(timeout=60) for _ in first]
    assert [tuple(r[1:]) for r in replay] == first
    assert {r[0] for r in replay}.isdisjoint(runs)
    await Event(f"{tag}-s2", client=c).set()
    assert await fut == [*first, (0, 20)]
    await async_poll_for(lambda: not s.plugins["dask-coro-streams"].books, timeout=30)
