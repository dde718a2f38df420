"""Scope: the runner's decisions for one frame, without a cluster.

Which keys of a plan to ask for (``wanted``), which handle answers each leaf
(``record``), and what to release when a yield ends (``end_yield``) or the
body does (``end_body``). Handles are plain objects: what is released is
checked by identity.
"""

from __future__ import annotations

import gc

import dask
import dask.bag as db

from dask_coro.core.plan import plan_yield
from dask_coro.core.scope import Scope


class Handle:
    """A stand-in for a Future (worker runner) or a value (local runner)."""

    def __init__(self, key):
        self.key = key

    def __repr__(self):
        return f"Handle({self.key!r})"


class Layer:
    """A stand-in for a graph layer: only its liveness matters."""


def handles_for(keys):
    return {k: Handle(k) for k in keys}


def same(got, expected):
    """``got`` holds exactly the objects ``expected`` does, in order."""
    return len(got) == len(expected) and all(g is e for g, e in zip(got, expected))


@dask.delayed
def inc(x):
    return x + 1


# --- wanted ------------------------------------------------------------------


def test_wanted_is_the_new_keys_kept_first_in_order_once_each():
    graph = {"k": None, "a": None, "b": None}
    # "h" is held from an earlier yield: not in this plan's graph.
    got = Scope.wanted(["a", "b", "a", "h"], ["k", "a"], graph)
    assert got == ["k", "a", "b"]


def test_wanted_is_empty_when_every_output_is_held():
    assert Scope.wanted(["h1", "h2"], [], {}) == []


# --- record ------------------------------------------------------------------


def test_record_answers_outputs_by_new_handles_and_holds_kept_ones():
    scope = Scope("root")
    new = handles_for(["x", "y"])
    scope.record([0, 1], ["x", "y"], ["x"], [], new)
    assert same(scope.handles([1, 0]), [new["y"], new["x"]])
    assert scope.pending == {0: ("x", new["x"]), 1: ("y", new["y"])}
    assert list(scope.held) == ["x"] and scope.held["x"] is new["x"]


def test_record_answers_a_held_output_by_its_handle():
    scope = Scope("root")
    first = handles_for(["x"])
    scope.record([0], ["x"], ["x"], [], first)
    assert scope.end_yield() == []  # held: nothing to release
    # The next yield asks for "x" again and for a new "z" at position 1.
    second = handles_for(["z"])
    scope.record([1, 0], ["z", "x"], [], [], second)
    assert same(scope.handles([0, 1]), [first["x"], second["z"]])


def test_one_key_answers_several_positions_with_one_handle():
    scope = Scope("root")
    new = handles_for(["x"])
    scope.record([0, 1], ["x", "x"], [], [], new)
    assert same(scope.handles([0, 1]), [new["x"], new["x"]])
    # Released once per position that is not held: the runner releases a
    # Future per reference it made.
    assert same(scope.end_yield(), [new["x"], new["x"]])


# --- end_yield ---------------------------------------------------------------


def test_end_yield_releases_the_pending_handles_not_held():
    scope = Scope("root")
    new = handles_for(["x", "y", "z"])
    scope.record([0, 1, 2], ["x", "y", "z"], ["y"], [], new)
    scope.error = ValueError("planning failed")
    assert same(scope.end_yield(), [new["x"], new["z"]])
    assert scope.pending == {} and scope.error is None
    assert scope.held == {"y": new["y"]}
    assert scope.end_yield() == []  # nothing pending any more


def test_end_yield_releases_held_results_whose_layer_died():
    scope = Scope("root")
    alive, dying = Layer(), Layer()
    new = handles_for(["a2", "b2"])
    scope.record([0], ["b2"], ["a2", "b2"], [(alive, {"a": "a2"}), (dying, {"b": "b2"})], new)
    assert scope.cache.known == {"a": "a2", "b": "b2"}
    assert scope.end_yield() == []  # both held, both layers alive
    del dying
    gc.collect()
    assert same(scope.end_yield(), [new["b2"]])
    assert scope.held == {"a2": new["a2"]} and scope.cache.known == {"a": "a2"}
    assert scope.end_yield() == []  # released once
    del alive
    gc.collect()
    assert same(scope.end_yield(), [new["a2"]])
    assert scope.held == {} and scope.cache.known == {}


def test_end_yield_keeps_a_key_renamed_again_by_a_later_layer():
    # A later yield's layer maps the same original key to another key: the
    # first layer dying does not release the current result.
    scope = Scope("root")
    old, current = Layer(), Layer()
    first = handles_for(["a1"])
    scope.record([0], ["a1"], ["a1"], [(old, {"a": "a1"})], first)
    assert scope.end_yield() == []
    second = handles_for(["a2"])
    scope.record([0], ["a2"], ["a2"], [(current, {"a": "a2"})], second)
    assert scope.end_yield() == []
    del old
    gc.collect()
    assert scope.end_yield() == []
    assert scope.held == {"a1": first["a1"], "a2": second["a2"]}
    del current
    gc.collect()
    assert same(scope.end_yield(), [second["a2"]])


# --- end_body ----------------------------------------------------------------


def test_end_body_releases_everything_held():
    scope = Scope("root")
    layer = Layer()
    new = handles_for(["x", "y"])
    scope.record([0, 1], ["x", "y"], ["x", "y"], [(layer, {"x0": "x", "y0": "y"})], new)
    assert scope.end_yield() == []
    assert same(scope.end_body(), [new["x"], new["y"]])
    assert scope.held == {} and scope.cache.known == {}
    assert scope.end_body() == []
    del layer
    gc.collect()
    assert scope.end_yield() == []  # the cache forgot the layer


# --- with the real planner -----------------------------------------------------


def test_delayed_results_are_reused_by_later_yields_while_their_layers_live():
    scope = Scope("root")
    a = inc(1)
    b = inc(a)
    plan = plan_yield([b], [()], scope.cache.known, scope.ident, 0)
    wanted = Scope.wanted(plan.outputs, plan.keep, plan.graph)
    assert wanted == plan.keep and len(wanted) == 2  # a's and b's tasks, renamed
    assert plan.outputs[0] in plan.keep
    new = handles_for(wanted)
    scope.record([0], plan.outputs, plan.keep, plan.layers, new)
    (out_b,) = plan.outputs
    assert same(scope.handles([0]), [new[out_b]])
    assert scope.end_yield() == []  # both kept while a and b live

    # The next yield asks for ``a`` again (and for a new call on it): ``a``
    # is referred to, not submitted, and answered by the handle held for it.
    c = inc(a)
    plan2 = plan_yield([a, c], [(0,), (1,)], scope.cache.known, scope.ident, 1)
    out_a, out_c = plan2.outputs
    assert out_a in new and out_a not in plan2.graph
    wanted2 = Scope.wanted(plan2.outputs, plan2.keep, plan2.graph)
    assert wanted2 == [out_c]
    new2 = handles_for(wanted2)
    scope.record([0, 1], plan2.outputs, plan2.keep, plan2.layers, new2)
    assert same(scope.handles([0, 1]), [new[out_a], new2[out_c]])
    assert scope.end_yield() == []  # all held: a, b and c live

    # Once the body lets go of b and c, their results go; a's stays.
    del b, c, plan, plan2
    gc.collect()
    released = scope.end_yield()
    # (in the order the layers died)
    assert sorted(map(id, released)) == sorted(map(id, [new[out_b], new2[out_c]]))
    assert list(scope.held) == [out_a]
    del a
    gc.collect()
    assert same(scope.end_yield(), [new[out_a]])
    assert scope.held == {}


def test_a_collection_result_is_released_when_its_yield_ends():
    # A finalized collection keeps no key for later yields: its result is
    # only needed until the body has it.
    scope = Scope("root")
    bag = db.from_sequence([1, 2, 3], npartitions=2).map(lambda x: x + 1)
    plan = plan_yield([bag], [()], scope.cache.known, scope.ident, 0)
    assert plan.keep == [] and plan.layers == []
    # Its result comes from the yield's one computation of collections
    # (plan.compute, sent as Client.compute sends it), not from the graph.
    assert plan.compute is not None and plan.compute.outputs == plan.outputs
    assert Scope.wanted(plan.outputs, plan.keep, plan.graph) == []
    new = handles_for(plan.compute.outputs)
    scope.record([0], plan.outputs, plan.keep, plan.layers, new)
    assert same(scope.end_yield(), [new[plan.outputs[0]]])
    assert scope.end_body() == []
