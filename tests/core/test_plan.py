"""plan_yield: deterministic renaming, compute-once via ``known``, collections."""

from __future__ import annotations

import json
import operator
import os
import re
import subprocess
import sys
import textwrap

import dask
import dask.array as da
from dask._task_spec import Alias, DataNode, Task, TaskRef
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from dask.local import get_sync
from dask.utils import key_split

from dask_coro import coroutine
from dask_coro._internals.dask_private import expression_graph
from dask_coro.core.keys import slot_of
from dask_coro.core.plan import derive_key, plan_yield
from dask_coro.runtime.call import CoroutineTask

KEY_RE = re.compile(r"^[A-Za-z_][\w-]*-[0-9a-f]{32}$")
CHILD_RE = re.compile(r"^[A-Za-z_][\w-]*-[0-9a-f]{32}-[0-9a-f]{16}$")


@coroutine
def fib(i):
    return i


@coroutine
def gen():
    return [10, 20, 30]


@coroutine
def my_len(L):
    return len(L)


@coroutine
def add3(a, b, c):
    return a + b + c


def known_from(plan):
    out = {}
    for _layer, mapping in plan.layers:
        out.update(mapping)
    return out


def test_derive_key():
    k = derive_key("fib", "parent-1", 0, (1,))
    assert KEY_RE.match(k)
    assert k.startswith("fib-")
    assert k == derive_key("fib", "parent-1", 0, (1,))
    assert k != derive_key("fib", "parent-1", 1, (1,))
    assert k != derive_key("fib", "parent-2", 0, (1,))
    assert k != derive_key("fib", "parent-1", 0, (0,))
    assert k != derive_key("fib", "parent-1", 0, (1,), 1)
    # Only the prefix differs between prefixes.
    assert derive_key("g", "parent-1", 0, (1,)).split("-", 1)[1] == k.split("-", 1)[1]


def test_leaf_keys_deterministic_and_prefix_kept():
    x = fib(3)
    p1 = plan_yield([x], [(0,)], {}, "parent-1", 0)
    (out,) = p1.outputs
    assert out != x.key
    assert out.startswith("fib-")
    assert key_split(out) == "fib"
    assert CHILD_RE.match(out)
    assert out.startswith(derive_key("fib", "parent-1", 0, (0,)) + "-")
    # The same parent / index / path and the same call give the same key,
    # also for a new call object (with a different, random original key).
    y = fib(3)
    assert y.key != x.key
    p2 = plan_yield([y], [(0,)], {}, "parent-1", 0)
    assert p2.outputs == [out]
    assert list(p2.graph) == list(p1.graph)


def test_different_index_path_or_parent_gives_different_keys():
    x = fib(3)
    base = plan_yield([x], [(0,)], {}, "parent-1", 0).outputs[0]
    assert plan_yield([x], [(0,)], {}, "parent-1", 1).outputs[0] != base
    assert plan_yield([x], [(1,)], {}, "parent-1", 0).outputs[0] != base
    assert plan_yield([x], [(0,)], {}, "parent-2", 0).outputs[0] != base


def test_other_calls_at_a_slot_get_other_keys():
    """A re-run that yields other calls at the same place gets new keys at
    the same slots: never the first run's results."""
    base = plan_yield([fib(3)], [(0,)], {}, "p", 0).outputs[0]
    other = plan_yield([fib(4)], [(0,)], {}, "p", 0).outputs[0]
    assert other != base and slot_of(other) == slot_of(base)
    assert plan_yield([fib(3, )], [(0,)], {}, "p", 0).outputs[0] == base
    # Another function of the same name prefix at the slot.
    renamed = coroutine(lambda i: i + 1, name="fib")
    assert plan_yield([renamed(3)], [(0,)], {}, "p", 0).outputs[0] != base
    # A dependency that differs changes every key above it (the token of a
    # task covers its dependencies' keys).
    a = plan_yield([my_len(gen())], [()], {}, "p", 0)
    b = plan_yield([my_len(dask.delayed(list)([1]))], [()], {}, "p", 0)
    assert a.outputs[0] != b.outputs[0] and slot_of(a.outputs[0]) == slot_of(b.outputs[0])
    # A Future yielded: the key it names is the content.
    f1 = plan_yield([TaskRef("x")], [(0,)], {}, "p", 0).outputs[0]
    f2 = plan_yield([TaskRef("y")], [(0,)], {}, "p", 0).outputs[0]
    assert f1 != f2 and slot_of(f1) == slot_of(f2)


def test_slot_of_other_keys_is_none():
    assert slot_of("fib-" + "a" * 32) is None
    assert slot_of(("x", 1)) is None
    assert slot_of("x-" + "0" * 32 + "-" + "1" * 16) == "0" * 32


def test_content_tokens_do_not_depend_on_the_process():
    """A re-run happens in another worker process: the same calls must give
    the same keys there (string hashing and object ids differ)."""
    code = textwrap.dedent('''
        import json, operator
        import dask
        from dask_coro.core.plan import plan_yield
        from test_plan import fib, gen, my_len
        x = dask.delayed(operator.add)(fib(2), 3)
        p = plan_yield([x, my_len(gen()), fib(1)], [(0,), (1,), ("a",)], {}, "p", 0)
        print(json.dumps(p.outputs))
    ''')
    env = {**os.environ, "PYTHONHASHSEED": "random", "PYTHONPATH": os.path.dirname(__file__)}
    runs = [
        json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_several_leaves_each_get_their_key():
    a, b = fib(1), fib(2)
    p = plan_yield([a, b], [(0,), (1,)], {}, "par", 0)
    assert [k[:-17] for k in p.outputs] == [
        derive_key("fib", "par", 0, (0,)),
        derive_key("fib", "par", 0, (1,)),
    ]
    assert set(p.graph) == set(p.outputs)
    assert get_sync(dict(p.graph), p.outputs) == (1, 2)


def test_leaves_at_paths_with_equal_repr_get_distinct_keys():
    # Regression: keys are derived from repr(path); dict keys that print alike (here
    # two objects with the same repr) give two different leaves one key, and
    # the second task silently replaces the first in the graph.
    class Tag:
        def __repr__(self):
            return "Tag"

    a, b = fib(1), fib(2)
    p = plan_yield([a, b], [(Tag(),), (Tag(),)], {}, "par", 0)
    assert p.outputs[0] != p.outputs[1]
    assert len(p.graph) == 2
    assert get_sync(dict(p.graph), p.outputs) == (1, 2)


def test_same_leaf_twice_in_one_yield_is_planned_once():
    a = fib(5)
    p = plan_yield([a, a], [(0,), (1,)], {}, "par", 0)
    assert p.outputs[0] == p.outputs[1]
    assert len(p.graph) == 1


def test_shared_dependency_planned_once():
    L = gen()
    x, y = my_len(L), L[0]
    p = plan_yield([x, y], [(0,), (1,)], {}, "par", 0)
    # gen, my_len, getitem
    assert sorted(key_split(k) for k in p.graph) == ["gen", "getitem", "my_len"]
    assert get_sync(dict(p.graph), p.outputs) == (3, 10)


def test_coroutine_task_carries_renamed_key():
    L = gen()
    n = my_len(L)
    p = plan_yield([n], [()], {}, "par", 0)
    assert len(p.graph) == 2
    for new_key, task in p.graph.items():
        assert isinstance(task, Task)
        assert task.key == new_key
        assert isinstance(task.func, CoroutineTask)
        assert task.func.key == new_key
    # The original call is untouched.
    orig = n.__dask_graph__()[n.key]
    assert orig.func.key == n.key


def test_dependencies_first_and_references_renamed():
    L = gen()
    n = my_len(L)
    p = plan_yield([n], [()], {}, "par", 0)
    gen_key, len_key = list(p.graph)  # bottom-up order
    assert key_split(gen_key) == "gen"
    assert key_split(len_key) == "my_len"
    assert p.outputs == [len_key]
    assert p.graph[len_key].dependencies == frozenset({gen_key})
    assert L.key not in p.graph
    assert gen_key[:-17] == derive_key("gen", "par", 0, (), 1)
    assert len_key[:-17] == derive_key("my_len", "par", 0, ())


def test_keep_and_layers_for_delayed():
    L = gen()
    n = my_len(L)
    p = plan_yield([n], [()], {}, "par", 0)
    assert sorted(p.keep) == sorted(p.graph)
    assert known_from(p) == {
        n.key: p.outputs[0],
        L.key: next(k for k in p.graph if k.startswith("gen-")),
    }
    layers_of_n = set(map(id, n.__dask_graph__().layers.values()))
    assert {id(layer) for layer, _ in p.layers} <= layers_of_n


def test_known_keys_are_not_resubmitted():
    L = gen()
    n = my_len(L)
    p1 = plan_yield([n], [()], {}, "par", 0)
    known = known_from(p1)
    renamed_L = known[L.key]

    item = L[1]
    p2 = plan_yield([item], [(0,)], known, "par", 1)
    assert renamed_L not in p2.graph
    assert L.key not in p2.graph
    assert len(p2.graph) == 1
    (getitem_key,) = p2.graph
    assert key_split(getitem_key) == "getitem"
    assert p2.graph[getitem_key].dependencies == frozenset({renamed_L})
    assert p2.outputs == [getitem_key]
    # Only the new task is kept by this plan.
    assert p2.keep == [getitem_key]
    assert known_from(p2) == {item.key: getitem_key}
    # Computing it needs the earlier result.
    first = get_sync(dict(p1.graph), [renamed_L])
    graph = dict(p2.graph)
    graph[renamed_L] = Task(renamed_L, lambda: first[0])
    assert get_sync(graph, p2.outputs) == (20,)


def test_known_leaf_itself_is_referenced_not_resubmitted():
    L = gen()
    p1 = plan_yield([my_len(L)], [()], {}, "par", 0)
    known = known_from(p1)
    p2 = plan_yield([L], [()], known, "par", 1)
    assert p2.graph == {}
    assert p2.outputs == [known[L.key]]
    assert p2.keep == []
    assert p2.layers == []


def test_known_is_not_mutated():
    L = gen()
    p1 = plan_yield([my_len(L)], [()], {}, "par", 0)
    known = known_from(p1)
    before = dict(known)
    plan_yield([L[0]], [()], known, "par", 1)
    assert known == before


def computed(p):
    """The plan's outputs computed in this thread, its collections' tasks as
    the scheduler would build them."""
    graph = dict(p.graph)
    if p.compute is not None:
        graph.update(expression_graph(p.compute.expr))
        graph.update(p.compute.graph)
    return get_sync(graph, p.outputs)


def test_dask_array_leaf():
    # A collection keeps dask's keys (Client.compute's): nothing renamed, no
    # task built here, the same keys for the same collection anywhere.
    x = da.ones(10, chunks=5).sum()
    p = plan_yield([x], [()], {}, "par", 0)
    assert p.graph == {}
    assert p.compute is not None
    (out,) = p.outputs
    # The result is handed on under a key of ours (dask names an array's
    # finalized result anew each time), at the leaf's place.
    assert p.compute.outputs == [out]
    assert out[:-17] == derive_key(key_split(x.name), "par", 0, ())
    (name,) = p.compute.keys
    assert p.compute.graph[out].dependencies == {name}
    assert key_split(name) == key_split(client_compute_keys([x])[0])
    # Collections are not kept for later yields.
    assert p.keep == []
    assert p.layers == []
    assert computed(p) == (10.0,)
    # Deterministic: the same collection built again, the same key.
    again = plan_yield([da.ones(10, chunks=5).sum()], [()], {}, "par", 0)
    assert again.outputs == p.outputs
    other = plan_yield([x], [()], {}, "par", 1)
    assert other.outputs != p.outputs
    # Tasks below keep dask's keys, as Client.compute sends them.
    # (dask names the finalized aggregation anew each time, "...-<uuid>".)
    ours = {k for k in expression_graph(p.compute.expr) if type(k) is tuple}
    theirs = {k for k in expression_graph(client_compute_expr([x])) if type(k) is tuple}
    assert ours == theirs and len(ours) == 2


def client_compute_expr(colls):
    """The expression ``Client.compute(colls)`` sends (distributed.Client.compute)."""
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr

    return FinalizeCompute(collections_to_expr(colls, optimize_graph=True)).optimize()


def client_compute_keys(colls, expr=None):
    """The keys ``Client.compute(colls)`` asks for."""
    from dask.core import flatten

    return list(flatten((expr or client_compute_expr(colls)).__dask_keys__()))


def test_collections_of_one_yield_are_one_computation():
    # As dask.compute(x.sum(), x.mean()): one expression, shared tasks once.
    x = da.arange(8, chunks=2)
    p = plan_yield([x.sum(), x.mean()], [(0,), (1,)], {}, "par", 0)
    assert p.compute is not None and len(p.compute.keys) == 2
    graph = expression_graph(p.compute.expr)
    arange = [k for k in graph if key_split(k) == "arange"]
    assert len(arange) == 4  # once, for both
    assert computed(p) == (28, 3.5)


def test_a_collection_on_an_earlier_result_is_renamed():
    # Built on a Delayed an earlier yield computed: its graph refers to that
    # result's original key, which lives under a derived key; the collection
    # is planned as a Delayed is, its keys derived from the parent's.
    L = dask.delayed(lambda: [1, 2, 3, 4])()
    p1 = plan_yield([L], [()], {}, "par", 0)
    known = known_from(p1)
    arr = da.from_delayed(L, shape=(4,), dtype=int).sum()
    p2 = plan_yield([arr], [()], known, "par", 1)
    assert p2.compute is None
    assert all(CHILD_RE.match(k) for k in p2.graph)
    graph = dict(p2.graph)
    graph.update(p1.graph)
    assert get_sync(graph, p2.outputs) == (10,)


def test_dask_array_non_scalar_leaf():
    x = da.arange(6, chunks=2) * 2
    p = plan_yield([x], [()], {}, "par", 0)
    (value,) = computed(p)
    assert value.tolist() == [0, 2, 4, 6, 8, 10]


def test_delayed_leaf_depending_on_collection():
    arr = da.ones(4, chunks=2)
    d = dask.delayed(lambda a: int(a.sum()))(arr)
    p = plan_yield([d], [()], {}, "par", 0)
    assert all(isinstance(k, str) and CHILD_RE.match(k) for k in p.graph)
    assert get_sync(dict(p.graph), p.outputs) == (4,)


def test_future_like_task_ref_leaf():
    # A Future (a TaskRef) is not resubmitted: one task of ours, keyed like
    # any other leaf, depends on it and hands its value back.
    fkey = "inc-0123456789abcdef0123456789abcdef"
    ref = TaskRef(fkey)
    p = plan_yield([ref], [(2,)], {}, "par", 0)
    (out,) = p.outputs
    assert out[:-17] == derive_key("inc", "par", 0, (2,))
    assert list(p.graph) == [out]
    assert fkey not in p.graph
    assert p.graph[out].dependencies == frozenset({fkey})
    assert p.keep == []
    assert p.layers == []
    graph = dict(p.graph)
    graph[fkey] = DataNode(fkey, 123)
    assert get_sync(graph, p.outputs) == (123,)


def test_legacy_tuple_tasks_are_converted():
    hlg = HighLevelGraph.from_collections(
        "b-1", {"a-1": (operator.add, 1, 2), "b-1": (operator.mul, "a-1", 10)}
    )
    d = Delayed("b-1", hlg)
    p = plan_yield([d], [()], {}, "par", 0)
    assert sorted(key_split(k) for k in p.graph) == ["a", "b"]
    assert get_sync(dict(p.graph), p.outputs) == (30,)


def test_node_key_differing_from_graph_key():
    # Regression: dask allows a node's own ``.key`` to differ from the key the graph
    # holds it under (dask-expr's dd.from_delayed makes such Alias nodes);
    # dask's schedulers use the graph's key. _rename_below renames by
    # ``task.key`` and fails with KeyError (or, when ``task.key`` is in the
    # graph too, drops the node so that a dependent's input is missing).
    g = {
        "z-1": Task("z-1", operator.add, 1, 2),
        "x-1": Alias("y-1", "z-1"),  # held under "x-1", says it is "y-1"
        "out-1": Task("out-1", operator.mul, TaskRef("x-1"), 10),
    }
    assert get_sync(g, "out-1") == 30
    d = Delayed("out-1", HighLevelGraph.from_collections("out-1", g))
    assert d.compute(scheduler="sync") == 30
    p = plan_yield([d], [()], {}, "par", 0)
    assert len(p.graph) == 3
    assert get_sync(dict(p.graph), p.outputs) == (30,)


def test_mixed_leaves():
    x = fib(4)
    arr = da.ones(4, chunks=2).sum()
    p = plan_yield([x, arr], [(0,), (1, "k")], {}, "par", 2)
    assert p.outputs[0][:-17] == derive_key("fib", "par", 2, (0,))
    assert p.keep == [p.outputs[0]]
    assert computed(p) == (4, 4.0)


def test_keys_independent_of_hash_seed():
    code = textwrap.dedent(
        """
        import json
        from dask_coro import coroutine
        from dask_coro.core.plan import plan_yield

        @coroutine
        def a(): return 1
        @coroutine
        def b(): return 2
        @coroutine
        def c(): return 3
        @coroutine
        def add3(x, y, z): return x + y + z

        leaf = add3(a(), b(), c())
        p = plan_yield([leaf], [("k", 0)], {}, "parent-xyz", 4)
        print(json.dumps(list(p.graph)))
        """
    )
    outs = []
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        r = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout))
    assert outs[0] == outs[1] == outs[2]
    assert [key_split(k) for k in outs[0]][-1] == "add3"
    assert len(outs[0]) == 4
