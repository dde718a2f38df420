"""Workers release keys on their own (``coro.worker-release.enabled``): the
pure books, then real clusters with distributed's validation on: results,
early releases counted by the scheduler, what is never released, late
revocations recomputed, nothing left afterwards."""

from __future__ import annotations

import asyncio
import dataclasses

import dask
import pytest
from bodies import first_items_one_by_one
from distributed import Event, SchedulerPlugin, Worker, wait
from distributed.utils_test import BlockedGatherDep, async_poll_for, gen_cluster, inc
from distributed.worker_state_machine import ComputeTaskEvent, FreeKeysEvent
from filelog import append as _append
from filelog import lines as _lines
from helpers import cluster
from workloads import list_add, list_leaf, tree_sum

import dask_coro
from dask_coro import coroutine
from dask_coro.release.book import FINISHED, MARK, Dependents, Marks, Pending
from dask_coro.release.scheduler import NAME, ReleasePlugin
from dask_coro.release.worker import ReleaseWorkerPlugin
from dask_coro.runtime.extensions import Extension, register, unregister

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


def test_a_mark_grows_one_dependent_at_a_time_and_goes_with_its_worker():
    m = Marks()
    assert not m.name("x", "w1", "a")  # no mark to grow
    assert m.mark("x", "w1", ["a"]) and m.is_marked("x", "w1") and not m.is_marked("x", "w2")
    assert m.name("x", "w1", "b") and not m.name("x", "w1", "b")
    assert m.naming("b") == [("x", "w1")] and m.named == 2 and m.made == 1
    m.mark("y", "w1", ["c"])
    m.mark("x", "w2", ["d"])
    m.drop_worker("w1")
    assert m.marked == {"x": {"w2": {"d"}}} and m.by_worker == {"w2": {"x"}}
    assert m.naming("a") == [] and m.naming("c") == [] and m.revoked == 0
    m.clear()
    assert not m.marked and not m.by_dependent and not m.by_worker and m.made == 3


def test_pending_grows_a_mark_or_marks_anew():
    p = Pending()
    assert not p.mark("x", ["a"])
    assert not p.extend("x", ["b", "a"])
    assert p.finished("a") == [] and p.finished("b") == ["x"]
    # Its dependents all finished before the growth came: marked anew.
    assert not p.extend("x", ["c"]) and p.waiting == {"x": {"c"}}
    assert p.extend("y", ["d"], finished=["d"])  # nothing left: release now


def _brute(key, graph, states, where):
    """What ``Dependents`` should count for ``key``, from the whole graph."""
    deps = [d for d, ks in graph.items() if key in ks]
    on: dict = {}
    for d in deps:
        if states[d] == "processing":
            on.setdefault(where[d], set()).add(d)
    return len(deps), sum(states[d] in FINISHED for d in deps), on


def test_dependents_count_as_the_whole_graph_does():
    """Random transitions of the dependents of a few keys: the counts kept
    from each transition equal those read from the whole graph."""
    import random

    rng = random.Random(7)
    keys = ["k0", "k1", "k2"]
    graph = {f"d{i}": set(rng.sample(keys, rng.randint(1, 2))) for i in range(40)}
    states = dict.fromkeys(graph, "waiting")
    where: dict = {}
    book = Dependents()
    for k in keys[:2]:
        book.watch(k, [(d, states[d], None) for d, ks in graph.items() if k in ks])
    assert book.scanned == sum(1 for ks in graph.values() for k in ks if k in keys[:2])
    moves = {
        "waiting": ["processing"], "processing": ["memory", "erred", "released"],
        "memory": ["released", "forgotten"], "erred": ["forgotten"], "released": ["waiting", "forgotten"],
    }
    for step in range(600):
        d = rng.choice([d for d in graph if states[d] != "forgotten"] or ["-"])
        if d == "-":
            break
        start = states[d]
        finish = rng.choice(moves[start])
        worker = rng.choice(["w1", "w2"]) if finish == "processing" else None
        states[d] = finish
        if worker is not None:
            where[d] = worker
        book.moved(d, start, finish, worker)
        if finish == "forgotten":
            graph[d] = set()
        if step == 300:  # k2 starts being watched midway; k0 leaves memory
            book.watch("k2", [(x, states[x], where.get(x)) for x, ks in graph.items() if "k2" in ks])
            book.unwatch("k0")
        for k in keys:
            if not book.watched(k):
                continue
            n, done, on = _brute(k, graph, states, where)
            assert (book.counted(k), book.done[k], book.on[k]) == (n, done, on), (step, k)
            for w in ("w1", "w2"):
                assert book.settled_on(k, w) == (n == done + len(on.get(w, ())))
    for k in keys:
        book.unwatch(k)
    assert not book.members and not book.of and not book.where and not book.on


def _assign_all(d):
    """One key with ``d`` dependents assigned one at a time to one worker,
    as the plugin does: the entries read and names sent."""
    book, marks = Dependents(), Marks()
    deps = [f"d{i}" for i in range(d)]
    book.watch("x", [(k, "queued", None) for k in deps])
    for i, k in enumerate(deps):
        book.moved(k, "queued", "processing", "w")
        if book.settled_on("x", "w"):
            if marks.is_marked("x", "w"):
                marks.name("x", "w", k)
            else:
                marks.mark("x", "w", book.processing_on("x", "w"))
        if i % 2:  # half finish while the others are assigned
            book.moved(deps[i - 1], "processing", "memory")
    assert book.settled_on("x", "w") and marks.is_marked("x", "w")
    return book.scanned, marks.named


def test_one_key_with_many_dependents_costs_linear_entries():
    """4x the dependents read 4x the entries and send 4x the names (walking
    every dependent for each one assigned, as before, is 16x)."""
    small, large = _assign_all(500), _assign_all(2000)
    assert large[0] == 4 * small[0] == 2000
    assert large[1] <= 4 * small[1] and large[1] <= 2000


# -- on a cluster ---------------------------------------------------------------


def _inc(x):
    return [a + 1 for a in x]


async def _nothing_left(s, *workers):
    await async_poll_for(lambda: not s.tasks, timeout=20)
    await async_poll_for(lambda: all(not w.data and not w.state.tasks for w in workers), timeout=20)


class _CheckCounts(SchedulerPlugin):
    """After every transition, each key ``ReleasePlugin`` watches has the
    counts its dependents' states give (read from the whole scheduler)."""

    name = "test-check-counts"

    def __init__(self, release):
        self.release = release
        self.wrong: list = []
        self.checks = 0

    def transition(self, key, start, finish, *args, **kwargs):
        deps = self.release.deps
        for k in deps.members:
            self.checks += 1
            dependents = self.scheduler.tasks[k].dependents
            on: dict = {}
            for d in dependents:
                if d.state == "processing":
                    on.setdefault(d.processing_on.address, set()).add(d.key)
            want = (len(dependents), sum(d.state in FINISHED for d in dependents), on)
            got = (deps.counted(k), deps.done[k], deps.on[k])
            if got != want:
                self.wrong.append((key, start, finish, k, got, want))


def _make(n):
    return [1] * n


def _use(x, i):
    return len(x) + i


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    config={**VALIDATE, "coro.worker-release.enabled": True, "distributed.scheduler.work-stealing": False},
)
async def test_one_key_with_many_dependents_is_read_once_and_marked_one_name_each(c, s, a, b):
    """The case worker release is for: one large key, many tasks using it.
    Each dependent assigned costs the scheduler O(1): the key's dependents
    are read once (``scanned``), a mark grows by one name per dependent
    (``named``), for D and 4 D dependents alike, on the key's own worker and
    on a worker that fetches a copy; the counts match the scheduler's states
    after every transition; the results are plain Dask's."""
    await c.register_plugin(ReleasePlugin())
    await async_poll_for(lambda: s.plugins[NAME].ready == {a.address, b.address}, timeout=10)
    plugin = s.plugins[NAME]
    check = _CheckCounts(plugin)
    check.scheduler = s
    s.add_plugin(check)
    costs = {}
    for where in (a, b):  # the key always on a: its own worker, then a copy on b
        for d in (50, 200):
            with dask.annotate(workers=[a.address]):
                x = dask.delayed(_make, pure=True)(1000, dask_key_name=f"x-{d}-{where.name}")
            with dask.annotate(workers=[where.address]):
                tasks = [dask.delayed(_use, pure=True)(x, i) for i in range(d)]
            scanned, named, early = plugin.deps.scanned, plugin.marks.named, plugin.released_early
            got = await c.gather(c.compute(tasks))
            assert got == list(dask.compute(*tasks, scheduler="sync"))
            await async_poll_for(lambda: not s.tasks, timeout=20)
            costs[where.name, d] = (plugin.deps.scanned - scanned, plugin.marks.named - named)
            # the key (and, on b, its copy) went from its worker on its own
            assert plugin.released_early > early
    assert not check.wrong, check.wrong[:3]
    assert check.checks > 0
    for w in (a, b):
        (scanned, named), (scanned4, named4) = costs[w.name, 50], costs[w.name, 200]
        assert scanned == 50 and scanned4 == 200, costs
        assert 0 < named <= 50 and 0 < named4 <= 200, costs
    assert not plugin.deps.members and not plugin.deps.of and not plugin.marks.marked


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
        x, y = yield [dask.delayed(list_add)([1], [2]), dask.delayed(list_add)([3], [4])]
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
    kept = c.persist(dask.delayed(list_add, pure=True)([1], [1], dask_key_name="kept"))
    await wait(kept)
    assert await c.compute(dask.delayed(list_add)(kept, [1])) == [3]
    # Scattered data: it cannot be computed again.
    [scattered] = await c.scatter([[5]])
    assert await c.submit(list_add, scattered, [1]) == [6]

    # A coroutine's child: held for the coroutine while it waits.
    @coroutine
    def parent():
        x = dask.delayed(list_add, pure=True)([1], [2], dask_key_name="child-x")
        y = dask.delayed(list_add)(x, [0])
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
    again = dask.delayed(_inc)(dask.delayed(list_leaf, pure=True)(0, folder, dask_key_name="leaf-0"))
    assert await c.compute(again) == [1] * 1000
    assert _lines(folder, "leaves").count("0") == 2
    del first
    await _nothing_left(s, a, b)


@gen_cluster(client=True, nthreads=[("", 1)], config={**VALIDATE, "coro.worker-release.enabled": True})
async def test_a_key_named_held_here_after_its_early_release_is_missing_not_fetched_from_nobody(c, s, a):
    """The crossing the property test met: a worker released its copy of
    ``d`` early, the worker it had fetched ``d`` from was lost, and the
    scheduler, not yet told of the release, names this worker as ``d``'s
    only holder in a ``compute-task`` while ``d`` waits here to be fetched
    again (its holder's address busy with another transfer). distributed
    drops this worker from ``who_has`` and left ``d`` in ``fetch`` with no
    holder: ``InvalidTaskState`` under validation, a dependent waiting for
    ever without. Now ``d`` is ``missing`` (asked again of the scheduler)."""
    await c.register_plugin(ReleasePlugin())
    await async_poll_for(lambda: a.address in s.plugins[NAME].ready, timeout=10)
    gone = "tcp://127.0.0.1:1"  # the lost worker: nothing listens there
    handler = a.stream_handlers["compute-task"]

    def compute_task(key, who_has):
        ev = ComputeTaskEvent.dummy(key, who_has=who_has, stimulus_id=f"test-{key}")
        handler(**{f.name: getattr(ev, f.name) for f in dataclasses.fields(ev)})

    # In one go, as one batch of the stream: no transfer starts in between.
    compute_task("x0", {"d0": [gone]})  # a transfer from the lost worker in flight
    compute_task("x1", {"d": [gone]})  # d waits for it: fetch
    assert a.state.tasks["d"].state == "fetch"
    compute_task("x2", {"d": [a.address]})  # the scheduler's view, before the release
    assert a.state.tasks["d"].state == "missing" and not a.state.tasks["d"].who_has
    assert a.status.name == "running"
    a.handle_stimulus(FreeKeysEvent(keys=["x0", "x1", "x2"], stimulus_id="test-free"))
    await async_poll_for(lambda: not a.state.tasks, timeout=10)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    Worker=BlockedGatherDep,
    config={**VALIDATE, "coro.worker-release.enabled": True, "distributed.comm.timeouts.connect": "2s"},
)
async def test_a_compute_the_worker_drops_on_its_own_is_given_back_to_the_scheduler(c, s, a, b):
    """The stall the property test met: worker ``a`` lets go of its copy of
    ``x`` (an early release), fetches ``x`` again for a new dependent, and
    ``x``'s holder is lost meanwhile: the scheduler asks ``a`` to compute
    ``x`` while the transfer is in flight (``resumed``). A dependent of
    ``x`` released on ``a`` then releases ``x`` with it
    (``WorkerState._transition_generic_released``), and the scheduler, never
    told, waited for ``x`` for ever. ``a`` now gives it back
    (``reschedule``) once the transfer ended."""
    await c.register_plugin(ReleasePlugin())
    await async_poll_for(lambda: len(s.plugins[NAME].ready) == 2, timeout=10)
    a.block_gather_dep.set()  # transfers go through, until the one below
    x = c.submit(inc, 1, key="x", workers=[b.address], allow_other_workers=True)
    k = c.submit(inc, x, key="k", workers=[a.address])
    assert await k == 3
    if a.address in {ws.address for ws in s.tasks["x"].who_has}:  # not released early already
        s.request_remove_replicas(a.address, ["x"], stimulus_id="test-remove")
    await async_poll_for(lambda: "x" not in a.data and a.state.tasks["x"].state == "released", timeout=5)
    a.in_gather_dep.clear()
    a.block_gather_dep.clear()
    m = c.submit(inc, x, key="m", workers=[a.address])
    await a.in_gather_dep.wait()  # x in flight from b
    await b.close()
    await async_poll_for(lambda: a.state.tasks["x"].state == "resumed", timeout=5)
    del k  # released on a, and x with it
    await async_poll_for(lambda: a.state.tasks["x"].state == "cancelled", timeout=5)
    a.block_gather_dep.set()  # the transfer from b fails
    assert await asyncio.wait_for(m, 20) == 3
    assert a.plugins[ReleaseWorkerPlugin.name].rescheduled == 1


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config={**VALIDATE, "coro.worker-release.enabled": True})
async def test_a_client_asking_for_a_marked_key_revokes_the_mark(c, s, a, b, tmp_path):
    await c.register_plugin(ReleasePlugin())
    await async_poll_for(lambda: len(s.plugins[NAME].ready) == 2, timeout=10)
    gate = Event()
    leaf = dask.delayed(list_leaf, pure=True)(7, str(tmp_path), dask_key_name="leaf-7")

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

    leaf = dask.delayed(list_leaf, pure=True)(3, folder, dask_key_name="leaf-3")
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
        total = yield from first_items_one_by_one(big, n)
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
        return (yield from first_items_one_by_one(big, n))

    assert await c.compute(loop(10)) == sum(range(10))
    assert s.plugins[NAME].released_early == 0 and not s.plugins[NAME].for_client


class _KeepsLeaves(SchedulerPlugin):
    """A feature's scheduler plugin that keeps some keys (``keeps``)."""

    name = "test-keeps-leaves"

    def __init__(self):
        self.asked: set = set()

    def keeps(self, key, copy):
        self.asked.add((key, copy))
        return isinstance(key, str) and key.startswith("leaf-")


class _KeepsLeavesExtension(Extension):
    name = "test-keeps-leaves"
    keeper = _KeepsLeaves.name


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config={**VALIDATE, "coro.worker-release.enabled": True})
async def test_a_key_a_features_plugin_keeps_is_never_released_by_a_worker(c, s, a, b, tmp_path):
    """Worker release asks every installed plugin of a feature that keeps
    keys (``Extension.keeper``, found in the table of extensions) before it
    marks a key or a copy: kept keys stay until the scheduler lets go of
    them, the others go early as before."""
    keeper = _KeepsLeaves()
    s.add_plugin(keeper)
    register(_KeepsLeavesExtension())
    try:
        await c.register_plugin(ReleasePlugin())
        await async_poll_for(lambda: s.plugins[NAME].ready == {a.address, b.address}, timeout=10)
        plugin = s.plugins[NAME]
        marked: list = []
        send = plugin._send
        plugin._send = lambda worker, msg: (marked.append(msg["key"]) if msg["op"] == MARK else None, send(worker, msg))
        folder = str(tmp_path)
        total = await c.compute(tree_sum(16, folder))
        assert total == [sum(range(16))] * 1000
    finally:
        unregister(_KeepsLeavesExtension.name)
    asked = {k for k, _ in keeper.asked}
    assert {f"leaf-{i}" for i in range(16)} <= asked
    assert any(str(k).startswith("add-") for k in marked)  # the inner sums may go early
    assert not any(str(k).startswith("leaf-") for k in marked)
    assert len(_lines(folder, "leaves")) == 16
    await _nothing_left(s, a, b)
