"""ResultCache: remember renamed keys while their layer lives."""

from __future__ import annotations

import gc

from dask_coro.core.cache import ResultCache


class Layer:
    """Any weak-referenceable object stands in for a graph layer."""


def test_empty():
    c = ResultCache()
    assert c.known == {}
    assert c.sweep() == []
    assert c.clear() == []


def test_add_and_sweep_while_alive():
    c = ResultCache()
    layer = Layer()
    c.add([(layer, {"a-orig": "a-new", "b-orig": "b-new"})])
    assert c.known == {"a-orig": "a-new", "b-orig": "b-new"}
    gc.collect()
    assert c.sweep() == []
    assert c.known == {"a-orig": "a-new", "b-orig": "b-new"}
    del layer


def test_sweep_after_layer_dies():
    c = ResultCache()
    layer = Layer()
    c.add([(layer, {"a-orig": "a-new", "b-orig": "b-new"})])
    del layer
    gc.collect()
    assert sorted(c.sweep()) == ["a-new", "b-new"]
    assert c.known == {}
    # Handed back once only.
    assert c.sweep() == []


def test_only_dead_layers_are_swept():
    c = ResultCache()
    l1, l2 = Layer(), Layer()
    c.add([(l1, {"x": "x-new"}), (l2, {"y": "y-new"})])
    del l1
    gc.collect()
    assert c.sweep() == ["x-new"]
    assert c.known == {"y": "y-new"}
    del l2
    gc.collect()
    assert c.sweep() == ["y-new"]
    assert c.known == {}


def test_layer_in_reference_cycle_is_swept_after_gc():
    c = ResultCache()
    layer = Layer()
    layer.self = layer  # only the cycle collector frees it
    c.add([(layer, {"k": "k-new"})])
    del layer
    gc.collect()
    assert c.sweep() == ["k-new"]


def test_key_renamed_again_by_later_layer_is_not_swept():
    # A later yield may have mapped the same original key to another renamed
    # key; the death of the old layer must not drop the newer mapping.
    c = ResultCache()
    old, new = Layer(), Layer()
    c.add([(old, {"k": "k-first"})])
    c.add([(new, {"k": "k-second"})])
    assert c.known == {"k": "k-second"}
    del old
    gc.collect()
    assert c.sweep() == []
    assert c.known == {"k": "k-second"}
    del new
    gc.collect()
    assert c.sweep() == ["k-second"]
    assert c.known == {}


def test_add_several_calls_accumulate():
    c = ResultCache()
    l1, l2 = Layer(), Layer()
    c.add([(l1, {"a": "a1"})])
    c.add([(l2, {"b": "b1"})])
    assert c.known == {"a": "a1", "b": "b1"}
    del l1, l2


def test_add_empty():
    c = ResultCache()
    c.add([])
    assert c.known == {}
    assert c.sweep() == []


def test_clear_returns_known_and_forgets():
    c = ResultCache()
    l1, l2 = Layer(), Layer()
    c.add([(l1, {"a": "a-new"}), (l2, {"b": "b-new"})])
    assert sorted(c.clear()) == ["a-new", "b-new"]
    assert c.known == {}
    # Layers dying after clear do not bring anything back.
    del l1, l2
    gc.collect()
    assert c.sweep() == []
    assert c.clear() == []


def test_clear_drops_pending_dead():
    c = ResultCache()
    layer = Layer()
    c.add([(layer, {"a": "a-new"})])
    del layer
    gc.collect()
    assert c.clear() == ["a-new"]
    assert c.sweep() == []


def test_cache_does_not_keep_layer_alive():
    import weakref

    c = ResultCache()
    layer = Layer()
    ref = weakref.ref(layer)
    c.add([(layer, {"a": "a-new"})])
    del layer
    gc.collect()
    assert ref() is None
    assert c.sweep() == ["a-new"]
