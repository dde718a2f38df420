"""Which results of earlier yields a coroutine may still use.

Pure: no dask, no distributed. A result computed for one yield is kept while
the coroutine still holds a lazy value that depends on it, so a later yield
reuses it instead of computing it again (``L`` in ``n = yield my_len(L)`` and
then ``yield [inc(L[i]) for i in range(n)]``). Lazy values built on one another
share graph *layer* objects, so "still holds" is "the layer is alive": the cache
keeps a weak reference to each layer, and a layer that dies puts its keys on the
list that ``sweep`` hands back for release.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the type checker only: this module does not import dask
    from dask.typing import Key


class ResultCache:
    """``known`` maps original keys to the keys that hold their results."""

    __slots__ = ("known", "_refs", "_dead")

    def __init__(self) -> None:
        self.known: dict[Key, Key] = {}
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

    def sweep(self) -> list[Key]:
        """The renamed keys no live lazy value depends on any more; forget them."""
        out: list[Key] = []
        while self._dead:
            for original, renamed in self._dead.pop().items():
                if self.known.get(original) == renamed:
                    del self.known[original]
                    out.append(renamed)
        return out

    def clear(self) -> list[Key]:
        """Forget everything; return every renamed key still known."""
        out = list(self.known.values())
        self.known.clear()
        self._refs.clear()
        self._dead.clear()
        return out
