"""Which results of earlier yields a coroutine may still use.

Pure: no dask, no distributed. A result computed for one yield is kept while
the coroutine still holds a lazy value that depends on it, so a later yield
reuses it instead of computing it again (``L`` in ``n = yield my_len(L)`` and
then ``yield [inc(L[i]) for i in range(n)]``). Lazy values built on one another
share graph *layer* objects, so "still holds" is "the layer is alive": the cache
keeps a weak reference to each layer, and a layer that dies puts its keys on the
list that ``sweep`` hands back for release.

Values computed in place (``core.localize``) are kept the same way, in
``values``, for as long as their layer lives.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the type checker only: this module does not import dask
    from dask.typing import Key


class ResultCache:
    """``known`` maps original keys to the keys that hold their results;
    ``values`` original keys to results computed in place."""

    __slots__ = ("known", "values", "_refs", "_dead", "_layers")

    def __init__(self) -> None:
        self.known: dict[Key, Key] = {}
        self.values: dict[Key, Any] = {}
        # id(layer) -> the keys of ``values`` computed for it (a weak reference
        # to the layer is in _refs; its death puts them on _dead).
        self._layers: dict[int, dict[Key, None]] = {}
        self._refs: dict[int, weakref.ref[Any]] = {}
        # Weakref callbacks may run on any thread (the garbage collector runs
        # where the last reference dies); they only append, which is atomic.
        self._dead: list[dict[Key, Key]] = []

    def add(self, layers: Iterable[tuple[Any, dict[Key, Key]]]) -> None:
        """Remember ``{original: renamed}`` keys for as long as ``layer`` lives."""
        dead, refs = self._dead, self._refs
        for layer, mapping in layers:
            self.known.update(mapping)

            def died(ref: weakref.ref[Any], mapping: dict[Key, Key] = mapping) -> None:
                refs.pop(id(ref), None)
                dead.append(mapping)

            ref = weakref.ref(layer, died)
            refs[id(ref)] = ref

    def put(self, layer: Any, key: Key, value: Any) -> None:
        """Keep ``value``, computed in place for ``key`` of ``layer``, while the
        layer lives."""
        self.values[key] = value
        keys = self._layers.get(id(layer))
        if keys is None:
            keys = self._layers[id(layer)] = {}
            dead, refs, layers = self._dead, self._refs, self._layers

            def died(ref: weakref.ref[Any], keys: dict[Key, None] = keys, lid: int = id(layer)) -> None:
                refs.pop(id(ref), None)
                if layers.get(lid) is keys:
                    del layers[lid]
                dead.append(dict.fromkeys(keys, _VALUE))

            ref = weakref.ref(layer, died)
            self._refs[id(ref)] = ref
        keys[key] = None

    def sweep(self) -> list[Key]:
        """The renamed keys no live lazy value depends on any more; forget them
        (and the values computed in place no live lazy value depends on)."""
        out: list[Key] = []
        while self._dead:
            for original, renamed in self._dead.pop().items():
                if renamed is _VALUE:
                    self.values.pop(original, None)
                elif self.known.get(original) == renamed:
                    del self.known[original]
                    out.append(renamed)
        return out

    def clear(self) -> list[Key]:
        """Forget everything; return every renamed key still known."""
        out = list(self.known.values())
        self.known.clear()
        self.values.clear()
        self._layers.clear()
        self._refs.clear()
        self._dead.clear()
        return out


_VALUE: Any = object()  # in a dead mapping: the key was a value computed in place
