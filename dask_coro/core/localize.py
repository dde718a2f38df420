"""Compute a yielded lazy value in place when everything under it is at hand.

No distributed import (dask's graph nodes only), no event loop, no threads.

In ``n = yield my_len(L)`` and then ``yield sum(inc(L[i]) for i in range(n))``
every call has a lazy argument, so each would be a task although ``L`` is
already computed and held by this very coroutine. A yielded leaf that is not
an inline call is *local* when every task under it is one of:

- a value at hand: data in the graph (a coroutine call computed inline is
  one), a result computed in place by an earlier yield (``values``), or a
  result of an earlier yield the caller can read here (``known``, read by the
  caller's ``fetch``);
- a cheap operation dask itself adds to a graph: the operators of ``Delayed``
  (``L[i]``, arithmetic, comparisons, and their swapped forms for
  ``0 + x``, which is how ``sum(lazy)`` starts), ``getattr`` (``x.attr``),
  or an alias;
- a coroutine call (``is_call(func)`` says which task functions are), whose
  arguments are then values.

A local leaf runs as an inline call of ``evaluate``: a generator body that
computes the cheap operations as soon as their inputs are in and yields the
coroutine calls, every call that is ready in one batch, as calls with values
for arguments. The engine runs them inline like calls with plain arguments,
and hands them out as tasks when other workers are idle (work stealing).
Everything else keeps its leaf remote, as before: a plain ``dask.delayed``
function (its cost is unknown), a collection's fused tasks, a Future or a
persisted value, a layer with annotations (they are for the scheduler).

Results, errors and compute-once stay as with tasks: a failing call or
operation raises at the yield with its own type and traceback; every value
computed in place is recorded (``record``) for as long as the layer it
belongs to lives, as the caller's result cache keeps task results, so a later
yield (local or not) reuses it instead of computing it again.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Generator, Mapping
from functools import partial
from typing import Any

from dask.typing import Key

from .._internals.dask_private import (
    Alias,
    DataNode,
    GraphNode,
    NestedContainer,
    Task,
    TaskRef,
    convert_legacy_task,
    swap,
)

__all__ = ["Local", "analyse", "evaluate"]

#: The operators ``Delayed`` binds (``dask.delayed``, ``Delayed._bind_operator``):
#: what dask adds to a graph for ``-x``, ``x + y``, ``x < y``, ``x[i]``; the
#: arithmetic ones (BINARY) have swapped forms too (``0 + x``), the comparisons
#: and ``getitem`` (COMPARE) do not. ``runtime.ops`` binds the same on
#: coroutine calls.
UNARY: tuple[Callable[..., Any], ...] = (operator.abs, operator.neg, operator.pos, operator.invert)
BINARY: tuple[Callable[..., Any], ...] = (
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.truediv,
    operator.mod,
    operator.pow,
    operator.and_,
    operator.or_,
    operator.xor,
    operator.lshift,
    operator.rshift,
)
COMPARE: tuple[Callable[..., Any], ...] = (
    operator.eq,
    operator.ge,
    operator.gt,
    operator.ne,
    operator.le,
    operator.lt,
    operator.getitem,
)
#: What is computed in place: those operators, and ``getattr`` (``DelayedAttr``,
#: ``x.attr``).
CHEAP: frozenset[Any] = frozenset({*UNARY, *BINARY, *COMPARE, getattr})

#: At most this many tasks are evaluated in place per leaf; a bigger graph
#: stays remote (its analysis would cost more than it saves).
LIMIT = 100_000

_DATA, _ALIAS, _CHEAP, _CALL = range(4)


class Local:
    """A leaf found local.

    ``out`` names its value; ``tasks`` lists ``(name, is_call, deps,
    compute)`` with dependencies first: ``compute(have)`` is the value
    (``is_call`` false) or the inline call to run (true) once every name in
    ``deps`` is in ``have``; ``record(name, value)``, if not None, keeps a
    computed value for later yields. ``fetch`` are the keys of earlier
    yields' results it needs (``known`` keys), ``start`` the values it has
    from the start (by name), ``layers`` the graph layer of each task named
    by its key (a value computed for it is kept while the layer lives)."""

    __slots__ = ("out", "tasks", "fetch", "start", "record", "layers", "seen")

    def __init__(self, out: Any) -> None:
        self.out = out
        self.tasks: list[tuple[Any, bool, list[Any], Callable[[Mapping[Any, Any]], Any]]] = []
        self.fetch: list[Key] = []
        self.start: dict[Any, Any] = {}
        self.record: Callable[[Any, Any], None] | None = None
        self.layers: dict[Key, Any] = {}
        self.seen: set[Any] = set()  # every name visited


def analyse(
    leaf: Any,
    values: Mapping[Key, Any],
    known: Mapping[Key, Key],
    is_call: Callable[[Any], bool],
    make_call: Callable[[Any, tuple[Any, ...], dict[str, Any], Key], Any],
    limit: int = LIMIT,
    into: Local | None = None,
) -> Local | None:
    """``leaf`` as a ``Local`` (its tasks named by their keys) if it can be
    computed in place, else None; with ``into``, its tasks are added there.

    ``leaf`` is a dask ``Delayed`` (anything else is not local); ``values``
    holds results computed in place before, ``known`` maps keys of earlier
    yields' results to the keys holding them; ``make_call(func, args, kwargs,
    key)`` makes the inline call of a coroutine task."""
    try:
        key = leaf.key
        graph = leaf.__dask_graph__()
    except Exception:
        return None
    layers = getattr(graph, "layers", None)
    if layers is None:  # a plain dict graph: a persisted Delayed
        return None
    nodes: dict[Key, tuple[Any, Any]] = {}
    for layer in layers.values():
        annotations = getattr(layer, "annotations", None)
        plain = not annotations or annotations.keys() == {"span"}
        for k, v in layer.items():
            nodes[k] = (v, layer if plain else _ANNOTATED)
    local = into if into is not None else Local(key)
    found: list[tuple[Key, GraphNode, int]] = []
    seen = local.seen
    stack: list[tuple[Key, bool]] = [(key, False)]
    while stack:
        k, expanded = stack.pop()
        if expanded:
            node = nodes[k][0]
            found.append((k, node, _kind(node, is_call)))
            continue
        if k in seen:
            continue
        seen.add(k)
        if k in values:
            local.start[k] = values[k]
            continue
        if k in known:
            local.fetch.append(k)
            continue
        entry = nodes.get(k)
        if entry is None:
            return None  # a key on the cluster this coroutine does not hold
        node, layer = entry
        if layer is _ANNOTATED:
            return None
        if isinstance(node, TaskRef):
            # A Future (or a Promise's) in the graph, under its own key
            # (``dask.delayed(future)``): its value is on the cluster.
            # Checked before converting: ``convert_legacy_task`` makes it an
            # ``Alias`` of its own key, which nothing here could compute.
            return None
        if not isinstance(node, GraphNode):
            node = convert_legacy_task(k, node, nodes.keys())
            nodes[k] = (node, layer)
        if _kind(node, is_call) < 0 or (isinstance(node, Alias) and node.target == k):
            return None
        if len(seen) > limit:
            return None
        stack.append((k, True))
        stack.extend((d, False) for d in node.dependencies)
    for k, node, kind in found:
        deps = list(node.dependencies)
        if kind == _CALL:
            assert isinstance(node, Task)
            local.tasks.append((k, True, deps, partial(_call_of, node, make_call)))
        elif kind == _ALIAS:
            assert isinstance(node, Alias)
            local.tasks.append((k, False, deps, partial(_alias, node.target)))
        else:
            local.tasks.append((k, False, deps, partial(_compute, node)))
        local.layers[k] = nodes[k][1]
    return local


def _compute(node: GraphNode, have: Mapping[Any, Any]) -> Any:
    return node({d: have[d] for d in node.dependencies})


def _alias(target: Key, have: Mapping[Any, Any]) -> Any:
    return have[target]


def _call_of(
    node: Task, make_call: Callable[[Any, tuple[Any, ...], dict[str, Any], Key], Any], have: Mapping[Any, Any]
) -> Any:
    args, kwargs = arguments(node, have)
    return make_call(node.func, args, kwargs, node.key)


def _kind(node: GraphNode, is_call: Callable[[Any], bool]) -> int:
    """What ``node`` is to the evaluator, or -1 if it must be a task."""
    if isinstance(node, DataNode):
        return _DATA
    if isinstance(node, Alias):
        return _ALIAS
    if isinstance(node, Task):
        func = node.func
        if is_call(func):
            kind = _CALL
        elif _is_cheap(func):
            kind = _CHEAP
        else:
            return -1
        if all(_nested_ok(a) for a in (*node.args, *node.kwargs.values())):
            return kind
    return -1


def _is_cheap(func: Any) -> bool:
    try:
        if func in CHEAP:
            return True
    except TypeError:  # unhashable
        return False
    return type(func) is partial and func.func is swap and len(func.args) == 1 and func.args[0] in CHEAP


def _nested_ok(arg: Any) -> bool:
    """An argument computed with its task: a reference, a container of
    arguments (what dask builds for a list of lazy values), a cheap operator,
    or a plain value."""
    if isinstance(arg, NestedContainer):
        return all(_nested_ok(a) for a in arg.args)
    if isinstance(arg, Task):
        return _is_cheap(arg.func) and all(_nested_ok(a) for a in (*arg.args, *arg.kwargs.values()))
    return not isinstance(arg, GraphNode) or isinstance(arg, (DataNode, TaskRef))


def evaluate(local: Local, fetched: Mapping[Key, Any]) -> Generator[list[Any], list[Any], Any]:
    """The body that computes ``local`` in place (run inline by the engine),
    from ``local.start`` and ``fetched`` (the values of ``local.fetch``).

    Cheap operations run as soon as their inputs are in; all coroutine calls
    that are ready go in one yield (Kahn's order: each task is visited once).
    Every value computed is recorded (``local.record``) as it comes."""
    have: dict[Any, Any] = dict(local.start)
    have.update(fetched)
    record = local.record
    tasks = local.tasks
    waiting: dict[Any, int] = {}
    dependents: dict[Any, list[int]] = {}
    ready: deque[int] = deque()
    for i, (name, _, deps, _) in enumerate(tasks):
        missing = [d for d in deps if d not in have]
        waiting[name] = len(missing)
        for d in missing:
            dependents.setdefault(d, []).append(i)
        if not missing:
            ready.append(i)

    def done(i: int, value: Any) -> None:
        name = tasks[i][0]
        have[name] = value
        if record is not None:
            record(name, value)
        for j in dependents.pop(name, ()):
            other = tasks[j][0]
            waiting[other] -= 1
            if not waiting[other]:
                ready.append(j)

    while ready:
        calls: list[int] = []
        made: list[Any] = []
        while ready:
            i = ready.popleft()
            _, is_call, _, compute = tasks[i]
            if is_call:
                calls.append(i)
                made.append(compute(have))
            else:
                done(i, compute(have))
        if calls:
            results = yield made
            for i, value in zip(calls, results):
                done(i, value)
    if local.out not in have:  # cannot happen: every task's inputs are in the graph
        raise RuntimeError(f"dask_coro could not compute {local.out!r} in place")
    return have[local.out]


def arguments(node: Task, have: Mapping[Key, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A coroutine task's arguments, computed as its task would receive them."""
    deps = {d: have[d] for d in node.dependencies}
    packed = Task(node.key, _pack, *node.args, **node.kwargs)
    out: tuple[tuple[Any, ...], dict[str, Any]] = packed(deps)
    return out


def _pack(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return args, kwargs


_ANNOTATED: Any = object()  # a layer with annotations other than a span

