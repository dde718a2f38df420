"""The one conversion point: what may a coroutine yield or await?

``is_lazy(obj)`` answers True for an object to compute (a ``Delayed`` or
coroutine call, a ``distributed.Future``, any dask collection), False for a
plain value returned as is, and raises ``BadYieldError`` for objects that are
almost certainly a mistake. It is a ``functools.singledispatch`` function, so a
new kind of yieldable registers itself (``is_lazy.register(MyType)``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import types
from collections.abc import Callable, Iterator
from functools import singledispatch
from typing import Any

import dask
from dask.delayed import Delayed

from .._exceptions import BadYieldError
from .._exceptions import Rejected as Rejected  # for functions registered with is_lazy
from .._internals.dask_private import TaskRef
from .structure import Path, format_path

ACCEPTED = (
    "a coroutine may yield Delayed objects, coroutine calls, Futures, dask "
    "collections, plain values, or lists/tuples/dicts of them"
)


@singledispatch
def is_lazy(obj: Any) -> bool:
    if dask.is_dask_collection(obj) or isinstance(obj, TaskRef):
        return True  # Delayed, coroutine calls, arrays, bags, dataframes, Futures
    if hasattr(obj, "__await__"):
        raise Rejected("an awaitable of another event loop cannot be waited for here")
    if isinstance(obj, Iterator):
        raise Rejected("an iterator is consumed once; yield a list of its items instead")
    return False


@is_lazy.register(Delayed)
def _(obj: Any) -> bool:
    # Without asking for its graph: a coroutine call builds its key and graph
    # only when asked (``is_dask_collection`` would), and may then not run inline.
    return True


@is_lazy.register(set)
@is_lazy.register(frozenset)
def _(obj: Any) -> bool:
    raise Rejected("a set has no order to give results back in; yield a list instead")


@is_lazy.register(types.GeneratorType)
@is_lazy.register(types.CoroutineType)
@is_lazy.register(types.AsyncGeneratorType)
def _(obj: Any) -> bool:
    # A generator expression is a generator object too, but no function of the
    # user's made it: it is an iterator like map(...), and gets that hint.
    if getattr(getattr(obj, "gi_code", None), "co_name", None) == "<genexpr>":
        raise Rejected(
            "a generator expression is an iterator, consumed once; yield a list "
            "of its items instead: [f(x) for x in xs], not (f(x) for x in xs)"
        )
    raise Rejected(
        "did you call a generator or async function without @dask_coro.coroutine?"
    )


@is_lazy.register(concurrent.futures.Future)
@is_lazy.register(asyncio.Future)
def _(obj: Any) -> bool:
    raise Rejected("only distributed.Future objects can be yielded")


def classifier(name: str, index: int) -> Callable[[Any, Path], bool]:
    """``is_lazy`` with an error message naming the coroutine, the yield and the
    position of the offending object."""

    def classify(obj: Any, path: Path) -> bool:
        try:
            return is_lazy(obj)
        except Rejected as e:
            raise BadYieldError(
                f"coroutine {name!r} yielded {_short_repr(obj)} at position "
                f"{format_path(path)} of yield #{index}; {ACCEPTED}{_hint(e)}"
            ) from None

    return classify


def spawn_classifier(group: str, index: int) -> Callable[[Any, Path], bool]:
    """``is_lazy`` for what ``Group.spawn`` was given (anything a yield
    accepts), its error naming the group, the child and the position."""

    def classify(obj: Any, path: Path) -> bool:
        try:
            return is_lazy(obj)
        except Rejected as e:
            raise BadYieldError(
                f"spawn() of child {index} of {group} was given {_short_repr(obj)} at "
                f"position {format_path(path)}; {ACCEPTED}{_hint(e)}"
            ) from None

    return classify


def _hint(e: Rejected) -> str:
    return f" ({e.hint})" if e.hint else ""


def _short_repr(obj: Any) -> str:
    r = repr(obj)
    return r if len(r) <= 200 else r[:197] + "..."
