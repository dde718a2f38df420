"""Yielded lazy values computed in place: the runners' ``localize`` hook.

``core.localize`` reads graphs; here the coroutine's own lazy objects are
read as objects, before any graph is built: a ``CoroutineCall`` is its
function and arguments, a ``LazyOp`` (``runtime.ops``) its operator and
operands, a call computed inline its value. A leaf made only of those, of
plain values, and of ``Delayed`` graphs ``core.localize.analyse`` accepts,
runs as a ``LocalCall``: an inline call of ``core.localize.evaluate``.
Every value computed is kept where a task's would be: on the object
(``__dask_coro_value__``, so a graph built on it later holds the value), or,
for a graph's task, in the frame's result cache for as long as its layer
lives.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

from dask.base import is_dask_collection
from dask.delayed import Delayed, unpack_collections
from dask.typing import Key
from dask.utils import key_split

from .._internals.dask_private import TaskRef
from ..core.engine import NOT_DONE, Failed, Frame
from ..core.localize import CHEAP, Local, analyse, evaluate
from ..core.scope import Scope
from .call import (
    _PLAIN,
    _SPAN_ONLY,
    WRAPPERS,
    CoroutineCall,
    CoroutineFunction,
    CoroutineTask,
)
from .ops import _LENGTH, LazyOp

#: ``fetch(scope, keys)``: the values of ``keys`` (original keys of results of
#: earlier yields, ``scope.cache.known``) if all can be read here, else None.
Fetch = Callable[[Scope[Any], list[Key]], "dict[Key, Any] | None"]

_OBJ: Any = object()  # names of objects in a Local: (_OBJ, id(obj)), never a dask key


class LocalCall(Delayed):
    """An inline call that computes a yielded lazy value in place. It is that
    value's ``Delayed``, with its key and graph: handed out as a task (work
    stealing, or before its coroutine waits), it is planned as the value."""

    __slots__ = (
        "leaf",
        "__dask_coro_inline__",
        "__dask_coro_args__",
        "__dask_coro_value__",
        "__dask_coro_needs__",
    )
    leaf: Delayed
    __dask_coro_inline__: Callable[..., Any] | None
    __dask_coro_args__: tuple[Any, ...]
    __dask_coro_value__: Any
    #: The coroutine calls it computes in place (``core.engine.InlineCall``):
    #: one of them handed out as a task (built: it has a key), this is handed
    #: out too, planned as the leaf on that key; while one runs, this is not.
    __dask_coro_needs__: tuple[Any, ...]

    def __init__(
        self, leaf: Delayed, local: Local, fetched: dict[Key, Any], needs: tuple[Any, ...] = ()
    ):
        # The leaf's key and graph are built only if asked (handed out).
        self.leaf = leaf
        _LENGTH.__set__(self, getattr(leaf, "_length", None))
        self.__dask_coro_inline__ = evaluate
        self.__dask_coro_args__ = (local, fetched)
        self.__dask_coro_value__ = NOT_DONE
        self.__dask_coro_needs__ = needs

    @property
    def _key(self) -> Any:
        return self.leaf.key

    @property
    def _dask(self) -> Any:
        return self.leaf.dask

    @property
    def _layer(self) -> Any:
        return self.leaf._layer

    __setattr__ = object.__setattr__


def localizer(scope_of: Callable[[Frame], Scope[Any]], fetch: Fetch | None) -> Callable[[Frame, Any], Any]:
    """The ``localize`` hook of a runner's trampoline: ``scope_of(frame)``
    gives the frame's scope, made if need be; ``fetch`` reads results of
    earlier yields (None: never)."""

    def localize(frame: Frame, leaf: Any) -> Any:
        if not isinstance(leaf, Delayed) or type(leaf) is LocalCall:
            return None  # a Future, a collection, a plain value
        scope = frame.scope
        values = scope.cache.values if scope is not None else {}
        known = scope.cache.known if scope is not None else {}
        found = _analyse(leaf, values, known)
        if found is None:
            return None
        local, objects = found
        fetched: dict[Key, Any] = {}
        if local.fetch:
            got = fetch(scope, local.fetch) if fetch is not None and scope is not None else None
            if got is None:
                return None  # not all here: computed as tasks, as before
            fetched = got
        put = None
        if local.layers:  # values of graph tasks go to the frame's result cache
            put = (scope if scope is not None else scope_of(frame)).cache.put
        local.record = partial(_record, objects, local.layers, put)
        # The calls it runs as themselves (plain arguments): the engine may
        # hand those out at other positions of the stack.
        needs = tuple(
            x for x in objects.values() if type(x) is CoroutineCall and x.__dask_coro_inline__ is not None
        )
        return LocalCall(leaf, local, fetched, needs)

    return localize


def _analyse(leaf: Delayed, values: dict[Key, Any], known: dict[Key, Key]) -> tuple[Local, dict[Any, Any]] | None:
    """``leaf`` as a ``Local`` (objects named ``(_OBJ, id)``, graph tasks by
    key) and the objects by name, or None if anything under it must be a task."""
    local = Local(_name(leaf))
    objects: dict[Any, Any] = {}
    children_of: dict[int, list[Any]] = {}
    stack: list[tuple[Any, bool]] = [(leaf, False)]
    while stack:
        x, expanded = stack.pop()
        if expanded:
            local.tasks.append(_task(x, children_of.pop(id(x))))
            continue
        t = type(x)
        if t is CoroutineCall or t is LazyOp:
            name = _name(x)
            if name in local.seen:
                continue
            local.seen.add(name)
            if x.__dask_coro_inline__ is None and x.__dask_coro_value__ is not NOT_DONE:
                if type(x.__dask_coro_value__) is Failed:
                    return None  # planned, its task raises the error it raised
                local.start[name] = x.__dask_coro_value__
                continue
            if not x.built():
                children = _children(x)
                if children is None:
                    return None
                objects[name] = x
                children_of[id(x)] = children
                stack.append((x, True))
                stack.extend((c, False) for c in children)
                continue
            # Built (something asked for its key): read its graph. A call
            # whose own result is not at hand is then a task, as dask runs
            # it: computed in place here, each leaf needing it would make a
            # call of its own and run it again (``L.key`` asked, then
            # ``yield [inc(L[i]) for i in range(5)]`` ran ``L`` five times).
            if t is CoroutineCall and x.key not in values and x.key not in known:
                return None
            if analyse(x, values, known, _is_call, _make_call, into=local) is None:
                return None
            local.tasks.append((name, False, [x.key], partial(_value_of, x.key)))
        elif analyse(x, values, known, _is_call, _make_call, into=local) is None:
            return None  # a dask.delayed call, an attribute, a persisted value
    return local, objects


def _record(
    objects: dict[Any, Any],
    layers: dict[Key, Any],
    put: Callable[[Any, Key, Any], None] | None,
    name: Any,
    value: Any,
) -> None:
    """Keep ``value``: on the object it is the value of, or, for a graph's
    task, in the result cache while its layer lives."""
    obj = objects.get(name)
    if obj is not None:
        obj.__dask_coro_value__ = value
        obj.__dask_coro_inline__ = None
    elif put is not None and name in layers:
        put(layers[name], name, value)


def _name(x: Any) -> Any:
    t = type(x)
    if t is CoroutineCall or t is LazyOp:
        return (_OBJ, id(x))
    return x.key


def _children(x: Any) -> list[Any] | None:
    """The lazy objects ``x`` needs, or None if it must be a task."""
    if type(x) is CoroutineCall:
        fn: CoroutineFunction | None = x._fn
        ann = getattr(x, "_ann", None)
        if (
            fn is None
            or not fn.inline
            or getattr(x, "_name", None) is not None
            or (ann and ann.keys() != _SPAN_ONLY)
        ):
            return None
        args: Any = x.__dask_coro_args__
        if x._kwargs:
            args = (*args, *x._kwargs.values())
    else:
        if x.op not in CHEAP:
            return None  # a method call (``ops.Invoke``): its cost is unknown
        args = x.operands
    out: list[Any] = []
    for a in args:
        if type(a) in _PLAIN:
            continue
        for lazy in _lazy_in(a):
            if lazy is None:
                return None
            out.append(lazy)
    return out


def _lazy_in(a: Any) -> Iterator[Any]:
    """The lazy values in an argument (through lists, tuples and dicts, as
    dask unpacks them); None for one that cannot be computed here."""
    if isinstance(a, Delayed):
        yield a
    elif type(a) in (list, tuple):
        for b in a:
            yield from _lazy_in(b)
    elif type(a) is dict:
        for b in a.values():
            yield from _lazy_in(b)
    elif isinstance(a, TaskRef):
        # A Future (a TaskRef to dask): its value is on the cluster, and a
        # cancel or error of it must reach the call as it reaches a task.
        yield None
    elif is_dask_collection(a) or (type(a) in (set, frozenset) and any(isinstance(b, Delayed) for b in a)):
        yield None  # a collection (its graph is optimized as a whole)
    elif type(a) not in _PLAIN and unpack_collections(a)[1]:
        # Another container dask unpacks in an argument (a dataclass, a
        # namedtuple, a slice; ``dask.delayed.unpack_collections``) holding
        # lazy values: a task, whose arguments dask computes as it would.
        yield None


def _subst(a: Any, have: Mapping[Any, Any]) -> Any:
    """``a`` with its lazy values replaced by theirs."""
    if isinstance(a, Delayed):
        return have[_name(a)]
    t = type(a)
    if t is list:
        return [_subst(b, have) for b in a]
    if t is tuple:
        return tuple(_subst(b, have) for b in a)
    if t is dict:
        return {k: _subst(v, have) for k, v in a.items()}
    return a


def _task(x: Any, children: list[Any]) -> tuple[Any, bool, list[Any], Callable[[Mapping[Any, Any]], Any]]:
    name = _name(x)
    deps = [_name(c) for c in children]
    if type(x) is LazyOp:
        return (name, False, deps, partial(_apply, x))
    return (name, True, deps, partial(_call, x))


def _apply(x: LazyOp, have: Mapping[Any, Any]) -> Any:
    return x.op(*[_subst(o, have) for o in x.operands])


def _call(x: CoroutineCall, have: Mapping[Any, Any]) -> CoroutineCall:
    """The inline call of ``x`` with its arguments computed: ``x`` itself if
    they were plain values (so it is computed once, wherever it is yielded),
    or if it was computed meanwhile (another value computed in place needed
    it, or it was yielded itself): the engine takes its value, or raises
    its error again, and runs nothing."""
    if x.__dask_coro_inline__ is not None or x.__dask_coro_value__ is not NOT_DONE:
        return x
    assert x._fn is not None
    args = tuple(_subst(a, have) for a in x.__dask_coro_args__)
    kwargs = {k: _subst(v, have) for k, v in x._kwargs.items()} if x._kwargs else {}
    return _inline(x._fn, args, kwargs)


def _value_of(key: Key, have: Mapping[Any, Any]) -> Any:
    return have[key]


def _is_call(func: Any) -> bool:
    """A graph task function that is a coroutine call which may run inline."""
    if type(func) is not CoroutineTask:
        return False
    wrapper = WRAPPERS.get(func.func)
    return wrapper is None or wrapper.inline


def _make_call(func: CoroutineTask, args: tuple[Any, ...], kwargs: dict[str, Any], key: Key) -> CoroutineCall:
    """The inline call of a graph's coroutine task, its arguments computed."""
    fn = WRAPPERS.get(func.func)
    if fn is None:
        fn = CoroutineFunction(func.func, name=key_split(key))
    return _inline(fn, args, kwargs)


def _inline(fn: CoroutineFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CoroutineCall:
    """A call of ``fn`` that runs inline, whatever its arguments hold (they
    are values: nothing lazy is left in them)."""
    call = CoroutineCall()
    call._fn = fn
    call.__dask_coro_args__ = args
    call._kwargs = kwargs
    call.__dask_coro_value__ = NOT_DONE
    func = fn.run
    call.__dask_coro_inline__ = functools.partial(func, **kwargs) if kwargs else func
    return call
