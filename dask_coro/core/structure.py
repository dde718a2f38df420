"""Flatten what a coroutine yielded into leaves, and rebuild the same shape.

Pure: no dask, no distributed. What is walked is what ``dask.compute``
walks (``dask.base.unpack_collections``, dask 2026.8.0): a ``list`` or
``tuple``, a ``dict`` or ``OrderedDict`` (exact types: a subclass of either
is a plain value, as dask returns it untouched), a dataclass instance (its
``dataclasses.fields``, rebuilt as ``type(*values)``) and a namedtuple
(``dask.utils.is_namedtuple_instance``, rebuilt as ``type(*items)``).
Everything else is handed to ``classify``, which says whether it is a leaf to
compute (True), a plain value to return as is (False), or raises (a set, which
dask would walk, is refused there: it has no order to give results back in).
``tests/core/test_structure.py`` compares the walk with ``dask.compute``.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

Path = tuple[Any, ...]


def format_path(path: Path) -> str:
    """``(1, 'a')`` -> ``"[1]['a']"``; the empty path is the yielded object itself."""
    return "".join(f"[{p!r}]" for p in path) or "(top level)"


class Structure:
    """The leaves of a yielded object and the recipe to rebuild its shape.

    Parameters
    ----------
    obj
        What the coroutine yielded.
    classify
        ``classify(obj, path) -> bool``: True for a leaf that must be computed,
        False for a plain value kept as is. Raises to reject an object.
    """

    __slots__ = ("leaves", "paths", "_template")

    def __init__(self, obj: Any, classify: Callable[[Any, Path], bool]):
        self.leaves: list[Any] = []
        self.paths: list[Path] = []
        self._template = self._walk(obj, (), classify)

    def _walk(self, obj: Any, path: Path, classify: Callable[[Any, Path], bool]) -> Any:
        # The template mirrors obj; a leaf becomes _Slot(i), the index into leaves.
        typ = type(obj)
        if typ is list:
            return [self._walk(x, (*path, i), classify) for i, x in enumerate(obj)]
        if typ is tuple or is_namedtuple_instance(obj):
            items = [self._walk(x, (*path, i), classify) for i, x in enumerate(obj)]
            return _TupleTemplate(typ, items)
        if typ is dict:
            return {k: self._walk(v, (*path, k), classify) for k, v in obj.items()}
        if typ is OrderedDict:
            return _DictTemplate(typ, {k: self._walk(v, (*path, k), classify) for k, v in obj.items()})
        if hasattr(typ, _DATACLASS_FIELDS):  # dataclasses.is_dataclass, for an instance
            items = [
                self._walk(getattr(obj, f.name), (*path, f.name), classify)
                for f in dataclasses.fields(obj)
            ]
            return _TupleTemplate(typ, items)
        if classify(obj, path):
            self.leaves.append(obj)
            self.paths.append(path)
            return _Slot(len(self.leaves) - 1)
        return _Value(obj)

    def without_leaves(self) -> Structure:
        """The same shape and paths, holding none of the leaves: to rebuild
        once their results are in, without keeping the leaves alive."""
        out = Structure.__new__(Structure)
        out.leaves = [None] * len(self.leaves)
        out.paths = self.paths
        out._template = self._template
        return out

    def rebuild(self, results: Sequence[Any]) -> Any:
        """The yielded shape, with leaf ``i`` replaced by ``results[i]``."""
        if len(results) != len(self.leaves):
            raise ValueError(f"expected {len(self.leaves)} results, got {len(results)}")
        return _fill(self._template, results)


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _Value:
    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class _TupleTemplate:
    """A tuple, namedtuple or dataclass: rebuilt as ``typ(*items)``."""

    __slots__ = ("typ", "items")

    def __init__(self, typ: type, items: list[Any]):
        self.typ = typ
        self.items = items


class _DictTemplate:
    """An ``OrderedDict``: rebuilt as ``typ(items)``."""

    __slots__ = ("typ", "items")

    def __init__(self, typ: type, items: dict[Any, Any]):
        self.typ = typ
        self.items = items


_DATACLASS_FIELDS = "__dataclass_fields__"  # what dataclasses.is_dataclass looks for


def is_namedtuple_instance(obj: Any) -> bool:
    """``dask.utils.is_namedtuple_instance``, restated (this module imports no
    dask; ``tests/core/test_structure.py`` compares the two): a tuple with the
    namedtuple API."""
    return (
        isinstance(obj, tuple)
        and hasattr(obj, "_make")
        and hasattr(obj, "_asdict")
        and hasattr(obj, "_replace")
        and hasattr(obj, "_fields")
        and hasattr(obj, "_field_defaults")
    )


def _fill(t: Any, results: Sequence[Any]) -> Any:
    typ = type(t)
    if typ is _Slot:
        return results[t.index]
    if typ is _Value:
        return t.value
    if typ is list:
        return [_fill(x, results) for x in t]
    if typ is dict:
        return {k: _fill(v, results) for k, v in t.items()}
    if typ is _DictTemplate:
        return t.typ({k: _fill(v, results) for k, v in t.items.items()})
    assert typ is _TupleTemplate
    items = [_fill(x, results) for x in t.items]
    return t.typ(*items) if t.typ is not tuple else tuple(items)
