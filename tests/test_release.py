"""Workers release keys on their own (``coro.worker-release.enabled``): the
pure books, then real clusters with distributed's validation on: results,
early releases counted by the scheduler, what is never released, late
revocations recomputed, nothing left afterwards."""

from __future__ import annotations

import dask
import pytest
from distributed import Event, Worker, wait
from distributed.utils_test import async_poll_for, gen_cluster
from filelog import append as _append
from filelog import lines as _lines
from helpers import cluster

import dask_coro
from dask_coro import coroutine
from dask_coro.release.book import Marks, Pending
from dask_coro.release.scheduler import NAME, ReleasePlugin

VALIDATE = {"distributed.scheduler.validate": True, "distributed.worker.validate": True}

# -- the pure books -------------------------------------------------------------


def test_marks_name_dependents_and_revoke_once():
    m = Marks()
    assert m.mark("x", "w1", ["a", "b"]) and not m.mark("x", "w1", ["b", "a"])
    assert m.naming("a") == [("x", "w1")] and m.made == 1 and m.names("x", "b")
    assert m.mark("x", "w1", ["a", "b", "c"])  # a new dependent on the same worker
    assert m.naming("c") == [("x", "w1")]
    assert m.mark("x", "w2", ["d"])  # a copy of x on w2, for d
    assert sorted(m.revoke("x", "w2")) == ["w2"] and m.names("x", "a") and not m.names("x", "d")
    assert m.revoke("x") == ["w1"] and m.revoke("x") == [] and m.revoked == 2
    assert not m.marked and not m.by_dependent
    m.mark("y", "w2", ["a"])
    assert m.drop("y") == ["w2"] and m.revoked == 2 and not m.by_dependent


def test_pending_releases_after_the_last_named_dependent():
    p = Pending()
    assert not p.mark("x", ["a", "b"])
    assert p.finished("a") == [] and "x" in p
    assert p.finished("b") == ["x"] and "x" not in p
    assert p.mark("y", ["a"], finished=["a"])  # all done already: release now
    p.mark("z", ["c"])
    p.revoke("z")
    assert p.finished("c") == [] and not p.waiting and not p.by_dependent


# -- on a cluster ---------------------------------------------------------------


def _leaf(i, folder):
    _append(folder, "leaves", str(i))
    return [i] * 1000


def _add(x, y):
    return [a + b for a, b in zip(x, y)]


def _inc(x):
    return [a + 1 for a in x]


def tree_sum(n, folder):
    level = [dask.delayed(_leaf, pure=True)(i, folder, dask_key_name=f"leaf-{i}") for i in range(n)]
    depth = 0
    while len(level) > 1:
        level = [
            dask.delayed(_add, pure=True)(level[i], level[i + 1], dask_key_name=f"add-{depth}-{i}")
            for i in range(0, len(level), 2)
        ]
        depth += 1
    return level[0]


async def _nothing_left(s, *workers):
    await async_poll_for(lambda: not s.tasks, timeout=20)
    await async_poll_for(lambda: all(not w.data and not w.state.tasks for w in workers), timeout=20)


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config={**VALIDATE, "coro.worker-release.enabled": True})
async def test_a_tree_reduction_releases_its_leaves_early(c, s, a, b, tmp_path):
    await c.register_plugin(ReleasePlugin())
    folder = str(tmp_path)
    total = await c.compute(tree_sum(32, folder))
    assert total == [sum(range(32))] * 1000
    plugin = s.plugins[NAME]
    # Every leaf and inner sum whose dependent ran on its worker: released
    # there, the scheduler told by the worker's own release-worker-data.
    early = sum(w.plugins["dask-coro-release"].pending.released for w in (a, b))
    assert early > 0
    # Each told the scheduler (the last message may still be on its way).
    await async_poll_for(lambda: plugin.released_early == early, timeout=10)
    assert len(_lines(folder, "leaves")) == 32  # nothing computed twice
    await _nothing_left(s, a, b)
    assert not plugin.marks.marked


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=VALIDATE)
async def test_off_by_default_and_installed_by_a_coroutine_when_on(c, s, a, b):
    @coroutine
    def parent():
        x, y = yield [dask.delayed(_add)([1], [2]), dask.delayed(_add)([3], [4])]
        return x + y

    assert await c.compute(parent()) == [3, 7]
    assert NAME not in s.plugins
    with dask.config.set({"coro.worker-release.enabled": True}):
        assert await c.compute(parent()) == [3, 7]
    await async_poll_for(lambda: NAME in s.plugins, timeout=10)
    await async_poll_for(lambda: s.plugins[NAME].ready == {a.address, b.address}, timeout=10)


@gen_cluster(client=True, nthreads=[("", 1)], config=VALIDATE)
async def test_never_released_wanted_scattered_or_a_coroutine_child(c, s, a):
    await c.register_plugin(ReleasePlugin())
    await async_poll_for(lambda: s.plugins[NAME].ready == {a.address}, timeout=10)
    # A key a client holds (persisted), with a dependent on the same worker.
    kept = c.persist(dask.delayed(_add, pure=True)([1], [1], dask_key_name="kept"))
    await wait(kept)
    assert await c.compute(dask.delayed(_add)(kept, [1])) == [3]
    # Scattered data: it cannot be computed again.
    [scattered] = await c.scatter([[5]])
    assert await c.submit(_add, scattered, [1]) == [6]

    # A coroutine's child: held for the coroutine while it waits.
    @coroutine
    def parent():
        x = dask.delayed(_add, pure=True)([1], [2], dask_key_name="child-x")
        y = dask.delayed(_add)(x, [0])
        a, b = yield [x, y]
        return a + b

    assert await c.compute(parent()) == [3, 3]
    plugin = s.plugins[NAME]
    assert plugin.released_early == 0 and plugin.marks.made == 0
    assert "kept" in a.data and scattered.key in a.data


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config={**VALIDATE, "coro.worker-release.enabled": True})
async def test_a_dependent_arriving_after_the_release_recomputes_the_key(c, s, a, b, tmp_path):
    """The late revocation: a client adds a dependent of a key its worker
    released already; the scheduler computes the key again from its lineage."""
    await c.register_plugin(ReleasePlugin())
    await async_poll_for(lambda: len(s.plugins[NAME].ready) == 2, timeout=10)
    folder = str(tmp_path)
    root = tree_sum(4, folder)
    first = c.compute(root)
    assert await first == [sum(range(4))] * 1000
    assert s.plugins[NAME].released_early > 0
    # leaf-0 is released (early or by the scheduler); ask for a new
    # dependent of it, with its lineage, while the root is still held.
    again = dask.delayed(_inc)(dask.delayed(_leaf, pure=True)(0, folder, dask_key_name="leaf-0"))
    assert await c.compute(again) == [1] * 1000
    assert _lines(folder, "leaves").count("0") == 2
    del first
    await _nothing_left(s, a, b)


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config={**VALIDATE, "coro.worker-release.enabled": True})
async def test_a_client_asking_for_a_marked_key_revokes_the_mark(c, s, a, b, tmp_path):
    await c.register_plugin(ReleasePlugin())
    await async_poll_for(lambda: len(s.plugins[NAME].ready) == 2, timeout=10)
    gate = Event()
    leaf = dask.delayed(_leaf, pure=True)(7, str(tmp_path), dask_key_name="leaf-7")

    def gated(x, gate_name):
        Event(gate_name).wait(30)
        return x

    dependent = dask.delayed(gated)(leaf, gate.name, dask_key_name="gated")
    fut = c.compute(dependent)
    plugin = s.plugins[NAME]
    await async_poll_for(lambda: "leaf-7" in plugin.marks.marked, timeout=20)
    # The client wants leaf-7 now: the mark is taken back before the
    # dependent finishes, and the worker keeps the key.
    held = c.compute(leaf)
    await async_poll_for(lambda: "leaf-7" not in plugin.marks.marked, timeout=20)
    await gate.set()
    assert await fut == [7] * 1000
    assert await held == [7] * 1000
    assert plugin.released_early == 0 and plugin.marks.revoked >= 1
    assert len(_lines(str(tmp_path), "leaves")) == 1
    del fut, held
    await _nothing_left(s, a, b)


@pytest.mark.timeout(120)
@gen_cluster(client=True, nthreads=[("", 1)] * 2, config={**VALIDATE, "coro.worker-release.enabled": True}, timeout=100)
async def test_a_worker_lost_mid_reduction_gives_the_right_sum(c, s, a, b, tmp_path):
    await c.register_plugin(ReleasePlugin())
    folder = str(tmp_path)
    fut = c.compute(tree_sum(64, folder))
    await async_poll_for(lambda: len(_lines(folder, "leaves")) >= 16, timeout=30)
    async with Worker(s.address, nthreads=1):
        await b.close()
        assert await fut == [sum(range(64))] * 1000
    del fut
    await _nothing_left(s, a)


def test_public_name():
    assert dask_coro.ReleasePlugin is ReleasePlugin


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config={**VALIDATE, "coro.worker-release.enabled": True})
async def test_a_revocation_that_comes_too_late_recomputes_never_a_wrong_result(c, s, a, b, tmp_path):
    """The worker never hears the revocation (dropped here): it releases the
    key although a new dependent on the other worker needs it. That
    dependent gets the key computed again, from its lineage."""
    await c.register_plugin(ReleasePlugin())
    await async_poll_for(lambda: len(s.plugins[NAME].ready) == 2, timeout=10)
    for w in (a, b):
        w.stream_handlers["dask-coro-keep"] = lambda key, **kw: None
    folder = str(tmp_path)
    first, second = Event(), Event()

    def gated(x, gate_name):
        Event(gate_name).wait(30)
        return x

    leaf = dask.delayed(_leaf, pure=True)(3, folder, dask_key_name="leaf-3")
    d = c.compute(dask.delayed(gated)(leaf, first.name, dask_key_name="d"))
    plugin = s.plugins[NAME]
    await async_poll_for(lambda: "leaf-3" in plugin.marks.marked, timeout=20)
    (holder,) = plugin.marks.marked["leaf-3"]
    other = b if holder == a.address else a
    # A second dependent, pinned to the other worker, that needs leaf-3
    # only once its own gate opens: after leaf-3 was released.
    g2 = dask.delayed(gated)(None, second.name, dask_key_name="g2")
    e = c.compute(dask.delayed(lambda x, _: _inc(x))(leaf, g2, dask_key_name="e"), workers=[other.address])
    await async_poll_for(lambda: "leaf-3" not in plugin.marks.marked, timeout=20)  # revoked (unheard)
    await first.set()
    assert await d == [3] * 1000
    await async_poll_for(lambda: plugin.released_early >= 1, timeout=20)
    await second.set()
    assert await e == [4] * 1000
    assert _lines(folder, "leaves").count("3") == 2  # computed again
    del d, e
    await _nothing_left(s, a, b)


@coroutine(inline=False)
def big(i):
    return [i] * 10_000


@cluster(
    nthreads=[("", 1)],
    config={**VALIDATE, "coro.worker-release.enabled": True, "coro.durability.hold-children": False},
)
async def test_a_coroutine_child_goes_when_its_coroutine_resumes(c, s, a, tmp_path):
    """A child wanted only by its coroutine, on the coroutine's worker: the
    worker lets go of it as soon as the coroutine resumed, telling the
    scheduler on its own stream first, so nothing is computed again."""
    await c.register_plugin(ReleasePlugin())
    await async_poll_for(lambda: len(s.plugins[NAME].ready) == 1, timeout=10)

    @coroutine
    def loop(n, folder):
        total = 0
        for i in range(n):
            x = yield big(i)
            total += x[0]
        _append(folder, "done", "1")
        return total

    assert await c.compute(loop(40, str(tmp_path))) == sum(range(40))
    plugin = s.plugins[NAME]
    early = a.plugins["dask-coro-release"].pending.released
    # Every child but perhaps the first (its mark may come before the
    # worker met its coroutine's client) went without a free-keys.
    assert early >= 39
    await async_poll_for(lambda: plugin.released_early == early, timeout=10)
    await _nothing_left(s, a)
    assert not plugin.for_client


@cluster(nthreads=[("", 1)], config={**VALIDATE, "coro.worker-release.enabled": True})
async def test_children_held_for_their_coroutine_are_not_marked(c, s, a):
    await c.register_plugin(ReleasePlugin())
    await async_poll_for(lambda: len(s.plugins[NAME].ready) == 1, timeout=10)

    @coroutine
    def loop(n):
        total = 0
        for i in range(n):
            total += (yield big(i))[0]
        return total

    assert await c.compute(loop(10)) == sum(range(10))
    assert s.plugins[NAME].released_early == 0 and not s.plugins[NAME].for_client
