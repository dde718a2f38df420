"""A stream's producer run again after its worker was SIGKILLed: the items
its first run published are not given twice, and a re-run that emits a
different item fails with StreamReplayInconsistentError after the items
before it."""

from __future__ import annotations

import os
import signal
import uuid

import dask
from bodies import after
from distributed import Event, Nanny
from distributed.utils_test import async_poll_for
from helpers import cluster

import dask_coro
from dask_coro import coroutine, emit, stream


def _shared(i, x):
    """Item ``i`` with an array of 1 MiB holding ``x``: it goes through shared
    memory (``stream.remote.SHARED``), its token hashed from the segment."""
    import numpy as np

    return i, np.full(2**17, x, dtype=np.float64)


@coroutine
def replayable(tag, differ, big=False):
    for i in range(3):
        if big:  # the same small part, another array
            yield emit(_shared(i, os.getpid() if differ and i == 0 else i))
        else:
            yield emit(("pid", os.getpid()) if differ and i == 0 else i)
    yield after(f"{tag}-go", None)
    for i in range(3, 5):
        yield emit(_shared(i, i) if big else i)
    return "ok"


@coroutine
def consume(tag, differ, where, big=False):
    got = []
    with dask.annotate(workers=[where], allow_other_workers=True):
        s = stream(replayable(tag, differ, big))
    try:
        for x in s:
            got.append((x[0], float(x[1][-1])) if big else x)
    except Exception as e:
        return got, type(e).__name__
    return got, s.result


async def _run_and_kill(c, s, a, b, differ, big=False):
    tag = f"sr-{uuid.uuid4().hex}"
    fut = c.compute(
        consume(tag, differ, b.worker_address, big), workers=[a.worker_address], allow_other_workers=False
    )
    await _kill_the_producers_worker(s, b, lambda book: book.published == 3 and book.taken >= 3)
    await Event(f"{tag}-go", client=c).set()
    return await fut


async def _kill_the_producers_worker(s, b, when):
    """Once the one stream's book satisfies ``when``, SIGKILL ``b``, the
    worker its producer runs on, and wait until the scheduler lost it."""

    def ready():
        plugin = s.plugins.get("dask-coro-streams")
        books = list(plugin.books.values()) if plugin else []
        return len(books) == 1 and when(books[0])

    await async_poll_for(ready, timeout=60)
    [book] = s.plugins["dask-coro-streams"].books.values()
    address = s.tasks[book.producer].processing_on.address
    assert address == b.worker_address
    os.kill(b.process.process.pid, signal.SIGKILL)
    await async_poll_for(lambda: address not in s.workers, timeout=30)


@cluster(nthreads=[("", 2)] * 2, Worker=Nanny, timeout=120)
async def test_a_re_run_producer_gives_no_item_twice(c, s, a, b):
    assert await _run_and_kill(c, s, a, b, differ=False) == ([0, 1, 2, 3, 4], "ok")


@cluster(nthreads=[("", 2)] * 2, Worker=Nanny, timeout=120)
async def test_a_re_run_producer_emitting_another_item_fails(c, s, a, b):
    got, error = await _run_and_kill(c, s, a, b, differ=True)
    assert got[0][0] == "pid" and got[1:] == [1, 2]
    assert error == "StreamReplayInconsistentError"


@cluster(nthreads=[("", 2)] * 2, Worker=Nanny, timeout=120)
async def test_a_re_run_producer_compares_items_in_shared_memory_by_their_bytes(c, s, a, b):
    """Items holding an array in shared memory: the same bytes again are the
    same item (given once), other bytes under the same small part fail."""
    assert await _run_and_kill(c, s, a, b, differ=False, big=True) == (
        [(i, float(i)) for i in range(5)], "ok"
    )


@cluster(nthreads=[("", 2)] * 2, Worker=Nanny, timeout=120)
async def test_a_re_run_producer_emitting_another_array_fails(c, s, a, b):
    got, error = await _run_and_kill(c, s, a, b, differ=True, big=True)
    assert [i for i, _ in got] == [0, 1, 2] and got[1:] == [(1, 1.0), (2, 2.0)]
    assert error == "StreamReplayInconsistentError"


@coroutine
def hold(name):
    Event(name).wait()


@coroutine
def numbered(tag):
    for i in range(3):
        yield emit(i)
    yield after(f"{tag}-go", None)
    for i in range(3, 5):
        yield emit(i)
    return "ok"


@coroutine
def consume_on(tag, producer_at):
    got = []
    with dask.annotate(workers=[producer_at], allow_other_workers=True):
        s = stream(numbered(tag), buffer=1)  # one item a request: 2 taken when 2 arrives
    for x in s:
        got.append(x)
        if x == 2:
            yield hold(f"{tag}-took")  # a wait, to be killed in
    return got, s.result, os.getpid()


@cluster(nthreads=[("", 2)] * 3, Worker=Nanny, timeout=120)
async def test_a_re_run_consumer_reads_from_the_first_item_again(c, s, a, b, w3):
    """The consumer's worker is SIGKILLed after it took items 0..2: its
    re-run elsewhere reads 0..4 again (its producer runs again under a key
    of its own, the first one let go of), as the same program's plain
    twin, a task that reads a list, would give its whole list again."""
    tag = f"cr-{uuid.uuid4().hex}"
    fut = c.compute(consume_on(tag, b.worker_address), workers=[a.worker_address], allow_other_workers=True)

    def holding():
        return any("hold" in str(k) and ts.state == "processing" for k, ts in s.tasks.items())

    await async_poll_for(holding, timeout=60)
    [(first, book)] = s.plugins["dask-coro-streams"].books.items()
    assert book.taken == 2  # items 0 and 1 let go of: a re-run cannot read them here
    os.kill(a.process.process.pid, signal.SIGKILL)
    await async_poll_for(lambda: a.worker_address not in s.workers, timeout=30)
    await Event(f"{tag}-took", client=c).set()
    await Event(f"{tag}-go", client=c).set()
    got, result, pid = await fut
    assert got == [0, 1, 2, 3, 4] and result == "ok"
    assert pid != a.process.process.pid
    # The first producer was let go of; nothing of either is left.
    await async_poll_for(lambda: first not in s.tasks and not s.plugins["dask-coro-streams"].books, timeout=30)


@coroutine
def consume_in_a_group(tag, where):
    got = []
    with dask.annotate(workers=[where], allow_other_workers=True):
        s = stream(replayable(tag, False), buffer=2)
    with dask_coro.group() as g:
        g.spawn(s)
        g.spawn(after(f"{tag}-plain", "plain"))
        for _, x in g:
            got.append(x)
    return got, s.result


@cluster(nthreads=[("", 2)] * 2, Worker=Nanny, timeout=120)
async def test_a_stream_child_whose_producer_died_gives_each_item_once(c, s, a, b):
    """The producer of a group's stream child is SIGKILLed after 3 items: its
    re-run skips them, the group delivers each item once, in order."""
    tag = f"sg-{uuid.uuid4().hex}"
    fut = c.compute(consume_in_a_group(tag, b.worker_address), workers=[a.worker_address],
                    allow_other_workers=False)
    await _kill_the_producers_worker(s, b, lambda book: book.published == 3)
    await Event(f"{tag}-go", client=c).set()
    await Event(f"{tag}-plain", client=c).set()
    got, result = await fut
    assert [x for x in got if x != "plain"] == [0, 1, 2, 3, 4] and "plain" in got
    assert result == "ok"
