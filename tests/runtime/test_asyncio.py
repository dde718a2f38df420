"""An ``async def`` coroutine may await any asyncio awaitable.

Its steps run on an event loop of the body's own thread (a lane's, on a
worker; one per thread, without a cluster), and while it awaits one the body
holds no thread, as while it waits for children: eight bodies each sleeping
0.5 s on a 1-thread worker sleep at the same time. Awaits of cluster work
(``await gather(...)``, ``await call``) and of asyncio mix in one body. The
same programs as plain distributed ``async def`` tasks give the same values.
"""

from __future__ import annotations

import asyncio
import threading
import time

import dask
import pytest
from bodies import cleared, inc, plain_inc
from distributed import Client, LocalCluster, get_client
from helpers import cluster

import dask_coro
from dask_coro import coroutine, gather

_started: dict = {}  # token -> bodies that started (in-process workers)


_clear = cleared(_started)


@coroutine
async def sleeper(i, seconds, token=None, n=0):
    """Sleeps ``seconds``; with ``token``, first waits (asleep, polling)
    until ``n`` bodies of that token started, or 20 s passed: all ``n``
    were then suspended in asyncio at once."""
    start = time.time()
    together = True
    if token is not None:
        _started[token] = _started.get(token, 0) + 1
        deadline = start + 20
        while _started[token] < n and time.time() < deadline:
            await asyncio.sleep(0.01)
        together = _started[token] >= n
    await asyncio.sleep(seconds)
    end = time.time()
    return i, start, end, together


def _overlap(intervals):
    """Whether every interval contains one common instant."""
    return max(s for s, _ in intervals) < min(e for _, e in intervals)


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_sleeps_overlap_on_one_thread(c, s, a):
    """Eight bodies each sleep 0.5 s on a 1-thread worker: all eight are
    asleep at one instant, so none held the worker's only thread while it
    slept (else the first would wait for the others to start, which need
    that thread, until its deadline)."""
    got = await c.gather(c.compute([sleeper(i, 0.5, "eight", 8) for i in range(8)]))
    assert [g[0] for g in got] == list(range(8))
    assert all(together for *_, together in got)
    assert _overlap([(start, end) for _, start, end, _ in got])
    assert all(end - start >= 0.5 for _, start, end, _ in got)


async def plain_sleeper(i, seconds):
    await asyncio.sleep(seconds)
    return i


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_sleep_values_as_plain_async_tasks(c, s, a):
    got = await c.gather(c.compute([sleeper(i, 0.01) for i in range(3)]))
    plain = await c.gather(c.map(plain_sleeper, range(3), [0.01] * 3, pure=False))
    assert [g[0] for g in got] == plain == [0, 1, 2]


@coroutine
async def mixed(x):
    """Cluster work and asyncio, awaited in turn in one body."""
    thread = threading.get_ident()
    a = await inc(x)  # a child (a task here: inline off)
    await asyncio.sleep(0.01)
    b, c_ = await gather([inc(a), dask.delayed(plain_inc)(a)])
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.call_later(0.01, fut.set_result, b + c_)
    d = await fut  # a future of the loop
    e = await asyncio.wait_for(_later(d), timeout=5)
    try:
        await asyncio.wait_for(asyncio.sleep(10), timeout=0.01)
    except asyncio.TimeoutError:
        timed_out = True
    else:  # pragma: no cover
        timed_out = False
    f = await inc(e)
    return f, timed_out, threading.get_ident() == thread


async def _later(x):
    await asyncio.sleep(0)
    return x + 1


async def plain_mixed(x):
    client = get_client()
    a = await client.submit(plain_inc, x, pure=False)
    await asyncio.sleep(0.01)
    b, c_ = await client.gather([client.submit(plain_inc, a, pure=False), client.submit(plain_inc, a, pure=False)])
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.call_later(0.01, fut.set_result, b + c_)
    d = await fut
    e = await asyncio.wait_for(_later(d), timeout=5)
    try:
        await asyncio.wait_for(asyncio.sleep(10), timeout=0.01)
    except asyncio.TimeoutError:
        timed_out = True
    return plain_inc(e), timed_out, True


@cluster(nthreads=[("127.0.0.1", 1), ("127.0.0.1", 2)], timeout=60)
async def test_cluster_work_and_asyncio_mix_in_one_body(c, s, a, b):
    """On a 1-thread worker; the plain async task, which holds its thread
    while it awaits its children (distributed runs it as an executing task),
    on a 2-thread one."""
    got = await c.compute(mixed(1), workers=[a.address])
    plain = await c.submit(plain_mixed, 1, pure=False, workers=[b.address])
    assert got == plain == (2 * 3 + 1 + 1, True, True)


@pytest.mark.inline
@cluster(nthreads=[("127.0.0.1", 2)], timeout=60)
async def test_inline_async_calls_await_asyncio(c, s, a):
    """Inline on: an async call run inline that awaits asyncio suspends the
    whole stack on the loop; its siblings not started yet are handed out."""

    @coroutine
    def parent(n):
        return sum((yield [napper(i, 0.05) for i in range(n)]))

    @coroutine
    async def napper(i, seconds):
        await asyncio.sleep(seconds)
        return i

    assert await c.compute(parent(6)) == sum(range(6))


async def _serve(reader, writer):
    line = await reader.readline()
    writer.write(b"echo " + line)
    await writer.drain()
    writer.close()


async def plain_fetch(port, text):
    """A network client: asyncio streams against a local server."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(text.encode() + b"\n")
    await writer.drain()
    answer = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return answer.decode().strip()


fetch = coroutine(plain_fetch)  # the same body as a coroutine


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_asyncio_streams_against_a_local_server(c, s, a):
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        got = await c.gather(c.compute([fetch(port, f"hi {i}") for i in range(4)]))
        plain = await c.submit(plain_fetch, port, "hi 0", pure=False)
    finally:
        server.close()
        await server.wait_closed()
    assert got == [f"echo hi {i}" for i in range(4)]
    assert plain == got[0]


@coroutine
async def awaits_a_distributed_future():
    fut = get_client().submit(plain_inc, 1, pure=False)
    return await gather(fut)  # a Future is awaited through gather, as it is yielded


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_a_future_is_awaited_through_gather(c, s, a):
    assert await c.compute(awaits_a_distributed_future()) == 2


@coroutine
async def awaits_a_foreign_object():
    class Odd:
        def __await__(self):
            yield "not a future"

    try:
        await Odd()
    except TypeError as e:
        return str(e)


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_a_foreign_yield_is_refused_at_the_await(c, s, a):
    msg = await c.compute(awaits_a_foreign_object())
    assert "awaited 'not a future', which is neither an asyncio future" in msg


@coroutine
async def sleeps_long(seconds):
    await asyncio.sleep(seconds)
    return "woke"  # pragma: no cover


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_cancelled_while_awaiting_asyncio(c, s, a):
    """Cancelled while it sleeps: the body is closed (its sleep's timer
    cancelled) and the worker's only thread serves the next task."""
    fut = c.compute(sleeps_long(30))
    while not a.state.tasks or all(ts.state != "long-running" for ts in a.state.tasks.values()):
        await asyncio.sleep(0.01)
    await fut.cancel()
    assert await c.compute(inc(1)) == 2


# --------------------------------------------------------------------------
# without a cluster, and the result() form


def test_local_sleeps_and_mixing():
    assert dask.compute(mixed(1), scheduler="sync")[0] == (2 * 3 + 1 + 1, True, True)
    (got,) = dask.compute(sleeper(0, 0.01), scheduler="threads")
    assert got[0] == 0 and got[2] - got[1] >= 0.01


def test_local_streams():
    async def server():
        return await asyncio.start_server(_serve, "127.0.0.1", 0)

    loop = asyncio.new_event_loop()
    srv = loop.run_until_complete(server())
    port = srv.sockets[0].getsockname()[1]
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        assert dask.compute(fetch(port, "x"), scheduler="sync")[0] == "echo x"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        srv.close()
        loop.run_until_complete(srv.wait_closed())
        loop.close()


def test_result_form_with_and_without_a_cluster():
    """dask_coro.result() of an async coroutine that awaits asyncio: in a
    process without a cluster, and through a default client."""
    assert dask_coro.result(mixed(1)) == (2 * 3 + 1 + 1, True, True)
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as lc, Client(lc):
        got = dask_coro.result([sleeper(i, 0.3, "result", 4) for i in range(4)])
    assert all(together for *_, together in got)
    assert _overlap([(start, end) for _, start, end, _ in got])


@coroutine
async def helper_waits():
    """result() in a plain helper of an async body, then asyncio."""
    x = _helper(1)
    await asyncio.sleep(0.01)
    return x


def _helper(x):
    return dask_coro.result(inc(x)) + 1


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_result_in_a_helper_of_an_async_body(c, s, a):
    assert await c.compute(helper_waits()) == 3


# --------------------------------------------------------------------------
# asyncio.wait_for, asyncio.wait and asyncio.timeout around cluster work


_closed: dict = {}  # token -> how each blocked body ended (in-process workers)


@coroutine
async def blocked(token):
    """A child that waits long, recording how its body ended."""
    try:
        await asyncio.sleep(60)
    except BaseException as e:
        _closed[token] = type(e).__name__
        raise
    _closed[token] = "returned"  # pragma: no cover
    return "woke"  # pragma: no cover


@coroutine
async def times_out_and_waits(token):
    """Cluster work awaited through asyncio's timeouts, in the body itself
    and in a Task it made; the children of the one that timed out cancelled."""
    a = await asyncio.wait_for(gather(inc(1)), 30)
    try:
        await asyncio.wait_for(gather([blocked(token), inc(2)]), 0.2)
    except asyncio.TimeoutError:
        b = "timed out"
    done, pending = await asyncio.wait([asyncio.ensure_future(gather([inc(3), inc(4)]))], timeout=30)
    c = [t.result() for t in done], len(pending)
    first, _ = await asyncio.wait(
        [asyncio.ensure_future(gather(blocked(token + "-wait"))), asyncio.ensure_future(gather(inc(5)))],
        return_when=asyncio.FIRST_COMPLETED,
    )
    (d,) = [t.result() for t in first]

    async def timed() -> int:
        async with asyncio.timeout(30):
            return await inc(6)

    e = await asyncio.create_task(timed())
    return a, b, c, d, e


async def _until_closed(*tokens):
    while not all(t in _closed for t in tokens):
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("inline", [False, True])
@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_asyncio_timeouts_around_cluster_work_on_one_thread(c, s, a, inline):
    """asyncio.wait_for, asyncio.wait and asyncio.timeout (in a Task the body
    made) around awaits of cluster work, on a worker of one thread: values
    as awaited directly; on a timeout the children are cancelled (a
    coroutine child's body closed), and nothing stays on the cluster."""
    with dask.config.set({"coro.inline.enabled": inline}):  # the worker is in this process
        got = await c.compute(times_out_and_waits("t"))
    assert got == (2, "timed out", ([[4, 5]], 0), 6, 7)
    # The blocked children were cancelled, not left to sleep out their minute:
    # wait_for's when it timed out, asyncio.wait's when the coroutine returned.
    await _until_closed("t", "t-wait")
    assert _closed == {"t": "GeneratorExit", "t-wait": "GeneratorExit"}
    while s.tasks:  # only the root, until it is released
        await asyncio.sleep(0.01)


def test_asyncio_timeouts_around_work_without_a_cluster():
    """Without a cluster the awaited work is computed at once, as what a body
    yields is: a timeout cannot interrupt it (here none is reached)."""
    got = dask.compute(times_out_without_blocking(), scheduler="sync")[0]
    assert got == (2, [3, 4], 5)


@coroutine
async def times_out_without_blocking():
    a = await asyncio.wait_for(gather(inc(1)), 30)
    done, _ = await asyncio.wait([asyncio.ensure_future(gather([inc(2), inc(3)]))])
    (b,) = [t.result() for t in done]

    async def timed() -> int:
        async with asyncio.timeout(30):
            return await inc(4)

    return a, b, await asyncio.create_task(timed())


@coroutine
async def wait_for_raises():
    try:
        await asyncio.wait_for(gather(failing_child()), 30)
    except ValueError as e:
        return str(e)


@coroutine
def failing_child():
    raise ValueError("from the child")


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_a_childs_error_through_wait_for(c, s, a, caplog):
    """The child's error is raised at the wait_for, and asyncio logs nothing
    (no "Task exception was never retrieved", no "bad yield")."""
    with caplog.at_level("WARNING", logger="asyncio"):
        assert await c.compute(wait_for_raises()) == "from the child"
    assert not [r for r in caplog.records if r.name == "asyncio"]


def test_gather_awaited_in_a_task_no_body_made_names_the_way():
    """Outside any coroutine body (a plain asyncio program), awaiting
    dask_coro.gather raises BadYieldError naming the dask_coro way, not
    asyncio's bare "Task got bad yield"."""

    async def main():
        return await asyncio.wait_for(gather(inc(1)), 1)

    with pytest.raises(dask_coro.BadYieldError, match=r"awaited in an asyncio Task that no coroutine body made"):
        asyncio.run(main())
