"""The table of extensions (``dask_coro/runtime/extensions.py``): a feature
added from outside ``runtime/`` and ``core/`` gets its plugins installed
(at first use and by the preload) and its hooks called on a real cluster;
a failing hook is logged, never the task's error."""

from __future__ import annotations

import asyncio

import dask
import pytest
from bodies import add
from distributed import Scheduler, Worker
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
from distributed.utils_test import async_poll_for, captured_logger, gen_cluster, gen_test
from filelog import append as _append
from filelog import lines as _lines
from helpers import cluster

from dask_coro import coroutine
from dask_coro.core.engine import Raised, Returned
from dask_coro.runtime import extensions
from dask_coro.runtime.extensions import Extension, register, unregister

NAME = "test-recorder"


class RecorderSchedulerPlugin(SchedulerPlugin):
    name = f"{NAME}-scheduler"
    idempotent = True

    def __init__(self) -> None:
        self.annotations: list[dict] = []

    def update_graph(self, scheduler, *, annotations=None, **kwargs):
        self.annotations.append(annotations or {})


class RecorderWorkerPlugin(WorkerPlugin):
    name = f"{NAME}-worker"
    idempotent = True


class Recorder(Extension):
    """A feature of the test's own: what the runtime tells it."""

    name = NAME
    what = "records what the runtime tells it"
    at_first_use = True

    def __init__(self, fail: str | None = None) -> None:
        self.events: list[tuple] = []
        self.counted: list[list[int]] = []  # the client's count of the keys released, after the hook
        self.fail = fail

    def _event(self, hook: str, *what) -> None:
        self.events.append((hook, *what))
        if hook == self.fail:
            raise RuntimeError(f"the recorder fails in {hook}")

    def scheduler_plugin(self):
        return RecorderSchedulerPlugin()

    def worker_plugin(self):
        return RecorderWorkerPlugin()

    def run_started(self, run):
        self._event("run_started", run.key)
        run.notes[self.name] = "mine"

    def annotations(self, run):
        self._event("annotations", run.key)
        return {"test_recorder_parent": run.key}

    async def submitting(self, run, client, graph):
        self._event("submitting", run.key)
        return []

    async def results_received(self, run, results):
        self._event("results_received", run.key, list(results))

    def released(self, run, futures):
        keys = sorted(f.key for f in futures)
        self._event("released", run.key, keys, _on_the_workers_loop(run))
        client = futures[0].client
        # What the hook queues on the loop runs after the client's own
        # reference counting of the futures (``Client._dec_ref``).
        client.loop.add_callback(lambda: self.counted.append([client.refcount.get(k, 0) for k in keys]))

    async def run_ended(self, run, outcome):
        self._event("run_ended", run.key, run.notes.get(self.name), outcome)


def _on_the_workers_loop(run) -> bool:
    # A body's thread may run a loop of its own (``async def`` bodies).
    try:
        return asyncio.get_running_loop() is run.worker.loop.asyncio_loop
    except RuntimeError:
        return False


@pytest.fixture
def recorder(request):
    ext = register(Recorder(getattr(request, "param", None)))
    try:
        yield ext
    finally:
        unregister(NAME)


@coroutine
def parent(n):
    a, b = yield [add(n, 1), add(n, 2)]
    return a + b


def _hooks(ext: Recorder, key) -> list[str]:
    return [e[0] for e in ext.events if e[1] == key]


@gen_cluster(client=True, nthreads=[("", 1)], config={"coro.inline.enabled": False})
async def test_a_registered_extension_gets_its_plugins_and_hooks(c, s, a, recorder):
    root = parent(10)
    assert await c.compute(root) == 23
    key = root.key
    # Its plugins, installed by the first coroutine on the worker.
    assert isinstance(s.plugins[RecorderSchedulerPlugin.name], RecorderSchedulerPlugin)
    assert isinstance(a.plugins[RecorderWorkerPlugin.name], RecorderWorkerPlugin)
    # Its annotation went with the children, to the scheduler.
    seen = s.plugins[RecorderSchedulerPlugin.name].annotations
    parents = {k: v for ann in seen for k, v in ann.get("test_recorder_parent", {}).items()}
    children = [k for k, v in parents.items() if v == key]
    assert len(children) == 2
    # The root's hooks, in order (its results are kept while a lazy value
    # of the body may use them: let go of at its end); the children ran no
    # yield and returned.
    assert _hooks(recorder, key) == ["run_started", "submitting", "annotations", "results_received", "run_ended", "released"]
    (results,) = [e[2] for e in recorder.events if e[:2] == ("results_received", key)]
    assert results == [11, 12]
    (released,) = [e[2:] for e in recorder.events if e[:2] == ("released", key)]
    # On the worker's loop, the futures' release queued there already: what
    # the hook queues runs before the scheduler's answer to that release
    # (worker release relies on it).
    assert released == (sorted(children), True)
    await async_poll_for(lambda: len(recorder.counted) == 1, timeout=5)
    assert all(count == 0 for counts in recorder.counted for count in counts)
    for child in children:
        assert _hooks(recorder, child) == ["run_started", "run_ended"]
    (ended,) = [e for e in recorder.events if e[:2] == ("run_ended", key)]
    assert ended[2] == "mine"  # what run_started kept for the run
    assert type(ended[3]).__name__ == "Returned" and ended[3].value == 23


@coroutine
def loop(n):
    total = 0
    for i in range(n):
        total += yield add(i, 1)
    return total


@cluster(nthreads=[("", 1)], config={"coro.inline.enabled": False, "coro.durability.hold-children": False})
async def test_released_is_told_on_the_loop_after_the_clients_count(c, s, a, recorder):
    """A body lets go of a yield's children on its thread when it resumes:
    the hook still hears of it on the worker's loop, once the futures'
    release is queued there, so that what it queues runs after the client's
    reference counting and before the scheduler's answer to it."""
    root = loop(5)
    assert await c.compute(root) == 15
    released = [e for e in recorder.events if e[:2] == ("released", root.key)]
    assert len(released) == 5 and all(on_loop for *_, on_loop in released)
    await async_poll_for(lambda: len(recorder.counted) == 5, timeout=5)
    assert all(count == 0 for counts in recorder.counted for count in counts)


@pytest.mark.inline
@gen_cluster(client=True, nthreads=[("", 1)])
async def test_with_calls_inline_an_extension_sees_the_root_run(c, s, a, recorder):
    # Inline, the children are plain calls (or tasks, handed out to an idle
    # thread): the root's run starts and ends once; a call run inline is no run.
    root = parent(1)
    assert await c.compute(root) == 5
    hooks = _hooks(recorder, root.key)
    assert hooks[0] == "run_started" and hooks.count("run_started") == 1
    assert hooks.count("run_ended") == 1
    assert all(e[0] in ("run_started", "run_ended") for e in recorder.events if e[1] != root.key)


@pytest.mark.parametrize(
    "recorder", ["run_started", "annotations", "released", "run_ended"], indirect=True
)
@gen_cluster(client=True, nthreads=[("", 1)], config={"coro.inline.enabled": False})
async def test_a_failing_hook_is_logged_and_the_task_goes_on(c, s, a, recorder):
    with captured_logger("dask_coro") as log:
        assert await c.compute(parent(2)) == 7
    assert f"dask_coro extension {NAME!r} failed in {recorder.fail}" in log.getvalue()
    assert f"the recorder fails in {recorder.fail}" in log.getvalue()


@pytest.mark.parametrize("recorder", ["submitting", "results_received"], indirect=True)
@gen_cluster(client=True, nthreads=[("", 1)], config={"coro.inline.enabled": False})
async def test_an_error_on_submitting_or_results_received_is_raised_at_the_yield(c, s, a, recorder):
    @coroutine
    def catches():
        try:
            yield [add(1, 1)]
        except RuntimeError as e:
            return f"caught: {e}"

    assert await c.compute(catches()) == f"caught: the recorder fails in {recorder.fail}"


class Off(Recorder):
    name = f"{NAME}-off"

    def enabled(self) -> bool:
        return False

    def scheduler_plugin(self):
        return OffPlugin()


class OffPlugin(SchedulerPlugin):
    name = f"{NAME}-off-scheduler"
    idempotent = True


@gen_cluster(client=True, nthreads=[("", 1)], config={"coro.inline.enabled": False})
async def test_a_disabled_extension_is_neither_installed_nor_called(c, s, a):
    ext = register(Off())
    try:
        assert await c.compute(parent(0)) == 3
        assert ext.events == []
        assert OffPlugin.name not in s.plugins
    finally:
        unregister(Off.name)


@gen_test()
async def test_the_preload_installs_every_enabled_extensions_plugins(recorder):
    register(Off())
    try:
        async with (
            Scheduler(dashboard_address=":0", preload=["dask_coro"]) as s,
            Worker(s.address, nthreads=1, preload=["dask_coro"]) as a,
        ):
            assert RecorderSchedulerPlugin.name in s.plugins
            # The scheduler adds it to every worker, this one too.
            await async_poll_for(lambda: RecorderWorkerPlugin.name in a.plugins, timeout=10)
            assert OffPlugin.name not in s.plugins
            # And the features' own, as the preload always did; those of
            # settings that are off are not (tests run with inline off).
            for name in ("dask-coro-promises", "dask-coro-lifetimes", "dask-coro-tree", "dask-coro-durable"):
                assert name in s.plugins
            assert "dask-coro-inline" not in s.plugins
            assert "dask-coro-release" not in s.plugins
    finally:
        unregister(Off.name)


def test_each_hook_lists_only_the_extensions_that_override_it():
    class Quiet(Extension):
        name = "quiet"

    class Ending(Extension):
        name = "ending"

        async def run_ended(self, run, outcome):
            pass

    quiet, ending = Quiet(), Ending()
    active = extensions.Active([quiet, ending])
    assert active.all == (quiet, ending)
    assert active.run_ended == (ending,)
    for hook in ("run_started", "annotations", "results_received", "released", "run_left"):
        assert getattr(active, hook) == ()
    assert active.at_first_use == () and not active.counts_calls


def test_the_features_are_registered_in_install_order():
    names = [e.name for e in extensions.registered()]
    assert names[:7] == ["promise", "lifetimes", "diagnostics", "durability", "inline", "release", "stream"]


def test_a_name_is_registered_once():
    class Nameless(Extension):
        pass

    with pytest.raises(ValueError, match="has no name"):
        register(Nameless())

    class Other(Extension):
        name = "diagnostics"

    with pytest.raises(ValueError, match="'diagnostics' is registered already"):
        register(Other())


# -- around a wait, options, the parent annotation, keepers ---------------------

WAITER = "test-waiter"


class Waiter(Extension):
    """Works around each wait of a run, and reads an option of its own."""

    name = WAITER
    options = ("test_wait_tag",)

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def check_option(self, name, value):
        if not isinstance(value, str):
            raise TypeError(f"@coroutine({name}=...) expects a string, got {value!r}")

    async def around_wait(self, run, wait):
        tag = run.options.get("test_wait_tag")
        self.events.append(("before", run.key, tag, _on_the_workers_loop(run)))
        out = await wait
        self.events.append(("after", run.key, tag, out))
        return out


@pytest.fixture
def waiter():
    ext = register(Waiter())
    try:
        yield ext
    finally:
        unregister(WAITER)


@gen_cluster(client=True, nthreads=[("", 1)], config={"coro.inline.enabled": False})
async def test_around_wait_wraps_each_wait_and_reads_the_functions_option(c, s, a, waiter):
    """A feature works around every wait of a run that holds no thread (a
    yield's children, an async body's asyncio await), on the worker's loop,
    with the option its function was given (``@coroutine(name=value)``,
    carried by the call object without knowing it; the function pickled by
    value here, a test's local)."""

    @coroutine(test_wait_tag="tagged")
    def waits():
        x = yield add(1, 2)
        y, z = yield [add(x, 1), add(x, 2)]
        return x + y + z

    @coroutine
    async def sleeps():
        await asyncio.sleep(0.01)
        return await add(2, 2)

    root, other = waits(), sleeps()
    assert await c.compute(root) == 3 + 4 + 5
    assert await c.compute(other) == 4
    mine = [e for e in waiter.events if e[1] == root.key]
    assert mine == [
        ("before", root.key, "tagged", True), ("after", root.key, "tagged", [3]),
        ("before", root.key, "tagged", True), ("after", root.key, "tagged", [4, 5]),
    ]
    theirs = [e[0] for e in waiter.events if e[1] == other.key]
    assert theirs == ["before", "after"] * 2  # the sleep, then the child
    assert all(e[2] is None for e in waiter.events if e[1] == other.key)


def test_an_option_is_one_an_extension_declares_with_a_value_it_takes(waiter):
    def f():
        return 1

    with pytest.raises(TypeError, match="unexpected keyword argument 'test_no_such_option'"):
        coroutine(test_no_such_option=1)(f)
    with pytest.raises(TypeError, match=r"test_wait_tag=\.\.\.\) expects a string, got 1"):
        coroutine(test_wait_tag=1)(f)
    assert coroutine(test_wait_tag="x")(f).options == {"test_wait_tag": "x"}


class Parented(Recorder):
    """Asks for the parent annotation, as the tree and durability do."""

    name = f"{NAME}-parented"
    parent = True


@pytest.mark.parametrize("asks", [False, True])
@gen_cluster(
    client=True, nthreads=[("", 1)],
    config={"coro.inline.enabled": False, "coro.tree.enabled": False, "coro.durability.hold-children": False},
)
async def test_children_carry_their_parents_key_when_an_extension_asks(c, s, a, recorder, asks):
    """The parent annotation is the runtime's (``extensions.PARENT``): added
    to every child once an enabled extension asks for it, and to none when
    nobody does (the tree and durability off)."""
    if asks:
        register(Parented())
    try:
        root = parent(1)
        assert await c.compute(root) == 5
    finally:
        unregister(Parented.name)
    seen = s.plugins[RecorderSchedulerPlugin.name].annotations
    parents = {k: v for ann in seen for k, v in ann.get(extensions.PARENT, {}).items()}
    if asks:
        assert sorted(parents.values()) == [root.key, root.key]
    else:
        assert parents == {}


def test_each_keeper_names_its_extensions_scheduler_plugin():
    """``Extension.keeper`` is the name of the extension's scheduler plugin,
    which says which keys it keeps (worker release asks it)."""
    keepers = {e.name: e.keeper for e in extensions.registered() if e.keeper}
    assert set(keepers) == {"promise", "lifetimes", "durability"}
    assert extensions.keepers() == tuple(keepers.values())
    for e in extensions.registered():
        if e.keeper:
            plugin = e.scheduler_plugin()
            assert plugin.name == e.keeper and callable(plugin.keeps)
            assert plugin.keeps("no-such-key", False) is False



def _inner(folder):
    _append(folder, "ran", "inner")
    return 1


def _outer(folder, x):
    _append(folder, "ran", "outer")
    return x


def _other(folder):
    _append(folder, "ran", "other")
    return 2


@coroutine
def with_inner(folder):
    x = yield dask.delayed(_outer)(folder, dask.delayed(_inner)(folder))
    y = yield dask.delayed(_other)(folder)
    return x + y


class Supplier(Extension):
    """Has a value for every ``_outer`` task, and the outcome ``own`` for a
    run of key ``own-run``."""

    name = "test-supplier"

    def __init__(self) -> None:
        self.asked: list[list] = []

    async def supplied(self, run, keys):
        self.asked.append(list(keys))
        if keys == [run.key]:
            return {run.key: Raised(KeyError("given"))} if run.key == "own-run" else {}
        return {k: Returned(41) for k in keys if str(k).startswith("outer-")}


@coroutine
def many_outer(folder, n):
    xs = yield [dask.delayed(_outer)(folder, i) for i in range(n)]
    return sum(xs)


class WhereInMemory(SchedulerPlugin):
    """The worker each key reached memory on."""

    def __init__(self) -> None:
        self.where: dict = {}

    def transition(self, key, start, finish, *args, worker=None, **kwargs):
        if finish == "memory" and worker is not None:
            self.where[key] = worker


@cluster()
async def test_supplied_values_go_to_memory_on_the_worker_of_the_run_that_reads_them(c, s, a, b, tmp_path):
    """Given values are placed on the run's own worker, where its body reads
    them: not queued as tasks across the cluster (a round trip each on
    another worker, then a transfer back)."""
    folder, n = str(tmp_path), 10
    where = WhereInMemory()
    s.add_plugin(where)
    register(Supplier())
    try:
        for w in (a, b):
            where.where.clear()
            root = many_outer(folder, n, dask_key_name=f"on-{w.name}")
            assert await c.compute(root, workers=[w.address]) == 41 * n
            given = [k for k in where.where if str(k).startswith("outer-")]
            assert len(given) == n and {where.where[k] for k in given} == {w.address}
    finally:
        unregister(Supplier.name)
    assert "outer" not in _lines(folder, "ran")


@cluster(nthreads=[("", 1)])
async def test_a_supplied_outcome_is_sent_as_a_value_and_its_task_never_runs(c, s, a, tmp_path):
    """A feature gives a yield's task its value before it is sent (the
    supplied hook): it never runs; the others run (the Delayed below it too:
    the run keeps its value for later yields, as always). Given the run's
    own outcome, the body never runs."""
    folder = str(tmp_path)
    assert await c.compute(with_inner(folder)) == 3
    assert _lines(folder, "ran") == ["inner", "outer", "other"]
    ext = register(Supplier())
    try:
        assert await c.compute(with_inner(folder)) == 43
        assert _lines(folder, "ran")[3:] == ["inner", "other"]
        assert any(str(k).startswith("inner-") for keys in ext.asked for k in keys)
        with pytest.raises(KeyError, match="given"):
            await c.compute(with_inner(folder, dask_key_name="own-run"))
        assert ["own-run"] in ext.asked and _lines(folder, "ran")[5:] == []
    finally:
        unregister(Supplier.name)
