"""ResultCache: remember renamed keys while their layer lives."""

from __future__ import annotations

import gc

from dask_coro.core.cache import ResultCache


class Layer:
    """Any weak-referenceable object stands in for a graph layer."""


def cache_with(*renames: dict) -> tuple[ResultCache, list[Layer]]:
    """A cache given, in one ``add``, a live layer for each of ``renames``
    (original key -> renamed key): the cache, and those layers, held by the
    caller alone."""
    c = ResultCache()
    layers = [Layer() for _ in renames]
    c.add(list(zip(layers, renames)))
    return c, layers


def swept(c: ResultCache) -> list:
    """``c.sweep()`` once the cycle collector ran: the renamed keys of the
    layers that died, handed back."""
    gc.collect()
    return c.sweep()


def test_empty():
    c = ResultCache()
    assert c.known == {}
    assert c.sweep() == []
    assert c.clear() == []


def test_add_and_sweep_while_alive():
    c, [layer] = cache_with({"a-orig": "a-new", "b-orig": "b-new"})
    assert c.known == {"a-orig": "a-new", "b-orig": "b-new"}
    assert swept(c) == []
    assert c.known == {"a-orig": "a-new", "b-orig": "b-new"}
    del layer


def test_sweep_after_layer_dies():
    c, [layer] = cache_with({"a-orig": "a-new", "b-orig": "b-new"})
    del layer
    assert sorted(swept(c)) == ["a-new", "b-new"]
    assert c.known == {}
    # Handed back once only.
    assert c.sweep() == []


def test_only_dead_layers_are_swept():
    c, [l1, l2] = cache_with({"x": "x-new"}, {"y": "y-new"})
    del l1
    assert swept(c) == ["x-new"]
    assert c.known == {"y": "y-new"}
    del l2
    assert swept(c) == ["y-new"]
    assert c.known == {}


def test_layer_in_reference_cycle_is_swept_after_gc():
    c, [layer] = cache_with({"k": "k-new"})
    layer.self = layer  # only the cycle collector frees it
    del layer
    assert swept(c) == ["k-new"]


def test_key_renamed_again_by_later_layer_is_not_swept():
    # A later yield may have mapped the same original key to another renamed
    # key; the death of the old layer must not drop the newer mapping.
    c = ResultCache()
    old, new = Layer(), Layer()
    c.add([(old, {"k": "k-first"})])
    c.add([(new, {"k": "k-second"})])
    assert c.known == {"k": "k-second"}
    del old
    assert swept(c) == []
    assert c.known == {"k": "k-second"}
    del new
    assert swept(c) == ["k-second"]
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
    c, [l1, l2] = cache_with({"a": "a-new"}, {"b": "b-new"})
    assert sorted(c.clear()) == ["a-new", "b-new"]
    assert c.known == {}
    # Layers dying after clear do not bring anything back.
    del l1, l2
    assert swept(c) == []
    assert c.clear() == []


def test_clear_drops_pending_dead():
    c, [layer] = cache_with({"a": "a-new"})
    del layer
    gc.collect()
    assert c.clear() == ["a-new"]
    assert c.sweep() == []


def test_cache_does_not_keep_layer_alive():
    import weakref

    c, [layer] = cache_with({"a": "a-new"})
    ref = weakref.ref(layer)
    del layer
    gc.collect()
    assert ref() is None
    assert c.sweep() == ["a-new"]
