"""Operators on coroutine calls, made as cheaply as the calls themselves.

``L[i]``, ``x + y``, ``-x`` and ``sum(calls)`` on a ``Delayed`` go through
dask's ``Delayed`` operators, which build the result's graph at once by
copying the graphs of its operands: ``sum`` of n calls is a chain of n adds
and costs O(n**2) (a second for a thousand). On a coroutine call, and on the
result of such an operator, they make a ``LazyOp`` instead: a ``Delayed``
whose key and graph are built the first time anything asks for them, the
whole chain in one layer. Until then it is an operator and its operands,
which is what ``runtime.inplace`` reads to compute a yielded value in place.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Generator
from typing import Any

from dask.base import tokenize
from dask.delayed import Delayed, unpack_collections
from dask.highlevelgraph import HighLevelGraph
from dask.utils import funcname

from .._internals.dask_private import DataNode, Task, TaskRef, annotations_in_effect, delayed_slot
from ..core.engine import NOT_DONE, Request
from ..core.localize import BINARY, COMPARE, UNARY
from . import extensions

# Delayed's own slots, filled when dask first asks for a key or graph (here
# and in runtime.call).
_KEY = delayed_slot("_key")
_DASK = delayed_slot("_dask")
_LENGTH = delayed_slot("_length")
_LOCK = threading.RLock()
_SPAN_ONLY = {"span": None}.keys()



class BuiltLazily(Delayed):
    """A ``Delayed`` whose key and graph are built by ``_build`` (a subclass's)
    the first time anything asks for them: ``CoroutineCall`` and ``LazyOp``."""

    __slots__ = ()
    _build: Callable[[], Any]

    @property
    def _key(self) -> Any:
        try:
            return _KEY.__get__(self)
        except AttributeError:
            return self._build()

    @property
    def _dask(self) -> Any:
        try:
            return _DASK.__get__(self)
        except AttributeError:
            self._build()
            return _DASK.__get__(self)

    @property
    def _layer(self) -> Any:
        return self._key

    def __dask_postcompute__(self) -> Any:
        # Asked where a client computes or persists it (dask's
        # ``HLGExpr.from_collection``): the features' ``computing`` hook.
        extensions.computing(self._key)
        return Delayed.__dask_postcompute__(self)

    def built(self) -> bool:
        """Whether its key and graph exist yet."""
        try:
            _KEY.__get__(self)
        except AttributeError:
            return False
        return True

    # Plain slot stores (Delayed.__setattr__ is a Python function); setting an
    # unknown attribute raises AttributeError.
    __setattr__ = object.__setattr__

    def __getattr__(self, attr: str) -> Any:
        """``x.attr``: a ``LazyOp`` of ``getattr``, as ``Delayed.__getattr__``
        makes a ``DelayedAttr`` (its rules: no private names, dask's own
        object under ``dask.annotate``), so it is awaitable and computed in
        place like ``x[i]``. Reached only for names that are not attributes:
        an unset slot (``_name``) raises at once."""
        if attr.startswith("_"):
            raise AttributeError(f"Attribute {attr} not found")
        ann = annotations_in_effect.get()
        if ann and ann.keys() != _SPAN_ONLY:
            return Delayed.__getattr__(self, attr)
        if attr == "dtype" and type(self) is LazyOp and self.op is getattr and self.operands[1] == "dtype":
            # DelayedAttr.__getattr__'s guard: numpy probes x.dtype.dtype... (dask #4374)
            raise AttributeError("Attribute dtype not found")
        return make(getattr, (self, attr))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``x(...)``, and ``x.meth(...)`` on ``x.meth``: a ``LazyOp`` calling
        it, as dask's ``Delayed.__call__`` and ``DelayedAttr.__call__`` make a
        call (``call_function``, a new key each time: ``pure`` is off). Its
        cost is unknown: a task, never computed in place. ``dask_key_name=``,
        ``pure=`` and ``dask.annotate`` get dask's own object."""
        ann = annotations_in_effect.get()
        if "dask_key_name" in kwargs or "pure" in kwargs or (ann and ann.keys() != _SPAN_ONLY):
            return Delayed.__call__(self, *args, **kwargs)
        if type(self) is LazyOp and self.op is getattr and self.__dask_coro_value__ is NOT_DONE:
            obj, name = self.operands
            return make(Invoke(name), (obj, args, kwargs))
        return make(Invoke(None), (self, args, kwargs))


class LazyOp(BuiltLazily):
    """``op(*operands)`` on coroutine calls or other ``LazyOp``s: a full
    ``Delayed`` (compute, persist, pass it to other calls), built lazily.

    ``__dask_coro_value__`` is its value once it was computed in place
    (``NOT_DONE`` before; ``__dask_coro_inline__`` is always None: it is never
    an inline call itself): a graph built on it then holds the value, not the
    operation."""

    __slots__ = ("op", "operands", "__dask_coro_value__", "__dask_coro_inline__")
    op: Callable[..., Any]
    operands: tuple[Any, ...]
    __dask_coro_value__: Any
    __dask_coro_inline__: None

    def _build(self) -> Any:
        with _LOCK:
            if self.built():
                return _KEY.__get__(self)
            # Every unbuilt LazyOp under this one, operands first; iterative,
            # as a chain of adds is as deep as the list it sums.
            order: list[LazyOp] = []
            seen: set[int] = set()
            stack: list[tuple[LazyOp, bool]] = [(self, False)]
            while stack:
                x, expanded = stack.pop()
                if expanded:
                    order.append(x)
                    continue
                if id(x) in seen:
                    continue
                seen.add(id(x))
                stack.append((x, True))
                if x.__dask_coro_value__ is NOT_DONE:
                    stack.extend(
                        (o, False) for o in x.operands if type(o) is LazyOp and not o.built()
                    )
            layer: dict[Any, Any] = {}
            deps: dict[int, Any] = {}
            keys: dict[int, Any] = {}
            for x in order:
                name = funcname(x.op)
                if x.__dask_coro_value__ is not NOT_DONE:
                    key = f"{name}-{uuid.uuid4().hex}"
                    layer[key] = DataNode(key, x.__dask_coro_value__)
                    keys[id(x)] = key
                    continue
                args: list[Any] = []
                for o in x.operands:
                    if id(o) in keys:
                        args.append(TaskRef(keys[id(o)]))
                    elif isinstance(o, Delayed):
                        deps[id(o)] = o
                        args.append(TaskRef(o.key))
                    else:
                        a, collections = unpack_collections(o)
                        for c in collections:
                            deps[id(c)] = c
                        args.append(a)
                key = f"{name}-{tokenize(x.op, [('ref', a.key) if isinstance(a, TaskRef) else a for a in args])}"
                layer[key] = Task(key, x.op, *args)
                keys[id(x)] = key
            top = keys[id(self)]
            graph = HighLevelGraph.from_collections(top, layer, dependencies=list(deps.values()))
            for x in order:
                _DASK.__set__(x, graph)
                _KEY.__set__(x, keys[id(x)])
            return top

    def __await__(self) -> Generator[Any, Any, Any]:
        return Request(self).__await__()

    def __reduce__(self) -> tuple[Any, ...]:
        return _built, (self.key, self.dask, self._length)


class Invoke:
    """The operation of ``x.name(*args, **kwargs)`` (or of ``x(...)``, with
    no name) in a ``LazyOp``: ``Invoke(name)(x, args, kwargs)``. Each is a
    new token, so each call gets a key of its own (``pure=False``, dask's
    default for ``call_function``)."""

    def __init__(self, name: str | None):
        self.name = name
        self.__name__ = name or "call"  # the key's prefix (dask.utils.funcname)
        self.token = uuid.uuid4().hex

    def __call__(self, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        f = obj if self.name is None else getattr(obj, self.name)
        return f(*args, **kwargs)

    def __dask_tokenize__(self) -> tuple[str, str]:
        return ("dask_coro.Invoke", self.token)


def _built(key: Any, graph: Any, length: int | None) -> Delayed:
    return Delayed(key, graph, length)


_new = object.__new__


def make(op: Callable[..., Any], operands: tuple[Any, ...]) -> LazyOp:
    x = _new(LazyOp)
    x._length = None
    x.op = op
    x.operands = operands
    x.__dask_coro_value__ = NOT_DONE
    x.__dask_coro_inline__ = None
    return x


def _lazy(op: Callable[..., Any], dask_method: Callable[..., Any], arity: int, swap: bool) -> Callable[..., Any]:
    """The method for ``op``: a ``LazyOp``; dask's own under ``dask.annotate``
    (a layer takes the annotations in effect when it is made)."""
    if arity == 1:

        def unary(self: Any) -> Any:
            ann = annotations_in_effect.get()
            if ann and ann.keys() != _SPAN_ONLY:
                return dask_method(self)
            return make(op, (self,))

        return unary

    def binary(self: Any, other: Any) -> Any:
        ann = annotations_in_effect.get()
        if ann and ann.keys() != _SPAN_ONLY:
            return dask_method(self, other)
        return make(op, (other, self) if swap else (self, other))

    return binary


def bind_operators(cls: type) -> None:
    """Give ``cls`` (a ``Delayed`` subclass) lazy operators."""
    for op in UNARY:
        meth = f"__{op.__name__}__"
        setattr(cls, meth, _lazy(op, getattr(Delayed, meth), 1, False))
    for op in (*BINARY, *COMPARE):
        name = op.__name__.rstrip("_")
        meth = f"__{name}__"
        setattr(cls, meth, _lazy(op, getattr(Delayed, meth), 2, False))
        if op in BINARY:
            rmeth = f"__r{name}__"
            setattr(cls, rmeth, _lazy(op, getattr(Delayed, rmeth), 2, True))


bind_operators(LazyOp)
