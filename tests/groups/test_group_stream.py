"""A stream spawned in a group (``g.spawn(s)``): one ``(child, item)`` per
item, in the stream's order, beside the group's other children; the
producer's error after its items; leaving the group cancels the producer;
the buffer still holds; on a worker, without a cluster and on the client.
Plain Dask has no streaming child to compare with (dask/distributed #4754):
the items are checked against the producer's own list."""

from __future__ import annotations

import asyncio
import logging

import dask
import pytest
from bodies import fails_after, sq
from distributed import Client, Event, LocalCluster, Variable
from distributed.utils_test import async_poll_for, gen_cluster
from helpers import cluster, stream_left_nothing
from workloads import FLAGS, endless, held_producer, watchdog

import dask_coro
from dask_coro import coroutine, emit, stream


@coroutine
def squares(n, offset=0):
    """Emits the squares of offset .. offset+n-1, each a yield of its own first."""
    for i in range(offset, offset + n):
        yield emit((yield sq(i)))
    return n


@coroutine
def merge(n, m):
    """Two streams and a plain child in one group, read in one loop."""
    s1, s2 = stream(squares(n), buffer=2), stream(squares(m, 100))
    got: dict = {}
    with dask_coro.group() as g:
        h1, h2, h3 = g.spawn(s1), g.spawn(s2), g.spawn(sq(7))
        for child, item in g:
            got.setdefault({h1: 1, h2: 2, h3: 3}[child], []).append(item)
        left = len(g)
    return got, s1.result, s2.result, left, h1.done(), h2.done()


def _merged(n, m):
    return {1: [i * i for i in range(n)], 2: [i * i for i in range(100, 100 + m)], 3: [49]}, n, m, 0, True, True


@coroutine
async def amerge(n):
    s = stream(squares(n))
    out = []
    async with dask_coro.group() as g:
        g.spawn(s)
        g.spawn(sq(3))
        async for _, item in g:
            out.append(item)
    return sorted(out)


@coroutine
def error_after_items(k):
    got = []
    with dask_coro.group() as g:
        h = g.spawn(stream(fails_after(k)))
        try:
            for _, item in g:
                got.append(item)
        except ValueError as e:
            return got, str(e), e.dask_coro_child.index == h.index
    return got, None, None


@coroutine
def all_of_them(n):
    with dask_coro.group() as g:
        g.spawn(sq(2))
        g.spawn(stream(squares(n)))
        g.spawn(stream(squares(0)))  # no item at all
        return (yield g.all())


@coroutine
def while_g(n):
    """``while g: yield g.next()`` can find the stream's end with nothing to give."""
    got = []
    with dask_coro.group() as g:
        g.spawn(stream(squares(n)))
        try:
            while g:
                got.append((yield g.next())[1])
        except RuntimeError as e:
            return got, str(e)
    return got, None


# -- a cluster -----------------------------------------------------------------


@cluster(nthreads=[("", 2), ("", 2)])
async def test_items_of_streams_and_a_plain_child_in_one_group(c, s, a, b):
    assert await c.compute(merge(6, 4)) == _merged(6, 4)
    assert await c.compute(amerge(5)) == sorted([9, *(i * i for i in range(5))])
    # Nothing of the streams is left on the scheduler.
    await async_poll_for(lambda: not s.plugins["dask-coro-streams"].books, timeout=30)


@cluster(nthreads=[("", 2), ("", 2)])
async def test_a_producers_error_after_its_items_names_the_child(c, s, a, b):
    assert await c.compute(error_after_items(3)) == ([0, 1, 2], "failed after 3", True)


@cluster(nthreads=[("", 2)])
async def test_all_gives_a_stream_childs_items_as_a_list(c, s, a):
    assert await c.compute(all_of_them(3)) == [4, [0, 1, 4], []]


@cluster(nthreads=[("", 2)])
async def test_next_after_a_streams_last_item_says_to_iterate(c, s, a):
    got, error = await c.compute(while_g(3))
    assert got == [0, 1, 4]
    assert "for child, item in g" in error


@coroutine
def first_over(threshold, tag):
    with dask_coro.group() as g:
        g.spawn(stream(endless(tag), buffer=2))
        for _, x in g:
            if x > threshold:
                return x  # leaving the block cancels the producer


@cluster(nthreads=[("", 2), ("", 2)])
async def test_leaving_the_group_cancels_the_producer(c, s, a, b):
    assert await c.compute(first_over(4, "g1")) == 5
    await stream_left_nothing(s, "g1")


@coroutine
def counted(n, tag):
    for i in range(n):
        Variable(f"{tag}-emitted").set(i)
        yield emit(i)
    return n


@coroutine
def reader_held(n, tag):
    with dask_coro.group() as g:
        g.spawn(stream(counted(n, tag), buffer=2))
        got = []
        for _, x in g:
            got.append(x)
            if x == 0:
                Event(f"{tag}-go").wait()  # the body holds on to its first item's turn
        return got


@cluster(nthreads=[("", 2), ("", 2)])
async def test_the_buffer_holds_in_a_group(c, s, a, b):
    fut = c.compute(reader_held(20, "b1"))
    emitted = Variable("b1-emitted", client=c)
    await async_poll_for(lambda: s.extensions["variables"].variables.get("b1-emitted") is not None, timeout=30)
    import asyncio

    await asyncio.sleep(0.5)  # room for the producer to run ahead, if it could
    # The group took a batch (at most the buffer: 2 items) and waits until
    # the body took them; the producer may fill its buffer again (2 more)
    # and stops at its next emit: item 4 at most.
    assert (await emitted.get()) <= 4
    await Event("b1-go", client=c).set()
    assert await fut == list(range(20))


@coroutine
def until_the_deadline(tag):
    got = []
    with dask_coro.group(timeout=1) as g:
        g.spawn(stream(endless(tag), buffer=2))
        try:
            for _, x in g:  # an endless stream: the deadline ends it
                got.append(x)
        except TimeoutError as e:
            return got[:3], len(got), str(e)
    return got, len(got), None


@coroutine
def cancels_the_stream_child(tag):
    with dask_coro.group() as g:
        h = g.spawn(stream(endless(tag), buffer=1))
        p = g.spawn(sq(5))
        got = []
        for child, x in g:
            if child is h:
                got.append(x)
                if x == 1:
                    h.cancel()  # the rest of this stream is never delivered
            else:
                got.append(("plain", x))
        return sorted(map(str, got)), h.cancelled(), p.done()


@cluster(nthreads=[("", 2), ("", 2)])
async def test_a_deadline_closes_a_stream_child(c, s, a, b):
    got, n, error = await c.compute(until_the_deadline("d1"))
    assert got == [0, 1, 2] and n > 3 and "deadline passed" in error
    await async_poll_for(lambda: "closed-d1" in s.extensions["variables"].variables, timeout=30)
    await async_poll_for(lambda: not s.plugins["dask-coro-streams"].books, timeout=30)


@cluster(nthreads=[("", 2), ("", 2)])
async def test_cancelling_a_stream_child_closes_its_producer(c, s, a, b):
    got, cancelled, plain_done = await c.compute(cancels_the_stream_child("k1"))
    assert cancelled and plain_done
    assert "('plain', 25)" in got and "0" in got and "1" in got
    await async_poll_for(lambda: "closed-k1" in s.extensions["variables"].variables, timeout=30)
    await async_poll_for(lambda: not s.plugins["dask-coro-streams"].books, timeout=30)


@coroutine
def stream_child_left_to_a_watchdog(tag, how):
    """The only child, a stream, is cancelled (its handle's ``cancel()``) or
    closed (the stream's ``close()``) by a watchdog thread while the body
    waits for its first item."""
    s = stream(held_producer(tag))
    with dask_coro.group() as g:
        child = g.spawn(s)
        watchdog(tag, child.cancel if how == "cancel" else s.close)
        try:
            return [x for _, x in g], child.cancelled()
        except RuntimeError as e:
            return str(e), e.dask_coro_child is child


@cluster(nthreads=[("", 2)])
async def test_the_wait_ends_when_a_stream_child_is_cancelled_or_closed_from_elsewhere(c, s, a):
    """Cancelled, the child is never delivered and the loop ends, as for any
    child (``test_group.py``); closed, the stream's iteration raises the
    RuntimeError of a closed stream (``test_stream.py``), here the child's
    error. The first waited for ever; the second raised that the producer
    was released before it ended."""
    for tag, how, expected in [("g1", "cancel", ([], True)), ("g2", "close", ("iterating a stream that was closed", True))]:
        try:
            assert await asyncio.wait_for(c.compute(stream_child_left_to_a_watchdog(tag, how)), 10) == expected
        finally:
            FLAGS[f"release-{tag}"].set()
    await async_poll_for(lambda: not s.plugins["dask-coro-streams"].books, timeout=30)


@coroutine
def leaves_after_the_first_item(k):
    with dask_coro.group() as g:
        g.spawn(stream(fails_after(k)))
        for _, x in g:
            return x


def test_leaving_logs_a_stream_childs_error_never_delivered(caplog):
    """Without a cluster the producer runs to its end before its first item
    is delivered: the body leaving after that item leaves its error behind,
    which is logged (as on a cluster, ``test_group.py``). It was dropped
    silently."""
    with caplog.at_level(logging.WARNING, logger="dask_coro"), dask.config.set(scheduler="sync"):
        assert leaves_after_the_first_item(2).compute() == 0
    [record] = [r for r in caplog.records if r.name == "dask_coro"]
    assert record.levelno == logging.WARNING
    assert "<child 0 of group (done)> ended with an error that was never delivered" in record.getMessage()
    assert "ValueError('failed after 2')" in record.getMessage()


@gen_cluster(client=True, nthreads=[("", 2)])
async def test_a_group_of_streams_on_an_asynchronous_client(c, s, a):
    got = []
    async with dask_coro.group() as g:
        g.spawn(stream(squares(3), buffer=1))
        g.spawn(c.submit(lambda: "plain"))
        async for _, x in g:
            got.append(x)
    assert sorted(map(str, got)) == ["0", "1", "4", "plain"]
    await async_poll_for(lambda: not s.plugins["dask-coro-streams"].books, timeout=30)


# -- without a cluster, and on the client -----------------------------------------


def test_without_a_cluster():
    with dask.config.set(scheduler="sync"):
        assert merge(6, 4).compute() == _merged(6, 4)
        assert error_after_items(2).compute() == ([0, 1], "failed after 2", True)
        assert all_of_them(2).compute() == [4, [0, 1], []]


def test_on_the_client_with_the_default_client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        with Client(lc) as client:
            s1, s2 = stream(squares(4), buffer=1), stream(squares(3, 100))
            got: dict = {}
            with dask_coro.group() as g:
                h1, h2 = g.spawn(s1), g.spawn(s2)
                g.spawn(client.submit(lambda: "plain"))
                for child, item in g:
                    got.setdefault({h1: 1, h2: 2}.get(child, 3), []).append(item)
            assert got == {1: [0, 1, 4, 9], 2: [10000, 10201, 10404], 3: ["plain"]}
            assert (s1.result, s2.result) == (4, 3)
            with dask_coro.group() as g:
                g.spawn(stream(fails_after(2)))
                got2 = []
                with pytest.raises(ValueError, match="failed after 2"):
                    for _, item in g:
                        got2.append(item)
            assert got2 == [0, 1]


def test_bad_spawns():
    with dask.config.set(scheduler="sync"):

        @coroutine
        def twice():
            s = stream(squares(2))
            with dask_coro.group() as g:
                g.spawn(s)
                with pytest.raises(RuntimeError, match="one group, once"):
                    g.spawn(s)
                with pytest.raises(RuntimeError, match="read through it"):
                    list(s)
            s2 = stream(squares(2))
            next(iter(s2))
            with dask_coro.group() as g:
                with pytest.raises(RuntimeError, match="before iterating"):
                    g.spawn(s2)
            return "ok"

        assert twice().compute() == "ok"
