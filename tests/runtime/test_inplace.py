"""Yielded lazy values built on what a coroutine holds are computed in place
(``core.localize``, ``runtime.inplace``), and operators on coroutine calls
are lazy objects (``runtime.ops``).

Pure parts run in this process with dask's synchronous scheduler (the local
runner, the same engine and hook); cluster parts count, on the scheduler,
which tasks ran. Every test runs with inline calls on (the default).
"""

from __future__ import annotations

import operator

import dask
import pytest
from distributed import Future
from distributed.utils_test import gen_cluster
from filelog import append as _append
from filelog import lines as _lines
from helpers import cluster, recorder

from dask_coro import coroutine
from dask_coro.runtime.ops import LazyOp

pytestmark = pytest.mark.inline


@coroutine
def gen(n, folder=None):
    if folder is not None:
        _append(folder, "gen", str(n))
    return list(range(n))


@coroutine
def inc(x, folder=None):
    if folder is not None:
        _append(folder, "inc", str(x))
    return x + 1


@coroutine
def ginc(x):
    """A generator coroutine: its own yield inside a value computed in place."""
    y = yield inc(x)
    return y


@coroutine
def my_len(L):
    return len(L)


@coroutine
def fails_on(x, bad):
    if x == bad:
        raise ValueError(f"bad item {x}")
    return x


@coroutine
def process_all(n, folder=None):
    """dask/distributed #1663's process_all, its list of length ``n``."""
    L = gen(n, folder)
    n = yield my_len(L)
    processed = [inc(L[i], folder) for i in range(n)]
    total = yield sum(processed)
    return total


@coroutine
def twice(n, folder):
    """The same lazy values yielded again: computed once."""
    L = gen(n, folder)
    processed = [inc(L[i], folder) for i in range(n)]
    a = yield sum(processed)
    b = yield processed
    c = yield processed[0] * 10
    return a, b, c


@dask.delayed
def slow_len(L):
    return len(L)


@dask.delayed(pure=True)
def data(n):
    return list(range(n))


@coroutine
def with_delayed(n):
    """A plain dask.delayed function stays a task; what is built on its
    result is computed in place once the result is here."""
    L = data(n)
    n = yield slow_len(L)
    total = yield sum(inc(L[i]) for i in range(n))
    return total


@coroutine
def raises_at_yield(n, bad):
    L = gen(n)
    try:
        yield sum(fails_on(L[i], bad) for i in range(n))
    except ValueError as e:
        return f"caught {e}"
    return "not raised"


@coroutine
def annotated(n):
    L = gen(n)
    with dask.annotate(retries=2):
        total = yield inc(L[0]) + 1
    return total


@coroutine(inline=False)
def task_inc(x):
    return x + 1


@coroutine
def not_inline(n):
    L = gen(n)
    total = yield sum(task_inc(L[i]) for i in range(n))
    return total


@coroutine
def nested(n):
    L = gen(n)
    pairs = yield [(ginc(L[i]), -L[i]) for i in range(n)]
    return pairs


# --------------------------------------------------------------------------
# operators on calls


def test_operators_on_calls_are_lazy_delayed_objects():
    x = inc(1)
    for y in (x + 1, 1 + x, -x, x * x, x < 3, abs(x), gen(2)[0]):
        assert isinstance(y, LazyOp)
    assert (inc(1) + 1).compute(scheduler="sync") == 3
    assert (10 - inc(1)).compute(scheduler="sync") == 8
    assert (gen(3)[2]).compute(scheduler="sync") == 2
    assert sum(inc(i) for i in range(4)).compute(scheduler="sync") == 10
    # dask.delayed functions take them as arguments
    assert dask.delayed(operator.mul)(inc(1) + 1, 2).compute(scheduler="sync") == 6


def test_sum_of_calls_builds_its_graph_in_one_layer():
    """dask's own Delayed adds copy their operands' graphs (O(n**2) for a
    sum); the chain of LazyOp adds is one layer over the calls' layers."""
    calls = [inc(i) for i in range(300)]
    total = sum(calls)
    layers = total.__dask_graph__().layers
    assert len(layers) == 301  # the calls' 300 and one for the 300 adds
    assert total.compute(scheduler="sync") == sum(range(1, 301))


# --------------------------------------------------------------------------
# in this process (dask's synchronous scheduler: the local runner)


def test_process_all_in_place_computes_each_call_once(tmp_path):
    folder = str(tmp_path)
    assert dask.compute(process_all(50, folder), scheduler="sync") == (sum(range(1, 51)),)
    assert _lines(folder, "gen") == ["50"]
    assert sorted(map(int, _lines(folder, "inc"))) == list(range(50))


def test_values_yielded_again_are_not_computed_again(tmp_path):
    folder = str(tmp_path)
    (a, b, c), = dask.compute(twice(20, folder), scheduler="sync")
    assert a == sum(range(1, 21))
    assert b == list(range(1, 21))
    assert c == 10
    assert _lines(folder, "gen") == ["20"]
    assert sorted(map(int, _lines(folder, "inc"))) == list(range(20))


@coroutine
def named_then_used(n, folder):
    L = gen(n, folder)
    assert L.key  # asked for its key: L is a task now, not an inline call
    return (yield [inc(L[i], folder) for i in range(n)])


def test_a_call_whose_key_was_asked_is_computed_once(tmp_path):
    """A call asked for its key is a task; yielded under several leaves (its
    items), it is computed once, as a ``Delayed`` under several tasks is in
    dask. Each leaf computed in place used to make a call of its own and
    run it again (five times here)."""
    folder = str(tmp_path)
    assert dask.compute(named_then_used(5, folder), scheduler="sync") == ([1, 2, 3, 4, 5],)
    assert _lines(folder, "gen") == ["5"]


@cluster(nthreads=[("", 1)])
async def test_a_call_whose_key_was_asked_is_computed_once_on_a_cluster(c, s, a, tmp_path):
    folder = str(tmp_path)
    assert await c.compute(named_then_used(5, folder)) == [1, 2, 3, 4, 5]
    assert _lines(folder, "gen") == ["5"]
    assert sorted(map(int, _lines(folder, "inc"))) == list(range(5))


def test_error_in_place_is_raised_at_the_yield_with_its_type():
    (out,) = dask.compute(raises_at_yield(10, 7), scheduler="sync")
    assert out == "caught bad item 7"


def test_nested_structure_and_generator_calls_in_place():
    (pairs,) = dask.compute(nested(5), scheduler="sync")
    assert pairs == [(i + 1, -i) for i in range(5)]


# --------------------------------------------------------------------------
# on a cluster


@cluster(nthreads=[("", 1)])
async def test_process_all_runs_without_tasks(c, s, a):
    r = recorder(s)
    assert await c.compute(process_all(200, dask_key_name="root")) == sum(range(1, 201))
    # One worker: nothing idle to hand work to, the root computed it all.
    assert r.memory == ["root"], r.memory


@cluster(nthreads=[("", 1), ("", 1)])
async def test_process_all_on_two_workers_is_right(c, s, a, b):
    for n in (0, 1, 300):
        assert await c.compute(process_all(n)) == sum(range(1, n + 1))


@cluster(nthreads=[("", 1)])
async def test_results_held_on_this_worker_are_read_in_place(c, s, a):
    """``L`` and ``slow_len`` are dask.delayed tasks; the sum over ``L`` is
    computed in place from the copy of ``L`` in this worker's memory."""
    r = recorder(s)
    assert await c.compute(with_delayed(100, dask_key_name="root")) == sum(range(1, 101))
    prefixes = {str(k).split("-")[0] for k in r.memory}
    # The root seceded while it waited for slow_len, so the scheduler counts
    # its thread idle and a few calls may be handed out (work stealing).
    assert prefixes <= {"root", "data", "slow_len", "inc"}, r.memory
    assert len(r.ran("inc")) < 10, r.memory
    assert r.ran("data") and r.ran("slow_len")


@cluster(nthreads=[("", 1)])
async def test_annotated_and_not_inline_calls_stay_tasks(c, s, a):
    r = recorder(s)
    assert await c.compute(annotated(3)) == 2
    assert r.ran("inc"), r.memory  # annotations are for the scheduler: a task
    r.memory.clear()
    assert await c.compute(not_inline(10)) == sum(range(1, 11))
    assert len(r.ran("task_inc")) == 10


@cluster(nthreads=[("", 1)])
async def test_error_in_place_on_a_cluster(c, s, a):
    assert await c.compute(raises_at_yield(20, 3)) == "caught bad item 3"


@gen_cluster(client=True, nthreads=[("", 1)], config={"coro": {"inline": {"enabled": False}}})
async def test_inline_off_computes_as_tasks(c, s, a):
    r = recorder(s)
    assert await c.compute(process_all(20)) == sum(range(1, 21))
    assert len(r.ran("inc")) == 20


@cluster(nthreads=[("", 1)])
async def test_futures_are_not_computed_in_place(c, s, a):
    f = c.submit(list, range(5))
    assert isinstance(f, Future)

    @coroutine
    def uses_future(x):
        n = yield my_len(x)
        return n

    assert await c.compute(uses_future(f)) == 5



@dask.delayed
def plain_inc(x):
    return x + 1


@coroutine
def waits(x):
    y = yield plain_inc(x)  # a task: the inline call waits on the cluster
    return y


@coroutine
def promoted(n, folder):
    """A value to compute in place that is handed out before it starts: the
    first leaf waits on the cluster, so every unstarted leaf becomes a task,
    planned as the lazy value itself (L, computed inline, as data)."""
    L = gen(n, folder)
    first = yield my_len(L)  # computed in place: L is now held
    a, total = yield [waits(first), sum(inc(L[i]) for i in range(n))]
    return a, total


@cluster(nthreads=[("", 1)])
async def test_value_handed_out_before_it_starts_is_planned_as_itself(c, s, a, tmp_path):
    r = recorder(s)
    folder = str(tmp_path)
    assert await c.compute(promoted(30, folder)) == (31, sum(range(1, 31)))
    # The sum went out as tasks: its incs, getitems and adds, on L as data
    # (computed once, inline, in the first yield).
    assert len(r.ran("inc")) == 30, r.memory
    assert r.ran("add") and r.ran("getitem")
    assert _lines(folder, "gen") == ["30"]


@cluster(nthreads=[("", 1)])
async def test_calls_computed_in_place_are_counted_by_function(c, s, a):
    import dask_coro

    f = c.compute(process_all(25))
    assert await f == sum(range(1, 26))
    t = await dask_coro.tree(f)
    done = {name: counts["done"] for name, counts in t.functions.items()}
    assert done == {"gen": 1, "my_len": 1, "inc": 25}, t.functions


def test_a_future_in_the_graph_is_not_computed_in_place():
    # dask.delayed(future): the graph maps the future's key to the Future (a
    # TaskRef) itself; dask's convert_legacy_task would make it an Alias of
    # its own key. Either way the value is on the cluster: not local.
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    from dask_coro._internals.dask_private import Alias, TaskRef
    from dask_coro.core.localize import analyse

    for node in (TaskRef("k"), Alias("k", "k")):
        d = Delayed("k", HighLevelGraph.from_collections("k", {"k": node}))
        assert analyse(d, {}, {}, lambda f: False, None) is None
        plus = d + 1
        assert analyse(plus, {}, {}, lambda f: False, None) is None
