"""dask.annotate around a yield, and keys the user named: each behaviour on a
real cluster, beside the same program in plain Dask (a ``worker_client``
task, or the client) where that makes sense.

The two workers differ: ``a`` has a GPU resource and ``b`` has none, so an
annotation that is dropped puts children on the wrong worker."""

from __future__ import annotations

import os
import time

import dask
import distributed
import pytest
from distributed import Event, Future, SchedulerPlugin, get_worker, worker_client
from distributed.utils_test import async_poll_for
from helpers import cluster

import dask_coro
from dask_coro import coroutine, current_key
from dask_coro._internals.dask_private import Task, TaskRef
from dask_coro.core.keys import child_key, derive_key, named_by_user
from dask_coro.core.plan import plan_yield
from dask_coro.durability.scheduler import holder

TWO = [("", 2, {"resources": {"GPU": 1}}), ("", 2)]  # a: GPU, b: none
N = 6


class Seen(SchedulerPlugin):
    """Every annotation and priority the scheduler gave a new task, as plugins
    read them (``SchedulerPlugin.update_graph``), and every graph's keys."""

    def __init__(self):
        self.annotations = {}  # key -> {annotation: value}
        self.priority = {}
        self.graphs = []

    def update_graph(self, scheduler, *, keys, annotations=None, priority=None, **kwargs):
        self.graphs.append(set(keys))
        for name, by_key in (annotations or {}).items():
            for k, v in by_key.items():
                self.annotations.setdefault(k, {})[name] = v
        self.priority.update(priority or {})


def seen(s) -> Seen:
    plugin = Seen()
    s.add_plugin(plugin, name="test-annotations-seen")
    return plugin


# -- children and parents ------------------------------------------------------


def _where(i):
    time.sleep(0.01)  # a little work, so that children spread without annotations
    return get_worker().address


where = coroutine(name="where")(_where)


def children(kind):
    if kind == "coroutine":
        return [where(i) for i in range(N)]
    return [dask.delayed(_where)(i) for i in range(N)]


@coroutine
def gen_made_inside(kind, ann):
    with dask.annotate(**ann):
        return (yield children(kind))


@coroutine
def gen_made_outside(kind, ann):
    kids = children(kind)  # made outside: the annotations in effect at the yield apply
    with dask.annotate(**ann):
        return (yield kids)


@coroutine
async def async_made_inside(kind, ann):
    with dask.annotate(**ann):
        return await dask_coro.gather(children(kind))


@coroutine
def result_made_inside(kind, ann):
    with dask.annotate(**ann):
        return dask_coro.result(children(kind))


BODIES = {
    "generator": gen_made_inside,
    "generator-made-outside": gen_made_outside,
    "async": async_made_inside,
    "result": result_made_inside,
}


def plain_dask(kind, ann):
    """The same program as a worker_client task (children: dask.delayed)."""
    with worker_client() as client:
        with dask.annotate(**ann):
            futures = client.compute([dask.delayed(_where)(i) for i in range(N)])
        return client.gather(futures)


# -- workers, resources --------------------------------------------------------


@pytest.mark.parametrize("kind", ["coroutine", "delayed"])
@pytest.mark.parametrize("body", list(BODIES))
@cluster(nthreads=TWO)
async def test_workers_annotation_puts_every_child_there(c, s, a, b, body, kind):
    p = seen(s)
    ann = {"workers": [b.address]}
    assert await c.compute(BODIES[body](kind, ann)) == [b.address] * N
    assert await c.submit(plain_dask, kind, ann) == [b.address] * N
    children = [k for k, v in p.annotations.items() if "workers" in v]
    assert len(children) == 2 * N  # the coroutine's and plain Dask's


@pytest.mark.parametrize("kind", ["coroutine", "delayed"])
@pytest.mark.parametrize("body", ["generator", "async", "result"])
@cluster(nthreads=TWO)
async def test_resources_annotation_puts_every_child_on_the_worker_that_has_them(c, s, a, b, body, kind):
    ann = {"resources": {"GPU": 1}}
    assert await c.compute(BODIES[body](kind, ann)) == [a.address] * N
    assert await c.submit(plain_dask, kind, ann) == [a.address] * N


@cluster(nthreads=TWO)
async def test_allow_other_workers_reaches_the_children(c, s, a, b):
    p = seen(s)
    ann = {"workers": ["tcp://127.0.0.2:1"], "allow_other_workers": True}  # nobody there
    places = await c.compute(gen_made_inside("delayed", ann))
    assert set(places) <= {a.address, b.address}
    loose = [k for k, v in p.annotations.items() if v.get("allow_other_workers") is True]
    assert len(loose) == N


# -- retries -----------------------------------------------------------------


def _flaky(folder, fails):
    """Fails ``fails`` times, then returns how many attempts it took."""
    path = os.path.join(folder, "attempts")
    with open(path, "a") as f:
        f.write("x")
    with open(path) as f:
        n = len(f.read())
    if n <= fails:
        raise OSError(f"flaky: attempt {n}")
    return n


flaky = coroutine(name="flaky")(_flaky)


@coroutine
def retrying(folder, kind):
    child = flaky(folder, 2) if kind == "coroutine" else dask.delayed(_flaky)(folder, 2)
    with dask.annotate(retries=2):
        return (yield child)


def retrying_plain(folder):
    with worker_client() as client, dask.annotate(retries=2):
        return client.compute(dask.delayed(_flaky)(folder, 2)).result()


@pytest.mark.parametrize("kind", ["coroutine", "delayed"])
@cluster(nthreads=TWO)
async def test_retries_annotation_retries_a_failing_child(c, s, a, b, tmp_path, kind):
    one, two = tmp_path / "coro", tmp_path / "plain"
    one.mkdir(), two.mkdir()
    assert await c.compute(retrying(str(one), kind)) == 3
    assert await c.submit(retrying_plain, str(two)) == 3


@cluster(nthreads=TWO)
async def test_without_retries_the_first_failure_reaches_the_yield(c, s, a, b, tmp_path):
    @coroutine
    def not_retrying(folder):
        return (yield flaky(folder, 2))

    with pytest.raises(OSError, match="attempt 1"):
        await c.compute(not_retrying(str(tmp_path)))


def test_retries_locally_do_nothing_as_with_the_sync_scheduler(tmp_path):
    one, two = tmp_path / "coro", tmp_path / "plain"
    one.mkdir(), two.mkdir()
    with pytest.raises(OSError, match="attempt 1"):
        retrying(str(one), "delayed").compute(scheduler="sync")
    with pytest.raises(OSError, match="attempt 1"), dask.annotate(retries=2):
        dask.delayed(_flaky)(str(two), 2).compute(scheduler="sync")


# -- priority ------------------------------------------------------------------


def _log(folder, name):
    with open(os.path.join(folder, "order"), "a") as f:
        f.write(name + "\n")
    return name


log = coroutine(name="log")(_log)


@coroutine
def prioritised(folder):
    low = [log(folder, f"low{i}") for i in range(4)]
    with dask.annotate(priority=10):
        high = log(folder, "high")
    return (yield [*low, high])


def prioritised_plain(folder):
    with worker_client() as client:
        low = [dask.delayed(_log)(folder, f"low{i}") for i in range(4)]
        with dask.annotate(priority=10):
            high = dask.delayed(_log)(folder, "high")
        return client.gather(client.compute([*low, high]))


@cluster(nthreads=[("", 1)])
async def test_priority_annotation_runs_that_child_first(c, s, a, tmp_path):
    p = seen(s)
    one, two = tmp_path / "coro", tmp_path / "plain"
    one.mkdir(), two.mkdir()
    assert await c.compute(prioritised(str(one))) == [*(f"low{i}" for i in range(4)), "high"]
    assert await c.submit(prioritised_plain, str(two)) == [*(f"low{i}" for i in range(4)), "high"]
    for folder in (one, two):
        assert (folder / "order").read_text().split()[0] == "high"
    high = [k for k, v in p.annotations.items() if v.get("priority") == 10]
    assert len(high) == 2
    assert all(p.priority[k][0] == -10 for k in high)


# -- unknown annotations, nesting, the parent's own ----------------------------


@coroutine
def nested(folder):
    with dask.annotate(retries=1, team="outer", workers=["tcp://127.0.0.2:1"]):
        with dask.annotate(team="inner", cost=3, allow_other_workers=True):
            return (yield log(folder, "x"))


@cluster(nthreads=TWO)
async def test_unknown_and_nested_annotations_reach_a_scheduler_plugin(c, s, a, b, tmp_path):
    p = seen(s)
    assert await c.compute(nested(str(tmp_path))) == "x"
    (child,) = [k for k in p.annotations if str(k).startswith("log-")]
    got = p.annotations[child]
    # As dask merges nested dask.annotate: the inner wins, key by key.
    with dask.annotate(retries=1, team="outer", workers=["tcp://127.0.0.2:1"]):
        with dask.annotate(team="inner", cost=3, allow_other_workers=True):
            expected = dask.get_annotations()
    assert {k: got.get(k) for k in expected} == expected


@coroutine
def unannotated_children(kind):
    return (yield children(kind))


@cluster(nthreads=TWO)
async def test_the_parents_own_annotations_are_not_inherited(c, s, a, b):
    # Worker.execute puts only a task's span in effect for what it submits
    # (distributed/worker.py, "Propagate span"): a worker_client task's
    # children do not inherit its resources, nor do a coroutine's.
    p = seen(s)
    with dask.annotate(resources={"GPU": 1}, retries=1):
        parent = unannotated_children("coroutine")
        plain = dask.delayed(plain_dask)("delayed", {})
    await c.gather(c.compute([parent, plain]))
    kids = {k for g in p.graphs for k in g if str(k).startswith(("where-", "_where-"))}
    assert len(kids) == 2 * N
    assert not any({"resources", "retries"} & p.annotations.get(k, {}).keys() for k in kids)
    assert p.annotations[parent.key]["resources"] == {"GPU": 1}


@coroutine
def layer_against_yield(a_addr, b_addr):
    with dask.annotate(workers=[a_addr]):
        made_under_a = dask.delayed(_where)(0)
    with dask.annotate(workers=[b_addr]):
        return (yield [made_under_a, dask.delayed(_where)(1)])


def layer_against_yield_plain(a_addr, b_addr):
    with worker_client() as client:
        with dask.annotate(workers=[a_addr]):
            made_under_a = dask.delayed(_where)(0)
        with dask.annotate(workers=[b_addr]):
            return client.gather(client.compute([made_under_a, dask.delayed(_where)(1)]))


@cluster(nthreads=TWO)
async def test_a_layers_annotations_win_over_those_at_the_yield(c, s, a, b):
    # As in dask: a layer keeps the annotations it was made under
    # (Scheduler._apply_annotations lets them win over the global ones).
    expected = [a.address, b.address]
    assert await c.compute(layer_against_yield(a.address, b.address)) == expected
    assert await c.submit(layer_against_yield_plain, a.address, b.address) == expected


# -- inline calls under an annotation ----------------------------------------


@coroutine
def inline_under(b_addr, made_inside):
    if made_inside:
        with dask.annotate(workers=[b_addr]):
            return (yield [where(i) for i in range(N)])
    kids = [where(i) for i in range(N)]  # plain arguments: would run inline
    with dask.annotate(workers=[b_addr]):
        return (yield kids)


@pytest.mark.inline
@pytest.mark.parametrize("made_inside", [True, False])
@cluster(nthreads=TWO)
async def test_inline_calls_under_an_annotation_become_tasks(c, s, a, b, made_inside):
    p = seen(s)
    assert await c.compute(inline_under(b.address, made_inside)) == [b.address] * N
    kids = [k for k in p.annotations if str(k).startswith("where-")]
    assert len(kids) == N
    assert all(p.annotations[k]["workers"] == [b.address] for k in kids)


@coroutine
def inline_plain():
    return (yield [where(i) for i in range(N)])


@pytest.mark.inline
@cluster(nthreads=[("", 1)])
async def test_calls_under_the_runs_own_span_still_run_inline(c, s, a):
    p = seen(s)
    assert await c.compute(inline_plain()) == [a.address] * N
    assert not [k for k in p.annotations if str(k).startswith("where-")]


# -- keys the user named -----------------------------------------------------


def _inc(x):
    return x + 1


@coroutine
def yields_named(gate):
    d = dask.delayed(_inc)(1, dask_key_name="my-inc")
    x = yield d
    Event(gate).wait()  # d is alive: its result is held meanwhile
    return x


def yields_named_plain(gate):
    with worker_client() as client:
        fut = client.compute(dask.delayed(_inc)(1, dask_key_name="my-inc"))
        x = fut.result()
        Event(gate).wait()
        return x


@pytest.mark.parametrize("how", ["coroutine", "worker_client"])
@cluster(nthreads=[("", 2)])
async def test_a_named_key_is_kept_and_another_client_finds_it(c, s, a, how):
    from distributed import Client

    gate = Event()
    if how == "coroutine":
        fut = c.compute(yields_named(gate.name))
    else:
        fut = c.submit(yields_named_plain, gate.name, pure=False)
    await async_poll_for(lambda: "my-inc" in s.tasks and s.tasks["my-inc"].state == "memory", timeout=20)
    if how == "coroutine":
        # Held for the coroutine that submitted it, as any child of it
        # (coro.durability.hold-children): a re-run would find it.
        by = holder(fut.key)

        def held():
            return by in {cs.client_key for cs in s.tasks["my-inc"].who_wants}

        await async_poll_for(held, timeout=20)
    async with Client(s.address, asynchronous=True, set_as_default=False) as other:
        # By its name, from another client: a graph of its own that needs
        # it (a bare Future("my-inc") does not ask the scheduler for it in
        # distributed 2026.8, whichever way the key was made; a key the
        # scheduler does not know fails such a graph, "lost dependencies").
        graph = {"probe": Task("probe", _inc, TaskRef("my-inc"))}
        (probe,) = other.get(graph, ["probe"], sync=False)
        assert await probe == 3
        assert isinstance(probe, Future)
    await gate.set()
    assert await fut == 2
    del fut
    await async_poll_for(lambda: not s.tasks, timeout=20)  # nothing left behind


def _count(folder, gate):
    Event(gate).wait()
    with open(os.path.join(folder, "runs"), "a") as f:
        f.write("x")
    return "ran"


@coroutine
def shares_named(folder, gate):
    return (yield dask.delayed(_count)(folder, gate, dask_key_name="shared"))


def shares_named_plain(folder, gate):
    with worker_client() as client:
        return client.compute(dask.delayed(_count)(folder, gate, dask_key_name="shared")).result()


@pytest.mark.parametrize("how", ["coroutine", "worker_client"])
@cluster(nthreads=[("", 1)])
async def test_two_parents_yielding_one_named_key_run_it_once(c, s, a, tmp_path, how):
    p = seen(s)
    gate = Event()
    if how == "coroutine":
        parents = c.compute([shares_named(str(tmp_path), gate.name) for _ in range(2)])
    else:
        parents = [c.submit(shares_named_plain, str(tmp_path), gate.name, pure=False) for _ in range(2)]
    # Both asked for it before it runs.
    await async_poll_for(lambda: sum("shared" in g for g in p.graphs) == 2, timeout=20)
    await gate.set()
    assert await c.gather(parents) == ["ran", "ran"]
    assert (tmp_path / "runs").read_text() == "x"
    del parents
    await async_poll_for(lambda: not s.tasks, timeout=20)


@coroutine
def named_with_dependencies(gate):
    below = dask.delayed(_inc)(1)  # dask names it: renamed, its slot below "top"
    return (yield dask.delayed(_count_after)(below, gate, dask_key_name="top"))


def _count_after(x, gate):
    Event(gate).wait()
    return x


@cluster(nthreads=[("", 1)])
async def test_tasks_below_a_named_key_are_named_alike_by_every_parent(c, s, a):
    p = seen(s)
    gate = Event()
    parents = c.compute([named_with_dependencies(gate.name) for _ in range(2)])
    await async_poll_for(lambda: sum("top" in g for g in p.graphs) == 2, timeout=20)
    await gate.set()
    assert await c.gather(parents) == [2, 2]
    graphs = [g for g in p.graphs if "top" in g]
    assert graphs[0] == graphs[1]  # one graph: no key collision, nothing twice
    (below,) = graphs[0] - {"top"}
    assert below.startswith(derive_key("inc", "top", 0))  # key_split drops the "_"


@cluster(nthreads=[("", 1)])
async def test_a_child_named_as_its_parent_is_an_error_at_the_yield(c, s, a):
    @coroutine
    def selfish():
        try:
            yield dask.delayed(_inc)(1, dask_key_name=current_key())
        except ValueError as e:
            return str(e)

    msg = await c.compute(selfish(dask_key_name="me"))
    assert "its own key" in msg


def test_the_plan_keeps_named_keys_and_renames_dask_made_ones():
    named = dask.delayed(_inc)(dask.delayed(_inc)(1), dask_key_name="mine")
    plan = plan_yield([named], [()], {}, "root", 0)
    assert plan.outputs == ["mine"]
    (below,) = set(plan.graph) - {"mine"}
    assert below.startswith(derive_key("inc", "mine", 0))
    made = dask.delayed(_inc)(1)
    assert plan_yield([made], [()], {}, "root", 0).outputs[0].startswith(derive_key("inc", "root", 0, ()))


def test_which_keys_dask_made():
    from dask.base import tokenize

    token = tokenize(1)
    made = [
        f"inc-{token}",
        dask.delayed(_inc)(1).key,  # impure: inc-<uuid4>
        dask.delayed(_inc, pure=True)(1).key,
        (f"array-{token}", 0, 1),
        where(1).key,
        child_key(derive_key("inc", "root", 0, ()), "content"),
    ]
    user = ["my-inc", "inc-1", ("x", 0), 7, "root", dask.delayed(_inc)(1, dask_key_name="n").key]
    assert [named_by_user(k) for k in made] == [False] * len(made)
    assert [named_by_user(k) for k in user] == [True] * len(user)



def test_a_calls_layer_has_the_annotations_in_effect_where_it_was_made():
    # As a dask.delayed call's layer, made at the call: not where its graph
    # is first asked for (a coroutine call builds it then).
    outside, plain_outside = where(1), dask.delayed(_where)(1)
    with dask.annotate(retries=3):
        inside, plain_inside = where(2), dask.delayed(_where)(2)
        for x in (outside, plain_outside, inside, plain_inside):
            x.key  # a coroutine call builds its graph here

    def annotations(x):
        (layer,) = x.__dask_graph__().layers.values()
        return layer.annotations

    assert annotations(outside) is None and annotations(plain_outside) is None
    assert annotations(inside) == annotations(plain_inside) == {"retries": 3}


# -- spans -------------------------------------------------------------------


@coroutine
def in_a_span_of_its_own(kind):
    with distributed.span("inner"):
        return (yield children(kind))


def in_a_span_plain(kind):
    with worker_client() as client, distributed.span("inner"):
        return client.gather(client.compute([dask.delayed(_where)(i) for i in range(N)]))


@pytest.mark.parametrize("how", ["coroutine", "delayed", "worker_client"])
@cluster(nthreads=TWO)
async def test_a_span_opened_in_the_body_holds_the_children(c, s, a, b, how):
    # The task's own span is inherited; one opened around the yield nests in it.
    with distributed.span("outer"):
        if how == "worker_client":
            fut = c.submit(in_a_span_plain, "delayed", pure=False)
        else:
            fut = c.compute(in_a_span_of_its_own(how))
    assert len(await fut) == N
    spans = s.extensions["spans"].spans.values()
    (inner,) = [sp for sp in spans if sp.name == ("outer", "inner")]
    assert {g.name for g in inner.groups} == {"where"}  # the children's group, all of it
