"""Dask features a user reaches for around a yield, each as a coroutine and
as the same program in a ``worker_client`` task, on one cluster, with calls
inline (the default) and with every call a task. The rows of
docs/dask-features.md that say "works" point here (and to
tests/runtime/test_annotations.py, tests/runtime/test_threads.py, tests/runtime/test_asyncio.py).
"""

from __future__ import annotations

import dask
import dask.array as da
import pytest
from bodies import plain_inc
from distributed import (
    Event,
    Lock,
    Queue,
    Variable,
    fire_and_forget,
    futures_of,
    get_client,
    span,
    worker_client,
)
from distributed.utils_test import async_poll_for, gen_cluster

from dask_coro import coroutine
from dask_coro.examples import inc

TIMEOUT = 30  # s a blocking primitive waits at most: a bound, not a measurement


def times_ten(x):
    return x * 10


def double(x):
    return x * 2


@coroutine(inline=False)
def inc_task(x):
    """A child that is a task whatever the setting: a real wait on the cluster."""
    return x + 1


def on_cluster(nthreads=(2,), **kwargs):
    """Run the decorated ``async def test(c, s, *workers)`` on a gen_cluster,
    once with calls inline (the default) and once with every call a task."""

    def decorate(test):
        @pytest.mark.parametrize("inline", [True, False], ids=["inline", "tasks"])
        def run(inline):
            config = {"coro.inline.enabled": inline}
            # timeout: a bound above the primitives' own TIMEOUT on a busy machine.
            gen_cluster(
                client=True, nthreads=[("", n) for n in nthreads], config=config, timeout=90, **kwargs
            )(test)()

        run.__name__ = test.__name__
        return run

    return decorate


async def no_tasks_left(s):
    await async_poll_for(lambda: not s.tasks, timeout=TIMEOUT)


# -- fire_and_forget -------------------------------------------------------------------


def record(name, value):
    Variable(name).set(value)
    return value


@coroutine
def record_later(name):
    """A coroutine fired and forgotten: it outlives its caller."""
    value = yield inc_task(1)
    Variable(name).set(value)
    return value


@coroutine
def fires(name):
    client = get_client()
    fire_and_forget(client.submit(record, f"{name}-task", "fired", pure=False))
    fire_and_forget(client.compute(record_later(f"{name}-coroutine")))
    return "done"


def fires_wc(name):
    with worker_client() as wc:
        fire_and_forget(wc.submit(record, f"{name}-task", "fired", pure=False))
        fire_and_forget(wc.compute(record_later(f"{name}-coroutine")))
    return "done"


@on_cluster()
async def test_fire_and_forget(c, s, a):
    assert await c.compute(fires("coro")) == await c.submit(fires_wc, "wc") == "done"
    for who in ("coro", "wc"):
        assert await Variable(f"{who}-task", client=c).get(timeout=TIMEOUT) == "fired"
        assert await Variable(f"{who}-coroutine", client=c).get(timeout=TIMEOUT) == 2
    for name in ("coro-task", "coro-coroutine", "wc-task", "wc-coroutine"):
        Variable(name, client=c).delete()
    await no_tasks_left(s)


@on_cluster()
async def test_fire_and_forget_of_a_task_that_already_finished(c, s, a):
    """fire_and_forget's ask goes on the client's stream after the graph, so
    a fast task can finish before it (the race behind a leftover key seen in
    the test above): the key is let go of all the same. Plain distributed
    keeps it for ever (tests/runtime/test_upstream.py)."""
    assert await c.compute(record_later("warm")) == 2  # dask_coro's plugins, installed at first use
    Variable("warm", client=c).delete()
    f = c.submit(record, "late", "finished", pure=False)
    assert await f == "finished"  # in memory before fire_and_forget asks for it
    fire_and_forget(f)
    del f
    Variable("late", client=c).delete()
    await no_tasks_left(s)


# -- Variable ----------------------------------------------------------------------------


@coroutine
def uses_variable(name):
    v = Variable(name)
    v.set(41)
    x = yield inc_task(v.get())
    v.set(get_client().submit(times_ten, x, pure=False))  # a Future through a Variable
    return x


def uses_variable_wc(name):
    with worker_client() as wc:
        v = Variable(name, client=wc)
        v.set(41)
        x = wc.submit(plain_inc, v.get(), pure=False).result()
        v.set(wc.submit(times_ten, x, pure=False))
    return x


@on_cluster()
async def test_variable(c, s, a):
    assert await c.compute(uses_variable("coro")) == await c.submit(uses_variable_wc, "wc") == 42
    for name in ("coro", "wc"):
        v = Variable(name, client=c)
        assert await (await v.get(timeout=TIMEOUT)) == 420
        v.delete()
    await no_tasks_left(s)


# -- Queue --------------------------------------------------------------------------------


@coroutine
def producer(name, n):
    q = Queue(name)
    for i in range(n):
        q.put((yield inc_task(i)))
    return n


@coroutine
def consumer(name, n):
    q = Queue(name)
    return [q.get(timeout=TIMEOUT) for _ in range(n)]


@coroutine
def pipeline(name, n):
    """Producer first: inline, the consumer runs after it in the same step
    (a consumer first would block the step its producer needs)."""
    return (yield [producer(name, n), consumer(name, n)])


def producer_wc(name, n):
    q = Queue(name)
    with worker_client() as wc:
        for i in range(n):
            q.put(wc.submit(plain_inc, i, pure=False).result())
    return n


def consumer_wc(name, n):
    q = Queue(name)
    return [q.get(timeout=TIMEOUT) for _ in range(n)]


def pipeline_wc(name, n):
    with worker_client() as wc:
        return wc.gather([wc.submit(producer_wc, name, n, pure=False), wc.submit(consumer_wc, name, n, pure=False)])


@on_cluster()
async def test_queue(c, s, a):
    ours = await c.compute(pipeline("coro", 4))
    theirs = await c.submit(pipeline_wc, "wc", 4)
    assert ours == theirs == [4, [1, 2, 3, 4]]
    await no_tasks_left(s)


# -- Lock ----------------------------------------------------------------------------------


@coroutine
def locked_add(lock_name, var_name):
    """Read, wait on the cluster, write: with the lock held across the yield,
    no update is lost."""
    with Lock(lock_name):
        v = Variable(var_name)
        x = v.get()
        y = yield inc_task(x)
        v.set(y)
    return y


@coroutine
def contend(lock_name, var_name, n):
    Variable(var_name).set(0)
    results = yield [locked_add(lock_name, var_name) for _ in range(n)]
    return sorted(results), Variable(var_name).get()


def locked_add_wc(lock_name, var_name):
    with Lock(lock_name):
        v = Variable(var_name)
        x = v.get()
        with worker_client() as wc:
            y = wc.submit(plain_inc, x, pure=False).result()
        v.set(y)
    return y


def contend_wc(lock_name, var_name, n):
    with worker_client() as wc:
        Variable(var_name, client=wc).set(0)
        futures = [wc.submit(locked_add_wc, lock_name, var_name, pure=False) for _ in range(n)]
        return sorted(wc.gather(futures)), Variable(var_name, client=wc).get()


# Three contenders, four threads: two may block in acquire while the holder's
# child runs (as with worker_client, a blocked acquire holds its thread).
@on_cluster(nthreads=(2, 2))
async def test_lock(c, s, a, b):
    ours = await c.compute(contend("coro-lock", "coro-count", 3))
    theirs = await c.submit(contend_wc, "wc-lock", "wc-count", 3)
    assert ours == theirs == ([1, 2, 3], 3)
    for name in ("coro-count", "wc-count"):
        Variable(name, client=c).delete()
    await no_tasks_left(s)


# -- Event ---------------------------------------------------------------------------------


@coroutine(inline=False)
def waits_for(name):
    """Blocks its thread in wait(): a task of its own, never inline."""
    return Event(name).wait(timeout=TIMEOUT)


@coroutine
def sets(name):
    Event(name).set()
    return "set"


@coroutine
def signal(name):
    return (yield [waits_for(name), sets(name)])


@coroutine
def waits_for_the_client(name):
    ready = Event(name).wait(timeout=TIMEOUT)
    return ready, (yield inc(1))


def waits_for_wc(name):
    return Event(name).wait(timeout=TIMEOUT)


def sets_wc(name):
    Event(name).set()
    return "set"


def signal_wc(name):
    with worker_client() as wc:
        return wc.gather([wc.submit(waits_for_wc, name, pure=False), wc.submit(sets_wc, name, pure=False)])


def waits_for_the_client_wc(name):
    ready = Event(name).wait(timeout=TIMEOUT)
    with worker_client() as wc:
        return ready, wc.submit(plain_inc, 1, pure=False).result()


@on_cluster()
async def test_event(c, s, a):
    assert await c.compute(signal("coro")) == await c.submit(signal_wc, "wc") == [True, "set"]
    # A coroutine waiting for a signal from outside the cluster.
    ours = c.compute(waits_for_the_client("coro-outside"))
    theirs = c.submit(waits_for_the_client_wc, "wc-outside")
    await Event("coro-outside", client=c).set()
    await Event("wc-outside", client=c).set()
    assert await ours == await theirs == (True, 2)
    del ours, theirs
    await no_tasks_left(s)


# -- persist -------------------------------------------------------------------------------


@coroutine
def persists():
    arr = da.arange(10, chunks=5).persist()  # the worker's client, as in a task
    held = len(futures_of(arr))
    total = yield arr.sum()
    arr2 = get_client().persist(da.arange(10, chunks=5) * 2)
    return held, int(total), int((yield arr2.sum())), int((yield arr2)[-1])


def persists_wc():
    with worker_client() as wc:
        arr = wc.persist(da.arange(10, chunks=5))
        held = len(futures_of(arr))
        total = wc.compute(arr.sum()).result()
        arr2 = wc.persist(da.arange(10, chunks=5) * 2)
        return held, int(total), int(wc.compute(arr2.sum()).result()), int(wc.compute(arr2).result()[-1])


@on_cluster()
async def test_persist(c, s, a):
    assert await c.compute(persists()) == await c.submit(persists_wc, pure=False) == (2, 45, 90, 18)
    await no_tasks_left(s)


# -- publish_dataset -------------------------------------------------------------------------


@coroutine
def publishes(name):
    client = get_client()
    client.publish_dataset(**{name: client.persist(da.arange(6, chunks=3))})
    return int((yield client.get_dataset(name).sum()))


def publishes_wc(name):
    with worker_client() as wc:
        wc.publish_dataset(**{name: wc.persist(da.arange(6, chunks=3))})
        return int(wc.compute(wc.get_dataset(name).sum()).result())


@on_cluster()
async def test_publish_dataset(c, s, a):
    assert await c.compute(publishes("coro")) == await c.submit(publishes_wc, "wc") == 15
    assert sorted(await c.list_datasets()) == ["coro", "wc"]
    for name in ("coro", "wc"):
        assert list(await c.compute(await c.get_dataset(name))) == list(range(6))
        await c.unpublish_dataset(name)
    await no_tasks_left(s)


# -- spans -----------------------------------------------------------------------------------


@coroutine
def in_a_span(tag):
    with span(tag) as span_id:
        a, b = yield [inc_task(1), dask.delayed(double)(3)]
    return a + b, span_id


def in_a_span_wc(tag):
    with worker_client() as wc, span(tag) as span_id:
        a, b = wc.gather(wc.compute([dask.delayed(plain_inc)(1), dask.delayed(double)(3)]))
    return a + b, span_id


def span_groups(s, span_id):
    spans = s.extensions["spans"].spans
    return spans[span_id].name, sorted(group.name for group in spans[span_id].groups)


@on_cluster()
async def test_span(c, s, a):
    total, ours = await c.compute(in_a_span("coro-span"))
    same, theirs = await c.submit(in_a_span_wc, "wc-span")
    assert total == same == 8
    # The span opened in the body holds the children, nested as a
    # worker_client task's span is (distributed names a span by its path).
    (their_path, their_groups), (our_path, our_groups) = span_groups(s, theirs), span_groups(s, ours)
    assert their_path[-1] == "wc-span" and our_path[-1] == "coro-span"
    assert our_path[:-1] == their_path[:-1]
    assert their_groups == ["double", "plain_inc"] and our_groups == ["double", "inc_task"]


# -- the table ---------------------------------------------------------------------------------


def test_every_working_row_of_the_table_names_its_test():
    import pathlib
    import re
    import sys

    page = pathlib.Path(__file__).parents[2] / "docs" / "dask-features.md"
    rows = [line for line in page.read_text().splitlines() if line.startswith("| ") and "---" not in line]
    rows = rows[1:]  # the header
    assert len(rows) >= 24
    here = sys.modules[__name__]
    for row in rows:
        _feature, works, how, test = (cell.strip() for cell in row.strip("|").split(" | "))
        assert works in ("works", "doesn't work"), row
        assert how, row
        if works != "works":
            continue
        ref = re.fullmatch(r"`(tests/\w+/test_\w+\.py)(?:::(\w+))?`", test)
        assert ref, row
        path, name = ref.groups()
        if path == "tests/runtime/test_dask_features.py":
            assert name and callable(getattr(here, name, None)), row
        else:  # the tests of annotations, threads and asyncio: the named test is there
            assert name, row
            source = (pathlib.Path(__file__).parents[2] / path).read_text()
            assert f"def {name}(" in source, row
