"""``dask_coro.stream`` and ``dask_coro.emit`` on a cluster, without one and
on the client: items in order while the producer runs, its value after
them, backpressure, an error after k items, cancellation when the consumer
lets go, items as keys."""

from __future__ import annotations

import asyncio
import time

import dask
import pytest
from bodies import cleared, fails_after, sq
from distributed import Client, Event, LocalCluster
from distributed.utils_test import async_poll_for, gen_cluster
from helpers import Recorder, cluster, stream_left_nothing
from workloads import FLAGS, endless, held_producer, watchdog

import dask_coro
from dask_coro import coroutine, emit, stream
from dask_coro.stream.book import item_key

#: The workers of a cluster test run in this process: what producers did.
EMITTING: list = []


@coroutine
def squares(n):
    """Emits n squares, each a yield of its own first; returns n."""
    for i in range(n):
        v = yield sq(i)
        EMITTING.append(i)
        yield emit(v)
    return n


@coroutine
def take_all(n, buffer=None):
    s = stream(squares(n), buffer=buffer)
    out = [x for x in s]
    return out, s.result


@coroutine
async def async_squares(n):
    for i in range(n):
        await emit(await sq(i))
    return "async"


@coroutine
async def async_take_all(n):
    s = stream(async_squares(n), buffer=2)
    out = []
    async for x in s:
        out.append(x)
    return out, s.result


def _emit_from_plain_code(xs):
    for x in xs:
        dask_coro.emit(x)  # no yield: waits here as result() does


@coroutine
def plain_emitter(xs):
    _emit_from_plain_code(xs)
    return len(xs)
    yield  # a generator body


@coroutine
def take_plain(xs):
    s = stream(plain_emitter(xs), buffer=1)
    return list(s), s.result


@coroutine
def take_until_error(k):
    got = []
    try:
        for x in stream(fails_after(k)):
            got.append(x)
    except ValueError as e:
        return got, str(e)
    return got, None


@coroutine
def yields_producer(n):
    """A producer yielded plainly: its value, its items dropped."""
    return (yield squares(n))


_clear = cleared(EMITTING)


# -- a cluster -----------------------------------------------------------------


@cluster(nthreads=[("", 1), ("", 1)])
async def test_items_in_order_then_the_producers_value(c, s, a, b):
    rec = Recorder()
    s.add_plugin(rec)
    out = await c.compute(take_all(20), workers=[a.address])
    assert out == ([i * i for i in range(20)], 20)
    # The producer was a task of its own, each item a key derived from its
    # key; every one let go of once taken.
    [producer] = [k for k in rec.seen if "squares" in str(k) and not str(k).endswith("-item")
                  and not (isinstance(k, tuple) and str(k[0]).endswith("-item"))]
    assert {item_key(producer, i) for i in range(20)} <= rec.seen
    await async_poll_for(lambda: not any(item_key(producer, i) in s.tasks for i in range(20)), timeout=30)


@cluster(nthreads=[("", 2), ("", 2)])
async def test_async_bodies_and_emit_from_plain_code(c, s, a, b):
    assert await c.compute(async_take_all(6)) == ([i * i for i in range(6)], "async")
    assert await c.compute(take_plain([3, None, "x"])) == ([3, None, "x"], 3)


@cluster(nthreads=[("", 2)])
async def test_an_error_after_k_items(c, s, a):
    assert await c.compute(take_until_error(3)) == ([0, 1, 2], "failed after 3")
    assert await c.compute(take_until_error(0)) == ([], "failed after 0")


@cluster(nthreads=[("", 2)])
async def test_a_producer_yielded_plainly_gives_its_value(c, s, a):
    assert await c.compute(yields_producer(4)) == 4
    assert "dask-coro-streams" not in s.plugins or not s.plugins["dask-coro-streams"].books


@coroutine
def wait_for(name):
    Event(name).wait()


@coroutine
def take_slowly(n, buffer, name):
    """Takes one item, then waits for the Event ``name`` (in a child) before
    taking the rest."""
    s = stream(squares(n), buffer=buffer)
    it = iter(s)
    first = next(it)
    yield wait_for(name)
    return [first, *it], s.result


@cluster(nthreads=[("", 2), ("", 2)])
async def test_backpressure_suspends_the_producer_at_its_next_emit(c, s, a, b):
    fut = c.compute(take_slowly(12, 3, "go"))
    plugin = None

    def blocked():
        nonlocal plugin
        plugin = s.plugins.get("dask-coro-streams")
        return plugin is not None and any(bk.blocked is not None for bk in plugin.books.values())

    await async_poll_for(blocked, timeout=30)
    [book] = plugin.books.values()
    # Item 0 taken before the wait: items 0..2 (buffer 3) are published and
    # the producer waits at the emit of item 3, not one item further.
    assert book.blocked == 3
    assert book.published == 3
    assert EMITTING == [0, 1, 2, 3]
    # Its items are keys the scheduler knows, derived from the producer's key.
    assert all(item_key(book.producer, i) in s.tasks for i in range(1, 3))
    await Event("go", client=c).set()
    assert await fut == ([i * i for i in range(12)], 12)


@coroutine
def first_over(threshold, tag):
    s = stream(endless(tag), buffer=2)
    for x in s:
        if x > threshold:
            s.close()
            return x


@cluster(nthreads=[("", 2), ("", 2)])
async def test_a_consumer_that_stops_cancels_the_producer(c, s, a, b):
    assert await c.compute(first_over(4, "t1")) == 5
    # Nothing of the stream is left on the scheduler: the producer and its
    # items (let go of as it is forgotten: the releases of a transition).
    await stream_left_nothing(s, "t1")


@cluster(nthreads=[("", 1)])
async def test_messages_of_a_forgotten_producer_make_no_book(c, s, a):
    """A producer's run may still send after its consumer let go of it and the
    scheduler forgot it (an item on its worker's stream, a wait for room),
    as seen once under validation (slower transitions): no
    book is made for it then, which nothing would ever drop, and the item is
    let go of on its worker."""
    assert await c.compute(take_all(3)) == ([i * i for i in range(3)], 3)
    plugin = s.plugins["dask-coro-streams"]
    await async_poll_for(lambda: not plugin.books, timeout=30)
    gone = "squares-forgotten"
    ik = item_key(gone, 0)
    a.update_data(data={ik: 1})  # the item its run stored before publishing
    plugin.publish(gone, 0, "token", 28, a.address)
    assert await plugin.room(gone, 1, 2) == {"taken": 1, "gone": True}
    assert not plugin.books
    await async_poll_for(lambda: ik not in a.data, timeout=30)


@coroutine
def drops_it(tag):
    s = stream(endless(tag), buffer=1)
    for _ in s:
        break
    del s
    return "dropped"


@cluster(nthreads=[("", 2), ("", 2)])
async def test_dropping_the_stream_cancels_the_producer(c, s, a, b):
    assert await c.compute(drops_it("t2")) == "dropped"
    await async_poll_for(lambda: "closed-t2" in s.extensions["variables"].variables, timeout=30)


@coroutine
def items_as_futures(n):
    """The items go into other tasks as futures, not through this body."""
    s = stream(squares(n), buffer=2)
    futures = list(s.futures())
    keys = [f.key for f in futures]
    values = yield [sq(f) for f in futures]
    return keys, values, s.result


@cluster(nthreads=[("", 2), ("", 2)])
async def test_items_are_keys_other_tasks_depend_on(c, s, a, b):
    keys, values, n = await c.compute(items_as_futures(5))
    assert values == [i ** 4 for i in range(5)] and n == 5
    producer = keys[0][0][: -len("-item")]
    assert "squares" in producer
    assert keys == [item_key(producer, i) for i in range(5)]
    # Let go of once the consumer's futures are gone.
    await async_poll_for(lambda: not any(k in s.tasks for k in keys), timeout=30)


@coroutine
def closed_by_a_watchdog(tag):
    s = stream(held_producer(tag))
    watchdog(tag, s.close)
    try:
        return list(s)
    except RuntimeError as e:
        return str(e)


@coroutine
async def closed_by_a_side_task(tag):
    s = stream(held_producer(tag))

    async def close_once_started():
        while not FLAGS[f"started-{tag}"].is_set():
            await asyncio.sleep(0.01)
        s.close()

    side = asyncio.create_task(close_once_started())
    try:
        return [x async for x in s]
    except RuntimeError as e:
        return str(e)
    finally:
        await side


@cluster(nthreads=[("", 2)])
async def test_a_consumer_waiting_when_the_stream_is_closed_elsewhere(c, s, a):
    """``s.close()`` from a watchdog thread, or from another task of an async
    body, while the consumer waits for an item: the consumer gets the
    RuntimeError of a closed stream (docs/misuse.md), on a worker and on the
    client. It got a DaskCoroError saying the producer was released."""

    async def on_the_client(tag):
        s = stream(held_producer(tag))
        watchdog(tag, s.close)
        try:
            return [x async for x in s]
        except RuntimeError as e:
            return str(e)

    async def run(tag, consumer):
        try:
            return await asyncio.wait_for(consumer, 10)
        finally:
            FLAGS[f"release-{tag}"].set()  # the held producer's thread runs on until then

    closed = "iterating a stream that was closed"
    assert await run("c1", c.compute(closed_by_a_watchdog("c1"))) == closed
    assert await run("c2", c.compute(closed_by_a_side_task("c2"))) == closed
    with c.as_current():
        assert await run("c3", on_the_client("c3")) == closed
    await async_poll_for(lambda: not s.plugins["dask-coro-streams"].books, timeout=30)


@coroutine
def reads_twice(n):
    """A loop stopped early leaves the rest to the next; a loop begun after
    one reached the end raises (never an empty loop)."""
    s = stream(squares(n))
    first = []
    for x in s:
        first.append(x)
        break
    rest = list(s)
    try:
        list(s)
    except RuntimeError as e:
        again = str(e)
    else:
        again = "read nothing, silently"
    return first, rest, again


ALREADY_READ = "iterating a stream that was already read to its end"


@cluster(nthreads=[("", 2)])
async def test_a_stream_read_to_its_end_is_not_read_again(c, s, a):
    first, rest, again = await c.compute(reads_twice(4))
    assert (first, rest) == ([0], [1, 4, 9])
    assert ALREADY_READ in again
    first, rest, again = reads_twice(4).compute(scheduler="sync")
    assert (first, rest) == ([0], [1, 4, 9])
    assert ALREADY_READ in again


# -- without a cluster, and on the client -----------------------------------------


def test_without_a_cluster():
    with dask.config.set(scheduler="sync"):
        assert take_all(5, 2).compute() == ([0, 1, 4, 9, 16], 5)
        assert take_until_error(2).compute() == ([0, 1], "failed after 2")
        assert take_plain([1, 2]).compute() == ([1, 2], 2)
        assert yields_producer(3).compute() == 3


def test_on_the_client_with_the_default_client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        with Client(lc):
            s = stream(squares(5), buffer=2)
            assert list(s) == [0, 1, 4, 9, 16]
            assert s.result == 5
            with pytest.raises(RuntimeError, match=ALREADY_READ):
                list(s)
            s = stream(fails_after(2))
            got = []
            with pytest.raises(ValueError, match="failed after 2"):
                for x in s:
                    got.append(x)
            assert got == [0, 1]
            with pytest.raises(RuntimeError, match=ALREADY_READ):  # not the producer's error again
                list(s)


def test_bad_arguments():
    with pytest.raises(TypeError, match="call of a @coroutine"):
        stream(lambda: 1)
    with pytest.raises(ValueError, match="buffer"):
        stream(squares(1), buffer=0)
    with pytest.raises(RuntimeError, match="coroutine body"):
        emit(1)


@gen_cluster(client=True, nthreads=[("", 2)])
async def test_async_for_on_an_asynchronous_client(c, s, a):
    st = stream(squares(4), buffer=2)
    assert [x async for x in st] == [0, 1, 4, 9]
    assert st.result == 4
    with pytest.raises(RuntimeError, match=ALREADY_READ):
        [x async for x in st]


@coroutine
def outer_producer():
    """Yields a producer plainly (run inline on a worker): its items are
    dropped, only this body's reach the consumer."""
    v = yield squares(3)
    yield emit(("outer", v))
    return v


@coroutine
def take_outer():
    s = stream(outer_producer())
    return list(s), s.result


@cluster(nthreads=[("", 2), ("", 2)])
async def test_a_producer_yielded_inside_a_producer_drops_its_items(c, s, a, b):
    assert await c.compute(take_outer()) == ([("outer", 3)], 3)


@pytest.mark.inline
@cluster(nthreads=[("", 2), ("", 2)])
async def test_streams_with_calls_run_inline(c, s, a, b):
    # The inner producer runs inline in the outer one's run: dropped too.
    assert await c.compute(take_outer()) == ([("outer", 3)], 3)
    assert await c.compute(take_all(10, 3)) == ([i * i for i in range(10)], 10)
    assert await c.compute(take_until_error(2)) == ([0, 1], "failed after 2")


def test_items_taken_are_let_go_of_in_batches(monkeypatch):
    """Each item let go of costs its producer's worker a free-keys message and
    its answer (and a release call per shared-memory segment): the scheduler
    lets go of the items a consumer took ``LET_GO_BATCH`` at a time, the rest
    once the producer is let go of (or ``LET_GO_DELAY`` after the first of a
    batch: long here, so the batches are by count alone)."""
    from dask_coro.stream import scheduler as stream_scheduler

    monkeypatch.setattr(stream_scheduler, "LET_GO_DELAY", 3600.0, raising=False)
    batches = []
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as lc:
        with Client(lc):
            sched = lc.scheduler
            releases = sched.client_releases_keys

            def counted(keys, client, stimulus_id=None):
                if stimulus_id == "dask-coro-stream-taken":
                    batches.append(sorted(k[1] for k in keys))
                return releases(keys=keys, client=client, stimulus_id=stimulus_id)

            monkeypatch.setattr(sched, "client_releases_keys", counted)
            # buffer=1: one item published, then taken, at a time; each request
            # lets go of the one before.
            s = stream(squares(9), buffer=1)
            assert list(s) == [i * i for i in range(9)]
            assert s.result == 9
            assert batches[:2] == [[0, 1, 2, 3], [4, 5, 6, 7]], batches
            del s  # the producer is let go of, and with it the last item
            deadline = time.monotonic() + 30
            while sum(map(len, batches)) < 9 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8]], batches
            assert not [k for k in sched.tasks if isinstance(k, tuple) and str(k[0]).endswith("-item")]


@pytest.mark.parametrize("order", ["C", "F"])
def test_an_items_token_is_the_same_whether_its_arrays_were_hashed_as_copied_or_after(order):
    """A producer hashes an array as it copies it into shared memory
    (``_share``); where it could not, the copy is hashed after. Both give
    the item the same token, so a re-run compares equal either way."""
    pytest.importorskip("xxhash")
    np = pytest.importorskip("numpy")
    import xxhash

    from dask_coro import shm
    from dask_coro.lifetimes.shm import _copy_hashed
    from dask_coro.stream.remote import _token

    a = np.asarray(np.arange(2**18, dtype=np.int32).reshape(512, 512), order=order)
    out = shm.empty(a.shape, a.dtype, order=order)
    h = xxhash.xxh3_128()
    assert _copy_hashed(out, a, h)
    item = {"i": 3, "arrays": [out, "small"]}
    assert _token(item, {id(out): h.hexdigest()}) == _token(item)
    out[0, 0] += 1  # other bytes: another token
    assert _token(item) != _token(item, {id(out): h.hexdigest()})
    del out, item
