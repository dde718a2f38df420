"""A body keeps its thread, and Dask's thread-level API works in a body.

A generator or async body resumes on the thread it started on, for its whole
life, on workers of any thread count: a sqlite3 connection and an ``RLock``
held across yields work, as in the same code run as a ``worker_client``
task. ``secede()``, ``rejoin()``, ``worker_client()``, ``get_client()`` and
a blocking compute in a body (or a helper it calls) have their distributed
meaning on a 1-thread worker: a blocking compute secedes, as in a task, so
its children get the worker's only thread.

Children are tasks here (inline off, the suite's default), so every yield
really suspends its body. gen_cluster workers run in the test's process.
"""

from __future__ import annotations

import asyncio
import collections
import sqlite3
import threading
import time
import uuid

import dask
import distributed
import pytest
from bodies import cleared, inc, plain_inc
from distributed import Worker, get_client, get_worker, rejoin, secede, worker_client
from distributed.utils_test import async_poll_for, gen_cluster
from helpers import Busy, cluster

import dask_coro
from dask_coro import coroutine

_busy = Busy()  # user code holding a thread, counted per worker


_clear = cleared(_busy)



# --------------------------------------------------------------------------
# thread-bound objects held across yields


def _open():
    """A sqlite3 connection (usable only in the thread that made it) and an
    RLock held (releasable only by the thread that acquired it)."""
    conn = sqlite3.connect(":memory:")
    conn.execute("create table t (x)")
    lock = threading.RLock()
    lock.acquire()
    return conn, lock


def _close(conn, lock, threads):
    lock.release()  # RuntimeError ("cannot release un-acquired lock") on another thread
    total = conn.execute("select sum(x) from t").fetchone()[0]
    conn.close()
    return total, len(threads)


@coroutine
def gen_bound(n):
    conn, lock = _open()
    threads = {threading.get_ident()}
    for i in range(n):
        _busy(0.002)
        y = yield inc(i)  # a task: the body suspends here
        conn.execute("insert into t values (?)", (y,))
        threads.add(threading.get_ident())
    return _close(conn, lock, threads)


@coroutine
async def async_bound(n):
    conn, lock = _open()
    threads = {threading.get_ident()}
    for i in range(n):
        _busy(0.002)
        y = await dask_coro.gather(dask.delayed(plain_inc)(i))
        conn.execute("insert into t values (?)", (y,))
        threads.add(threading.get_ident())
    return _close(conn, lock, threads)


def wc_bound(n):
    """The same program as a worker_client task."""
    conn, lock = _open()
    threads = {threading.get_ident()}
    for i in range(n):
        _busy(0.002)
        with worker_client() as c:
            y = c.submit(plain_inc, i, pure=False).result()
        conn.execute("insert into t values (?)", (y,))
        threads.add(threading.get_ident())
    return _close(conn, lock, threads)


@pytest.mark.parametrize("nthreads", [1, 2, 4])
@cluster(nthreads=[], timeout=120)
async def test_thread_bound_objects_survive_yields(c, s, nthreads):
    """More bodies than threads, each holding a sqlite3 connection and an
    RLock across 6 yields: each sees one thread for its whole life, as the
    worker_client task does; never more user code at once than nthreads."""
    n, bodies = 6, 3 * nthreads
    expect = (sum(range(1, n + 1)), 1)
    async with Worker(s.address, nthreads=nthreads) as a:
        futures = c.compute([gen_bound(n) for _ in range(bodies)])
        futures += c.compute([async_bound(n) for _ in range(bodies)])
        got = await c.gather(futures)
        plain = await c.gather(c.map(wc_bound, [n] * 2, pure=False))
    assert got == [expect] * (2 * bodies)
    assert plain == [expect] * 2
    assert 0 < _busy.most(a.address) <= nthreads, _busy.active


@pytest.mark.inline
@cluster(nthreads=[], timeout=120)
async def test_thread_kept_with_inline_calls_and_parked_bodies(c, s):
    """Inline on (the default): a body whose children run inline or are
    handed out, and a helper parked in result(), keep the body's thread."""

    @coroutine
    def helper_bound(n):
        conn, lock = _open()
        threads = {threading.get_ident()}
        for i in range(n):
            a, b = yield [inc(i), dask.delayed(plain_inc)(i)]
            y = dask_coro.result(dask.delayed(plain_inc)(a + b))  # parks a greenlet
            conn.execute("insert into t values (?)", (y,))
            threads.add(threading.get_ident())
        return _close(conn, lock, threads)

    async with Worker(s.address, nthreads=2):
        got = await c.gather(c.compute([helper_bound(4) for _ in range(6)]))
    expect = sum(2 * (i + 1) + 1 for i in range(4))
    assert got == [(expect, 1)] * 6


# --------------------------------------------------------------------------
# secede, rejoin, worker_client, get_client, blocking compute: 1-thread workers


@coroutine
def seceding(x):
    secede()  # as in a task: the pool's thread is let go of
    # The worker's only thread is free: a plain task submitted now runs.
    y = get_client().submit(plain_inc, x, pure=False).result()
    rejoin()
    z = yield inc(y)
    return z


def plain_seceding(x):
    secede()
    y = get_client().submit(plain_inc, x, pure=False).result()
    rejoin()
    return plain_inc(y)


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_secede_and_rejoin_in_a_body(c, s, a):
    got = await c.compute(seceding(1))
    plain = await c.submit(plain_seceding, 1, pure=False)
    assert got == plain == 3


@coroutine
def seceding_twice():
    secede()
    try:
        secede()
    except KeyError:
        pass  # as in a task: distributed says the thread seceded already
    rejoin()
    rejoin()  # rejoining without seceding waits for nothing (a task's would hang)
    return (yield inc(1))


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_secede_twice_and_rejoin_twice(c, s, a):
    def plain():
        secede()
        try:
            secede()
        except KeyError:
            pass
        rejoin()  # (a second rejoin would wait forever here: no thread leaves the pool)
        return 2

    assert await c.compute(seceding_twice()) == await c.submit(plain, pure=False) == 2


@coroutine
def with_worker_client(x):
    y = yield inc(x)
    with worker_client() as client:  # secedes, rejoins at the end
        futures = client.map(plain_inc, range(y), pure=False)
        total = sum(client.gather(futures))
    return total


def plain_worker_client(x):
    y = plain_inc(x)
    with worker_client() as client:
        return sum(client.gather(client.map(plain_inc, range(y), pure=False)))


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_worker_client_in_a_body(c, s, a):
    got = await c.compute(with_worker_client(3))
    plain = await c.submit(plain_worker_client, 3, pure=False)
    assert got == plain == sum(range(1, 5))


@coroutine
def with_get_client(x):
    client = get_client()
    assert client.scheduler.address == get_worker().scheduler.address
    fut = client.submit(plain_inc, x, pure=False)
    y = yield fut  # a Future is yielded as any child
    return y


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_get_client_in_a_body(c, s, a):
    assert await c.compute(with_get_client(1)) == 2


def _helper_computes(x):
    """A plain helper doing a blocking compute, as a library would."""
    return dask.delayed(plain_inc)(x).compute()


@coroutine
def computing(x):
    a = dask.delayed(plain_inc)(x).compute()  # before the first yield: the task executes
    b = yield inc(a)
    c_ = dask.compute(dask.delayed(plain_inc)(b), inc(b))  # after it: long-running
    d = _helper_computes(sum(c_))
    e = inc(d).compute()  # a coroutine call computed as a task of its own
    return e


def plain_computing(x):
    a = dask.delayed(plain_inc)(x).compute()
    b = plain_inc(a)
    c_ = dask.compute(dask.delayed(plain_inc)(b), dask.delayed(plain_inc)(b))
    d = _helper_computes(sum(c_))
    return plain_inc(d)


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_blocking_compute_in_a_body_on_one_thread(c, s, a):
    """A blocking compute in a body, or in a helper it calls, secedes as in
    a task (distributed's Client.get): its children get the worker's only
    thread, and nothing deadlocks."""
    got = await c.compute(computing(1))
    plain = await c.submit(plain_computing, 1, pure=False)
    assert got == plain == 2 * 4 + 2


@coroutine
def blocked_until(name):
    secede()
    return distributed.Event(name).wait(timeout=30)


@coroutine
def setter(name):
    yield inc(0)
    distributed.Event(name).set()
    return threading.current_thread().name


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_a_blocked_body_holds_its_lane_and_others_get_a_new_one(c, s, a):
    """A body blocked after seceding holds its lane, as a seceded task holds
    its thread: the next run gets a new lane (else it would wait behind the
    blocked one, which waits for it); a lane made beyond the worker's cap
    goes with its last run."""
    blocked = c.compute(blocked_until("go"))
    # It seceded (distributed.secede() in the body), and blocks on its lane.
    await async_poll_for(
        lambda: getattr(a.state.tasks.get(blocked.key), "state", None) == "long-running",
        timeout=30,
    )
    name = await c.compute(setter("go"))
    assert await blocked is True
    assert name.startswith("dask-coro-lane")
    lanes = a.plugins["dask-coro-key-watcher"].lanes
    assert len(lanes.lanes) <= lanes.cap  # one made for a held lane goes with its runs


@coroutine
def gather_without_secede():
    fut = get_client().submit(plain_inc, 1, pure=False)
    yield inc(0)
    secede()  # what distributed asks of a task before it blocks in gather
    return get_client().gather(fut)


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_client_gather_after_secede(c, s, a):
    assert await c.compute(gather_without_secede()) == 2


def _helper_waits(fut):
    return fut.result()  # a helper the body calls: a blocking wait, no secede


@coroutine
def blocking_waits_in_a_body():
    client = get_client()
    futs = [client.submit(plain_inc, i, pure=False) for i in range(3)]
    yield inc(0)
    total = sum(client.gather(futs))  # the worker's only thread is needed by these
    total += _helper_waits(client.submit(plain_inc, 10, pure=False))
    [scattered] = client.scatter([5])
    return total + scattered.result()


def blocking_waits_as_a_task():
    with worker_client() as client:
        futs = [client.submit(plain_inc, i, pure=False) for i in range(3)]
        total = sum(client.gather(futs))
        total += client.submit(plain_inc, 10, pure=False).result()
        [scattered] = client.scatter([5])
        return total + scattered.result()


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_blocking_gather_and_result_in_a_body_on_one_thread(c, s, a):
    """client.gather, Future.result and scatter in a body (or a helper it
    calls) on a one-thread worker secede while they wait, as inside
    worker_client: the children they wait for get the thread."""
    assert await c.compute(blocking_waits_in_a_body()) == await c.submit(blocking_waits_as_a_task) == 6 + 11 + 5


def _slow_inc(x):
    time.sleep(0.01 * x)
    return x + 1


def _waits_on_futures(client):
    """What a body (or a worker_client task) does with futures it submitted:
    iterate as_completed, with results, wait, result with a timeout."""
    futs = [client.submit(_slow_inc, i, pure=False) for i in range(3)]
    order = [f.result() for f in distributed.as_completed(futs)]
    more = [client.submit(_slow_inc, i, pure=False) for i in range(3, 5)]
    with_results = sorted(r for _, r in distributed.as_completed(more, with_results=True))
    batched = [client.submit(_slow_inc, i, pure=False) for i in range(5, 7)]
    batches = sorted(f.result() for batch in distributed.as_completed(batched).batches() for f in batch)
    last = [client.submit(_slow_inc, i, pure=False) for i in range(7, 9)]
    done, not_done = distributed.wait(last, timeout=30)
    timed = client.submit(_slow_inc, 9, pure=False).result(timeout=30)
    return sorted(order), with_results, batches, len(done), len(not_done), timed


@coroutine
def waits_on_futures_in_a_body():
    yield inc(0)  # a body that yielded before: no longer the task it started as
    return _waits_on_futures(get_client())


def waits_on_futures_as_a_task():
    with worker_client() as client:
        return _waits_on_futures(client)


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_as_completed_wait_and_result_timeout_in_a_body_on_one_thread(c, s, a):
    """distributed.as_completed (iterated, with results, in batches), wait
    and Future.result(timeout=...) over futures the body submitted through
    the worker's client, on a worker of one thread: each secedes while it
    waits, so those futures get the thread; as the same program in a
    worker_client task."""
    want = ([1, 2, 3], [4, 5], [6, 7], 2, 0, 10)
    assert await c.submit(waits_on_futures_as_a_task, pure=False) == want
    assert await c.compute(waits_on_futures_in_a_body()) == want


@coroutine
def where_am_i():
    a = threading.current_thread().name
    yield inc(1)
    return a, threading.current_thread().name, distributed.get_worker().address


@cluster(nthreads=[("127.0.0.1", 2)], timeout=60)
async def test_get_worker_in_a_body(c, s, a):
    before, after, address = await c.compute(where_am_i())
    assert before == after
    assert address == a.address



# -- client calls that do not wait keep the slot (coro.secede-after) ------------

# Far above any answer's time on a loaded machine: the tests below are about
# which calls wait, not about how fast an answer comes.
_PATIENT = {"coro.secede-after": "30s"}
_GATE = threading.Event()  # the body blocks here without a call of the client


@coroutine
def calls_that_answer_at_once(names):
    """Event.set, a free Lock's acquire and Variable.set before the first
    yield: each is answered at once, none waits for another task."""
    entered, lock, var = names
    distributed.Event(entered).set()
    held = distributed.Lock(lock)
    assert held.acquire()
    distributed.Variable(var).set(1)
    _GATE.wait(30)
    held.release()
    x = yield inc(1)
    return x


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60, config=_PATIENT)
async def test_client_calls_answered_at_once_keep_the_slot(c, s, a):
    """A plain task calling them keeps its slot; so does the body: it is not
    long-running before its first yield (it was, when every call seceded)."""
    _GATE.clear()
    f = c.compute(calls_that_answer_at_once(("entered", "lock", "var")))
    await distributed.Event("entered", client=c).wait()
    var = distributed.Variable("var", client=c)
    await async_poll_for(lambda: "var" in s.extensions["variables"].variables, 30)
    assert await var.get() == 1
    key = f.key
    assert a.state.tasks[key].state == "executing"
    assert s.tasks[key] not in s.workers[a.address].long_running
    assert s.workers[a.address].occupancy > 0  # counted, as a plain task's
    _GATE.set()
    assert await f == 2


def long_running(lock, entered):
    """distributed's test_long_running_not_in_occupancy, as a plain task."""
    entered.set()
    secede()
    lock.acquire()
    return "done"


@coroutine
def long_running_body(lock, entered):
    """The same, as a coroutine body."""
    entered.set()
    secede()
    lock.acquire()
    return "done"
    yield


@pytest.mark.parametrize("kind", ["task", "coroutine"])
@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=60, config=_PATIENT)
async def test_long_running_not_in_occupancy_as_in_distributed(c, s, a, kind):
    lock, entered = distributed.Lock(), distributed.Event()
    await lock.acquire()
    if kind == "task":
        f = c.submit(long_running, lock, entered)
    else:
        f = c.compute(long_running_body(lock, entered))
    await entered.wait()
    ws = s.workers[a.address]
    # Executing until it secedes itself: entered.set() did not.
    assert s.tasks[f.key] in ws.processing
    await async_poll_for(lambda: ws.occupancy == 0, 30)
    await lock.release()
    assert await f == "done"
    assert s.total_occupancy == 0


@coroutine
def waits_then_secedes(first, second):
    first.wait()
    secede()
    second.wait()
    return 1
    yield


@pytest.mark.parametrize("secede_after", [None, "50ms"], ids=["never", "default"])
def test_secede_opens_slot_as_in_distributed(secede_after):
    """distributed's test_secede_opens_slot, as coroutines. With
    ``coro.secede-after: null`` as there: first.wait() holds the only slot,
    the others queue behind it. With the default, a call that waits
    secedes, so all five wait as long-running tasks, none holding the slot."""

    @cluster(nthreads=[("127.0.0.1", 1)], timeout=60, config={"coro.secede-after": secede_after})
    async def run(c, s, a):
        first, second = distributed.Event(client=c), distributed.Event(client=c)
        fs = c.compute([waits_then_secedes(first, second) for _ in range(5)])
        await async_poll_for(lambda: a.state.executing or a.state.long_running, 30)
        if secede_after is None:
            assert len(a.state.executing) == 1 and not a.state.long_running
        else:
            await async_poll_for(lambda: len(a.state.long_running) == 5, 30)
        await first.set()
        await async_poll_for(lambda: len(a.state.long_running) == 5, 30)
        await second.set()
        assert await c.gather(fs) == [1] * 5

    run()


def _blocked(name):
    distributed.Event(name).wait(30)
    return "late"


@coroutine
def result_with_timeout(name):
    fut = get_client().submit(_blocked, name, pure=False)
    try:
        fut.result(timeout=0.2)  # waits: secedes after coro.secede-after, then times out
    except TimeoutError as e:
        return type(e).__name__
    return "no timeout"
    yield


def result_with_timeout_as_a_task(name):
    with worker_client() as client:
        fut = client.submit(_blocked, name, pure=False)
        try:
            fut.result(timeout=0.2)
        except TimeoutError as e:
            return type(e).__name__
        return "no timeout"


# Three threads: the blocked children keep theirs after the timeout (a
# running task is not stopped), and each parent rejoins the pool after.
@cluster(nthreads=[("127.0.0.1", 3)], timeout=60)
async def test_a_blocking_call_with_a_timeout_times_out_as_in_a_task(c, s, a):
    assert await c.compute(result_with_timeout("never1")) == "TimeoutError"
    assert await c.submit(result_with_timeout_as_a_task, "never2") == "TimeoutError"
    for name in ("never1", "never2"):
        await distributed.Event(name, client=c).set()


#: Gates the bodies below wait on (threading.Event: a wait on one holds the
#: body's thread; gen_cluster workers share this process).
GATES: collections.defaultdict[str, threading.Event] = collections.defaultdict(threading.Event)


@coroutine
def rejoins_after(name):
    secede()
    GATES[f"{name}-seceded"].set()
    GATES[f"{name}-go"].wait(60)
    rejoin()  # waits for a thread of the pool: the only one is held
    GATES[f"{name}-rejoined"].set()
    return 1


@coroutine
def holds_the_thread(name):
    GATES[f"{name}-held"].set()
    GATES[f"{name}-free"].wait(60)
    return 2


@cluster(nthreads=[("127.0.0.1", 1)], timeout=60)
async def test_a_body_waiting_in_rejoin_goes_on_when_its_worker_closes(c, s, a):
    """A body that seceded and waits in ``rejoin()`` for a thread of the pool
    goes on when its worker closes. Worker.close clears the pool's queue,
    so nothing would ever serve it: its lane thread would wait for ever
    (distributed's ``rejoin`` has no timeout) and outlive the worker, which
    the cluster's thread-leak check reports (seen as a flake of
    test_group's deadline test, whose children wait on Events)."""
    name = f"rejoin-{uuid.uuid4().hex}"
    rejoining = c.compute(rejoins_after(name))
    await async_poll_for(GATES[f"{name}-seceded"].is_set, timeout=30)
    holding = c.compute(holds_the_thread(name))
    await async_poll_for(GATES[f"{name}-held"].is_set, timeout=30)
    GATES[f"{name}-go"].set()
    seats = a.plugins["dask-coro-key-watcher"].lanes.seats
    await async_poll_for(lambda: bool(seats._waiting), timeout=30)  # rejoin() waits for the held thread
    assert not GATES[f"{name}-rejoined"].is_set()
    closing = asyncio.create_task(a.close())
    await async_poll_for(GATES[f"{name}-rejoined"].is_set, timeout=30)
    GATES[f"{name}-free"].set()  # the holder's step ends, and with it the worker's close
    await closing
    del rejoining, holding
