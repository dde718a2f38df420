"""A waiting coroutine gives its worker resources back and takes them again
before its body goes on (dask/distributed #6565: a seceded task keeps its
resources; PR #6610 proposed lending them from a ``worker_client`` task by
hand). The GPU program of the docs, on a process cluster whose two workers
differ in resources; the same program as a ``worker_client`` task deadlocks.
"""

from __future__ import annotations

import asyncio
import pickle

import dask
import pytest
from distributed import Event, Future, Nanny, get_worker, worker_client
from distributed.utils_test import async_poll_for, gen_cluster
from helpers import cluster

from dask_coro import coroutine
from dask_coro.resources.book import Lending, fits
from dask_coro.resources.scheduler import ResourcePlugin
from dask_coro.resources.worker import ResourceLender

GPU = {"GPU": 1}
ONE_GPU = [("127.0.0.1", 1, {"resources": GPU}), ("127.0.0.1", 1)]  # a GPU worker and a CPU worker
BOUND = 60  # s a condition is waited for at most: a bound, not a measurement


def on_gpu(i, hold=None):
    """A child that needs the GPU: where it ran; with ``hold``, only once
    that Event is set."""
    if hold is not None:
        Event(hold).wait(BOUND)
    return i, get_worker().address


def fails():
    raise ValueError("no GPU memory")


@coroutine
def gpu_parent(n, hold=None):
    with dask.annotate(resources=GPU):
        children = [dask.delayed(on_gpu)(i, hold) for i in range(n)]
    out = yield children
    return out


def gpu_parent_worker_client(n):
    """The same program as a plain task: it secedes in worker_client, and
    keeps its GPU while it waits (dask/distributed #6565)."""
    with worker_client() as client:
        with dask.annotate(resources=GPU):
            futures = client.compute([dask.delayed(on_gpu)(i) for i in range(n)])
        return client.gather(futures)


def _gpu_state(dask_worker):
    """What a worker process holds: free resources, and each task's state."""
    state = dask_worker.state
    return dict(state.available_resources), {str(k): ts.state for k, ts in state.tasks.items()}


# -- the pure book ---------------------------------------------------------------


def test_fits_needs_every_resource_free():
    assert fits({"GPU": 1, "MEM": 2}, {"GPU": 1})
    assert not fits({"GPU": 0.5}, {"GPU": 1})
    assert not fits({}, {"GPU": 1})  # a resource the worker lacks is never free
    assert fits({}, {})


def test_grants_go_in_priority_order_and_stop_at_the_first_that_does_not_fit():
    book = Lending()
    book.lend("big", {"GPU": 2})
    book.lend("small", {"GPU": 1})
    book.lend("late", {"GPU": 1})
    book.wait("small", (1,))
    book.wait("big", (0,))  # ahead of small
    book.wait("late", (2,))
    # One GPU free: big is first and does not fit; nobody passes it.
    assert book.grants({"GPU": 1}) == []
    # Three: big, then small; late does not fit in what is left.
    assert book.grants({"GPU": 3}) == ["big", "small"]
    assert book.grants({"GPU": 4}) == ["big", "small", "late"]
    # A run that cannot take (cancelled meanwhile) is passed over.
    assert book.grants({"GPU": 1}, can_take=lambda key: key != "big") == ["small"]


def test_taken_and_forgotten_runs_leave_the_book():
    book = Lending()
    book.lend("a", GPU)
    book.wait("a", (0,))
    assert book.waiting == 1
    assert book.taken("a") == GPU
    assert book.waiting == 0 and book.lent == {}
    # The same run lends again at its next yield and waits again: one entry.
    book.lend("a", GPU)
    book.wait("a", (0,))
    book.wait("a", (0,))
    assert book.grants({"GPU": 5}) == ["a"]
    assert book.forget("a") == GPU
    assert book.forget("a") is None  # twice: nothing (never released twice)
    assert book.grants({"GPU": 5}) == []


def test_the_book_refuses_what_would_double_count():
    book = Lending()
    book.lend("a", GPU)
    with pytest.raises(ValueError, match="lent its resources already"):
        book.lend("a", GPU)
    with pytest.raises(KeyError, match="lent nothing"):
        book.wait("b", (0,))


def test_keep_resources_is_checked_and_reaches_the_task():
    with pytest.raises(TypeError, match=r"keep_resources=\.\.\.\) expects True or False, got 'yes'"):
        coroutine(keep_resources="yes")(lambda: None)
    kept = coroutine(keep_resources=True)(on_gpu)
    assert kept.options == {"keep_resources": True} and not coroutine(on_gpu).options
    call = kept(1)
    (task,) = [t for k, t in dict(call.dask).items() if k == call.key]
    assert task.func.options == {"keep_resources": True}
    # The run reads it as an option of its function: the runtime names no feature.
    assert pickle.loads(pickle.dumps(task.func)).options == {"keep_resources": True}


# -- a process cluster: a GPU worker and a CPU worker ----------------------------


@gen_cluster(client=True, Worker=Nanny, nthreads=ONE_GPU, timeout=180)
async def test_the_gpu_program_completes_on_a_process_cluster_where_worker_client_deadlocks(c, s, a, b):
    gpu = a.worker_address
    # The coroutine holds the only GPU, its three children each need it.
    out = await asyncio.wait_for(c.compute(gpu_parent(3), resources=GPU), BOUND)
    assert out == [(0, gpu), (1, gpu), (2, gpu)]
    # Nothing leaked or released twice, on either side.
    await async_poll_for(lambda: s.workers[gpu].used_resources == {"GPU": 0}, BOUND)
    free = await c.run(_gpu_state)
    assert free[gpu][0] == GPU and free[b.worker_address][0] == {}

    # The same program as a worker_client task: the parent keeps the GPU
    # while it waits, the children wait for it. Shown stuck (the state it
    # cannot leave), not timed, then cancelled.
    f = c.submit(gpu_parent_worker_client, 3, resources=GPU, key="plain-parent")

    async def stuck():
        available, states = (await c.run(_gpu_state, workers=[gpu]))[gpu]
        children = [st for k, st in states.items() if k != "plain-parent" and "on_gpu" in k]
        return (
            states.get("plain-parent") == "long-running"
            and available == {"GPU": 0}
            and len(children) == 3
            and set(children) == {"constrained"}
        )

    for _ in range(int(BOUND / 0.1)):
        if await stuck():
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the worker_client parent did not reach its deadlock")
    assert s.workers[gpu].used_resources == {"GPU": 4}  # parent and children, as the issue saw
    assert not f.done()
    # Unstick it for the teardown: its worker client still holds the
    # children and waits for them, so cancel those for every client too.
    children = [Future(k, c) for k in s.tasks if "on_gpu" in str(k)]
    await c.cancel([f, *children], force=True)

    async def all_free():
        return (await c.run(_gpu_state, workers=[gpu]))[gpu][0] == GPU

    for _ in range(int(BOUND / 0.1)):
        if await all_free() and s.workers[gpu].used_resources == {"GPU": 0}:
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the GPU was not given back after the cancel")


@gen_cluster(
    client=True, Worker=Nanny, nthreads=[("127.0.0.1", 1, {"resources": GPU}), ("127.0.0.1", 1)], timeout=180
)
async def test_a_gpu_worker_lost_while_its_coroutine_waits_leaks_nothing(c, s, a, b):
    hold = Event("hold")
    f = c.compute(gpu_parent(2, "hold"), resources=GPU)
    gpu = a.worker_address
    await async_poll_for(lambda: any(ts.state == "processing" and "on_gpu" in str(ts.key) for ts in s.tasks.values()), BOUND)
    await a.kill()  # the Nanny's worker process dies while the parent waits with its GPU lent
    await a.start()
    await hold.set()
    out = await asyncio.wait_for(f, BOUND)
    gpu = a.worker_address  # the new worker process
    assert [i for i, _ in out] == [0, 1] and {w for _, w in out} == {gpu}
    await async_poll_for(lambda: gpu in s.workers and s.workers[gpu].used_resources == {"GPU": 0}, BOUND)
    assert (await c.run(_gpu_state, workers=[gpu]))[gpu][0] == GPU


# -- in-process (distributed validates its state after every step) --------------


def _lender(worker):
    return worker.plugins[ResourceLender.name]


@cluster(nthreads=ONE_GPU, timeout=90)
async def test_the_scheduler_counts_the_lent_gpu_as_free_while_the_coroutine_waits(c, s, a, b):
    hold = Event("hold")
    f = c.compute(gpu_parent(2, "hold"), resources=GPU)
    await async_poll_for(lambda: any("on_gpu" in str(ts.key) for ts in a.state.executing), BOUND)
    # The children only: the parent's GPU is lent (distributed counts every
    # task assigned to the worker, queued ones too).
    assert s.workers[a.address].used_resources == {"GPU": 2}
    assert a.state.available_resources == {"GPU": 0}  # the child running has it
    assert isinstance(s.plugins[ResourcePlugin.name], ResourcePlugin)
    await hold.set()
    assert [i for i, _ in await f] == [0, 1]
    await async_poll_for(lambda: s.workers[a.address].used_resources == {"GPU": 0}, BOUND)
    assert a.state.available_resources == GPU
    assert not _lender(a).book.lent


@coroutine(keep_resources=True)
def keeps_gpu(hold):
    out = yield dask.delayed(on_gpu)(0, hold)  # a child that needs no GPU
    return out[0]


@cluster(nthreads=ONE_GPU, timeout=90)
async def test_keep_resources_holds_the_gpu_while_waiting(c, s, a, b):
    hold = Event("hold")
    f = c.compute(keeps_gpu("hold"), resources=GPU, workers=[a.address])
    await async_poll_for(lambda: any("on_gpu" in str(ts.key) for ts in a.state.executing | b.state.executing), BOUND)
    other = c.submit(on_gpu, 9, resources=GPU, key="other")
    await async_poll_for(lambda: "other" in a.state.tasks and a.state.tasks["other"].state == "constrained", BOUND)
    assert a.state.available_resources == {"GPU": 0}  # still the parent's
    assert s.workers[a.address].used_resources == {"GPU": 2}
    await hold.set()
    assert await f == 0
    assert await other == (9, a.address)
    await async_poll_for(lambda: a.state.available_resources == GPU, BOUND)


@coroutine
def waits_then_resumes(hold, resumed):
    yield dask.delayed(on_gpu)(0, hold)  # needs no GPU: only the wait
    Event(resumed).set()  # after the resume, with the GPU taken again
    return "done"


async def _gpu_taken_while_waiting(c, a, b, child, resumed, busy, other_key):
    """``waits_then_resumes`` on ``a``'s GPU, waiting for its child, while
    another task (``other_key``, held until the Event ``busy``) takes the
    GPU it lent; then its child done (the Event ``child`` set): the parent
    waits to take its GPU back. Gives the parent's and the other's futures."""
    f = c.compute(waits_then_resumes(child.name, resumed), resources=GPU, workers=[a.address])
    await async_poll_for(lambda: any("on_gpu" in str(ts.key) for ts in a.state.executing | b.state.executing), BOUND)
    other = c.submit(on_gpu, 9, busy, resources=GPU, key=other_key)
    await async_poll_for(lambda: other_key in a.state.tasks and a.state.tasks[other_key].state == "executing", BOUND)
    await child.set()
    await async_poll_for(lambda: _lender(a).book.waiting == 1, BOUND)
    return f, other


@cluster(nthreads=ONE_GPU, timeout=90)
async def test_the_resume_waits_for_a_gpu_another_task_took_meanwhile(c, s, a, b):
    child, busy, resumed = Event("child"), Event("busy"), Event("resumed")
    # While the parent waits, another task takes the GPU it lent, and still
    # has it when the parent's child is done: the parent waits.
    f, other = await _gpu_taken_while_waiting(c, a, b, child, "resumed", "busy", "other")
    assert not await resumed.is_set()
    assert a.state.available_resources == {"GPU": 0}  # never two holders of the one GPU
    await busy.set()
    assert await f == "done"
    assert await resumed.is_set()
    assert await other == (9, a.address)
    await async_poll_for(lambda: a.state.available_resources == GPU, BOUND)
    assert s.workers[a.address].used_resources == {"GPU": 0}


@cluster(nthreads=ONE_GPU, timeout=90)
async def test_cancelled_while_lent_or_waiting_to_take_leaves_the_gpu_free_once(c, s, a, b):
    # Cancelled while its GPU is lent to a child.
    hold = Event("hold")
    f = c.compute(gpu_parent(2, "hold"), resources=GPU)
    await async_poll_for(lambda: any("on_gpu" in str(ts.key) for ts in a.state.executing), BOUND)
    await f.cancel()
    await hold.set()  # the running child ends (its result is dropped)
    await async_poll_for(lambda: not a.state.tasks, BOUND)
    assert a.state.available_resources == GPU
    assert s.workers[a.address].used_resources == {"GPU": 0}
    assert not _lender(a).book.lent

    # Cancelled while waiting to take its GPU back from another task.
    child, busy = Event("child2"), Event("busy2")
    f, other = await _gpu_taken_while_waiting(c, a, b, child, "resumed2", "busy2", "other2")
    await f.cancel()
    await async_poll_for(lambda: not _lender(a).book.lent, BOUND)
    await busy.set()
    assert await other == (9, a.address)
    del other
    await async_poll_for(lambda: not a.state.tasks, BOUND)
    assert a.state.available_resources == GPU
    assert s.workers[a.address].used_resources == {"GPU": 0}


@coroutine
def catches(n):
    with dask.annotate(resources=GPU):
        bad = dask.delayed(fails)()
    try:
        yield bad
    except ValueError as e:
        # Resumed with the error, holding the GPU again: it may use it.
        out = yield gpu_parent(n)  # a coroutine child that needs the GPU too
        return str(e), len(out)
    return "no error", 0


@cluster(nthreads=ONE_GPU, timeout=90)
async def test_a_childs_error_is_raised_once_the_gpu_is_taken_back(c, s, a, b):
    assert await c.compute(catches(2), resources=GPU) == ("no GPU memory", 2)
    await async_poll_for(lambda: s.workers[a.address].used_resources == {"GPU": 0}, BOUND)
    assert a.state.available_resources == GPU
    assert not _lender(a).book.lent


@coroutine
def nested_gpu(n):
    with dask.annotate(resources=GPU):
        parents = [gpu_parent(2) for _ in range(n)]  # coroutine children on the GPU
    out = yield parents
    return [len(o) for o in out]


@cluster(nthreads=ONE_GPU, timeout=90)
async def test_nested_gpu_coroutines_each_lend_in_turn(c, s, a, b):
    # One GPU: the root lends it to a child coroutine, which lends it to
    # its own children, and so on back up.
    fs = c.compute([nested_gpu(2) for _ in range(3)], resources=GPU)
    assert await c.gather(fs) == [[2, 2]] * 3
    await async_poll_for(lambda: s.workers[a.address].used_resources == {"GPU": 0}, BOUND)
    assert a.state.available_resources == GPU
    assert not _lender(a).book.lent


_OPEN = __import__("threading").Event()  # in-process workers: the test opens it


@coroutine
async def polls_with_asyncio():
    """An async body awaiting asyncio (no cluster wait): it lends its GPU at
    each await, as at a yield."""
    n = 0
    while not _OPEN.is_set():
        await asyncio.sleep(0.01)
        n += 1
    return n > 0


@cluster(nthreads=ONE_GPU, timeout=90)
async def test_an_async_body_lends_its_gpu_while_it_awaits_asyncio(c, s, a, b):
    _OPEN.clear()
    f = c.compute(polls_with_asyncio(), resources=GPU)
    await async_poll_for(lambda: f.key in a.state.tasks and a.state.tasks[f.key].state == "long-running", BOUND)
    # Another GPU task runs and ends while the body still awaits.
    assert await c.submit(on_gpu, 9, resources=GPU, key="between") == (9, a.address)
    assert not f.done()
    _OPEN.set()
    assert await f is True
    await async_poll_for(lambda: a.state.available_resources == GPU, BOUND)
    assert s.workers[a.address].used_resources == {"GPU": 0}
