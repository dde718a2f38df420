"""Turn the lazy leaves of one yield into one graph to submit.

No distributed import: the same plan feeds the in-process driver and the worker
runner. For each leaf the plan names the key that will hold its value.

Keys. Every task a yield adds is renamed to a key made of a slot, derived from
the parent's key, the yield's index and the leaf's position in the yielded
structure (and, for tasks the leaf depends on, their depth-first position below
it), and a token of the task's content (``core.keys``). A parent that re-runs
after a failure and yields the same calls submits the same keys again; one that
yields other calls gets other keys at the same slots. The prefix (``fib`` in
``fib-1f0c...``) is kept, so the dashboard groups tasks as before.

A key the user chose in a yielded ``Delayed`` (``dask_key_name=``, a
``Delayed`` built with its key; ``keys.named_by_user``) is kept, as
``Client.compute`` keeps it: another client's ``Future("my-inc")`` finds it,
and two coroutines yielding it share one task. Tasks below such a key take
their slot from it, not from the parent, so every coroutine that yields it
submits the same graph.

Collections. The collections of one yield (anything but a ``Delayed`` or a
Future) are computed together as ``dask.compute`` and ``Client.compute``
compute them: one finalized, optimized expression (``Compute``), not
materialized here, with dask's own keys (tokens of what they compute: the
same on a re-run that builds the collection again; P2P operations find their
barrier by them). Each result is handed on by one small task under a
derived key, since dask names an array's finalized result anew each time. A
collection whose graph holds a key an earlier yield computed (``known``) or
computed in place (``values``) must refer to it under its new key: it is
planned as a ``Delayed`` is, every task renamed.

Annotations. What a task gets is what the scheduler would give it had the
leaf been computed with ``Client.compute`` under the annotations in effect
at the yield (``annotations``, ``Scheduler._apply_annotations``): those, with
the annotations of its layer (a ``Delayed``'s, taken when the layer was made)
or of its collection (``__dask_annotations__``) taking precedence, one
annotation at a time. A callable annotation is called with the task's
original key, the one the user knows. A layer annotated only as the run
itself is (``own``: on a worker, its task's span) adds nothing.

Compute once. ``known`` maps original keys computed by earlier yields of the
same coroutine to the keys now holding their results; such tasks are referred
to, never submitted again. ``Delayed`` graphs share their layers between every
object built on them, so a layer that is still alive means the coroutine may
still use its keys: ``layers`` lists them for the caller's liveness tracking.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dask.base import tokenize
from dask.delayed import Delayed
from dask.typing import Key
from dask.utils import key_split

from .._internals.dask_private import (
    Alias,
    DataNode,
    GraphNode,
    Task,
    TaskRef,
    convert_legacy_task,
    finalized,
    finalized_together,
    holds_any,
)
from .keys import child_key, derive_key, named_by_user

__all__ = ["Compute", "Plan", "collection_graph", "derive_key", "func_token", "plan_yield"]


@dataclass(slots=True)
class Compute:
    """The collections of one yield, computed together as ``dask.compute``
    computes them: one expression, optimized as a whole, sent as it is
    (``Client.compute``), with dask's own keys.

    expr
        The finalized, optimized expression (not materialized).
    keys
        Its output keys, one per collection, in order.
    graph
        One task per leaf that hands the collection's result on under a key
        derived from the parent's (``outputs``): dask names an array's or a
        bag's finalized result anew each time (``finalize-hlg...-<uuid>``),
        and a re-run parent must find its result by key.
    outputs
        The keys of ``graph``, one per collection, in order.
    collections
        The collections (for the submission's span metadata).
    """

    expr: Any = field(repr=False)
    keys: list[Key]
    graph: dict[Key, GraphNode]
    outputs: list[Key]
    collections: list[Any]


@dataclass(slots=True)
class Plan:
    """What one yield submits.

    graph
        New tasks, already renamed, in dependency-safe order.
    outputs
        Per leaf, the key holding its value.
    keep
        Renamed keys whose results may be reused by later yields (Delayed nodes):
        the caller holds them until their layer dies.
    layers
        ``(layer, {original_key: renamed_key})`` for the kept keys.
    annotations
        Renamed key -> the annotations of its task, for the tasks that have
        any (see the module's docstring).
    compute
        The yield's collections computed together, if any (``Compute``):
        their outputs are among ``outputs``, their tasks are not in
        ``graph``. The yield's annotations are for the submitter to put in
        effect around it, as ``Client.compute`` under ``dask.annotate``.
    """

    graph: dict[Key, GraphNode] = field(default_factory=dict)
    outputs: list[Key] = field(default_factory=list)
    keep: list[Key] = field(default_factory=list)
    layers: list[tuple[Any, dict[Key, Key]]] = field(default_factory=list)
    annotations: dict[Key, dict[str, Any]] = field(default_factory=dict)
    compute: Compute | None = None


def _identity(x: Any) -> Any:
    return x


def plan_yield(
    leaves: Sequence[Any],
    paths: Sequence[tuple[Any, ...]],
    known: Mapping[Key, Key],
    parent: Key,
    index: int,
    values: Mapping[Key, Any] | None = None,
    annotations: Mapping[str, Any] | None = None,
    own: Mapping[str, Any] | None = None,
) -> Plan:
    """Plan the submission of ``leaves`` (yielded at ``paths``) for yield number
    ``index`` of the coroutine running as ``parent``. ``values`` holds results
    computed in place by earlier yields (``core.localize``): they go into the
    graph as data, never computed again. ``annotations`` are those in effect
    at the yield beyond the run's own, ``own`` the run's own (see the
    module's docstring)."""
    plan = Plan()
    values = values or {}
    rename: dict[Key, Key] = dict(known)
    seen: set[str] = set()
    # Collections that need no key renamed: computed together, as dask.compute.
    together: dict[int, Any] = {}
    ours = known.keys() | values.keys() if values else known.keys()
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, (Delayed, TaskRef)) and not holds_any(leaf, ours):
            together[i] = leaf
    if together:
        expr, keys = finalized_together(list(together.values()))
        compute = plan.compute = Compute(expr, keys, {}, [], list(together.values()))
        by_leaf = dict(zip(together, keys, strict=True))
    for i, (leaf, path) in enumerate(zip(leaves, paths)):
        # Keys are derived from repr(path); dict keys that print alike (two
        # objects with one repr, two NaNs) would give two leaves one key.
        while repr(path) in seen:
            path = (*path, ("#", i))
        seen.add(repr(path))
        if i in together:
            # Handed on under a key of ours, named by the collection's token
            # (dask's: the same collection built again has the same one).
            name = by_leaf[i]
            own_name = getattr(leaf, "_name", None)  # an array's, a frame's; the prefix
            prefix = key_split(own_name if isinstance(own_name, str) else name)
            k = child_key(derive_key(prefix, parent, index, path), tokenize(leaf))
            compute.graph[k] = Task(k, _identity, TaskRef(name))
            compute.outputs.append(k)
            plan.outputs.append(k)
            continue
        nodes: Mapping[Key, tuple[Any, Any]] = {}
        graph = None
        if isinstance(leaf, Delayed):
            graph = leaf.__dask_graph__()
            nodes = _index_layers(graph)
        if isinstance(leaf, TaskRef) or (nodes and _on_cluster(leaf.key, nodes)):
            # A Future, or a Delayed that stands for one (a persisted Delayed,
            # a Promise): already on the cluster. Its value comes back through
            # a task of ours that depends on it: the scheduler then tells our
            # client when it is ready (a Future made by another client, or by
            # key, is not followed by ours), and a key the scheduler does not
            # know fails that task instead of hanging.
            k = child_key(derive_key(key_split(leaf.key), parent, index, path), repr(leaf.key))
            # (The task only hands the value on: no annotation is for it.)
            rename.setdefault(leaf.key, leaf.key)
            plan.graph[k] = Task(k, _identity, TaskRef(leaf.key))
            plan.outputs.append(k)
            continue
        out: Key
        by_key: Mapping[Key, Mapping[str, Any]] | None = None
        if isinstance(leaf, Delayed):
            # Results are reused across yields while their layer lives; a
            # plain dict graph has no layers to follow.
            out, layer_of = leaf.key, hasattr(graph, "layers")
        else:
            out, nodes, by_key = _collection_graph(leaf, {**values, **rename} if values else rename)
            layer_of = False
        annotate = _annotator(annotations, own, nodes, by_key)
        added = _rename_below(
            out, nodes, rename, plan.graph, parent, index, path, values,
            keep_names=isinstance(leaf, Delayed),
            annotate=annotate,
            annotated=plan.annotations,
        )
        plan.outputs.append(rename[out])
        if layer_of:
            plan.keep.extend(rename[k] for k in added)
            by_layer: dict[int, tuple[Any, dict[Key, Key]]] = {}
            for old in added:
                layer = nodes[old][1]
                by_layer.setdefault(id(layer), (layer, {}))[1][old] = rename[old]
            plan.layers.extend(by_layer.values())
    return plan


def _on_cluster(key: Key, nodes: Mapping[Key, tuple[Any, Any]]) -> bool:
    """Whether the graph holds ``key`` as a reference to itself: a Future in a
    persisted collection's graph (``{key: Future(key)}``)."""
    entry = nodes.get(key)
    return entry is not None and isinstance(entry[0], TaskRef) and entry[0].key == key


def _index_layers(hlg: Any) -> dict[Key, tuple[Any, Any]]:
    """key -> (task, layer object) for every task of a HighLevelGraph."""
    out: dict[Key, tuple[Any, Any]] = {}
    if not hasattr(hlg, "layers"):  # a plain dict graph (a persisted Delayed)
        return {k: (v, None) for k, v in hlg.items()}
    for layer in hlg.layers.values():
        for k, v in layer.items():
            out[k] = (v, layer)
    return out


def collection_graph(
    coll: Any, known: Mapping[Key, Key] | None = None
) -> tuple[Key, dict[Key, tuple[Any, Any]]]:
    """The optimized, finalized graph of any dask collection, as
    ``Client.compute`` builds it (``distributed.Client.compute``).

    Graph optimization fuses tasks into new keys; a collection built on a
    result an earlier yield computed (``da.from_delayed(L, ...)``) would then
    compute it again. Such a collection is not optimized, so ``known`` keys
    stay in its graph and are referred to."""
    out, nodes, _ = _collection_graph(coll, known)
    return out, nodes


def _collection_graph(
    coll: Any, known: Mapping[Key, Key] | None = None
) -> tuple[Key, dict[Key, tuple[Any, Any]], dict[Key, dict[str, Any]]]:
    """``collection_graph``, and the annotations dask gives its tasks, by key."""
    optimize = not known or known.keys().isdisjoint(coll.__dask_graph__().keys())
    out, dsk, by_type = finalized(coll, optimize=optimize)
    by_key: dict[Key, dict[str, Any]] = {}
    for name, values in by_type.items():
        for k, v in values.items():
            by_key.setdefault(k, {})[name] = v
    return out, {k: (v, None) for k, v in dsk.items()}, by_key


def _annotator(
    annotations: Mapping[str, Any] | None,
    own: Mapping[str, Any] | None,
    nodes: Mapping[Key, tuple[Any, Any]],
    by_key: Mapping[Key, Mapping[str, Any]] | None,
) -> Callable[[Key], dict[str, Any] | None] | None:
    """``annotate(key)``: the annotations of the task of original key ``key``
    (None for none), or None when no task of the leaf has any."""

    def layer_of(k: Key) -> Mapping[str, Any] | None:
        if by_key is not None:
            ann = by_key.get(k)
        else:
            ann = getattr(nodes[k][1], "annotations", None)
        # Made under the run's own annotations only (its span): nothing to add.
        return None if not ann or ann == own else ann

    if not annotations and not any(layer_of(k) for k in nodes):
        return None

    def annotate(k: Key) -> dict[str, Any] | None:
        # As Scheduler._apply_annotations: the global ones, then the layer's
        # wherever it says something (not None).
        out = {a: v(k) if callable(v) else v for a, v in (annotations or {}).items()}
        for a, v in (layer_of(k) or {}).items():
            if callable(v):
                v = v(k)
            if v is not None:
                out[a] = v
        return out or None

    return annotate


def _rename_below(
    out: Key,
    nodes: Mapping[Key, tuple[Any, Any]],
    rename: dict[Key, Key],
    graph: dict[Key, GraphNode],
    parent: Key,
    index: int,
    path: tuple[Any, ...],
    values: Mapping[Key, Any],
    keep_names: bool = False,
    annotate: Callable[[Key], dict[str, Any] | None] | None = None,
    annotated: dict[Key, dict[str, Any]] | None = None,
) -> list[Key]:
    """Rename ``out`` and every task below it that is not renamed yet; add the
    renamed tasks to ``graph``, dependencies first. Returns the original keys
    added, ``out`` first. With ``keep_names``, keys the user chose keep their
    name. With ``annotate``, each added task's annotations go in ``annotated``.

    A task's slot is its depth-first position under ``out`` or, below a key
    the user named, under that key; its content token covers its
    dependencies' new keys, so tasks are named bottom-up (a post-order walk)
    once every position is known."""
    order: dict[Key, int] = {}  # original key -> depth-first position
    place: dict[Key, tuple[Any, int]] = {}  # original key -> (named key above it or None, position)
    counts: dict[Any, int] = {}
    named: set[Key] = set()
    tasks: dict[Key, GraphNode] = {}
    post: list[Key] = []  # dependencies before dependents
    stack: list[tuple[Key, bool, Any]] = [(out, False, None)]
    while stack:
        k, expanded, above = stack.pop()
        if expanded:
            post.append(k)
            continue
        if k in rename or k in order:
            continue
        entry = nodes.get(k)
        if entry is None or _on_cluster(k, nodes):
            # Not in this graph, or standing for a Future of the same key: it
            # exists on the cluster already; keep its name.
            rename[k] = k
            continue
        task = entry[0]
        if k in values:  # computed in place already: its value, as data
            task = DataNode(k, values[k])
        elif not isinstance(task, GraphNode):  # a legacy tuple task
            task = convert_legacy_task(k, task, nodes.keys())
        order[k] = len(order)
        n = counts.get(above, 0)
        counts[above] = n + 1
        place[k] = (above, n)
        if keep_names and named_by_user(k):
            named.add(k)
            above = k
        tasks[k] = task
        stack.append((k, True, None))
        stack.extend((d, False, above) for d in reversed(_ordered_deps(task)))
    for k in post:
        task = tasks[k]
        if k in named:
            rename[k] = k
        else:
            above, n = place[k]
            prefix = key_split(k)
            if above is not None:
                slot = derive_key(prefix, above, n)
            elif n == 0:
                slot = derive_key(prefix, parent, index, path)
            else:
                slot = derive_key(prefix, parent, index, path, n)
            rename[k] = child_key(slot, _content(task, rename))
        # A node's own ``.key`` may differ from the key the graph holds it
        # under (dask-expr's from_delayed stores Alias nodes keyed by their
        # target): the graph's key is the one dependents refer to.
        graph[rename[k]] = _renamed(k, task, rename)
        if annotate is not None and annotated is not None:
            ann = annotate(k)
            if ann:
                annotated[rename[k]] = ann
    return sorted(order, key=order.__getitem__)


# -- content tokens -----------------------------------------------------------

_FUNCTIONS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def func_token(func: Any) -> str:
    """``tokenize(func)``, kept per plain function: dask pickles a function
    each time it tokenizes it (tens of microseconds)."""
    if type(func) is not types.FunctionType:
        return tokenize(func)
    try:
        return _FUNCTIONS[func]
    except KeyError:
        token = _FUNCTIONS[func] = tokenize(func)
        return token


def _content(task: GraphNode, rename: Mapping[Key, Key]) -> str:
    """A token of what ``task`` computes, without its own key: its function,
    its arguments and the new keys of its dependencies."""
    return tokenize(_canonical(task, rename))


def _canonical(obj: Any, names: Mapping[Any, Any]) -> Any:
    """``obj`` with every key in it replaced by what names it the same way in
    every process: a graph key by its new key, a key local to a fused
    subgraph (``_execute_subgraph``'s inner graph, whose keys are the
    collection's own, often random) by its position there."""
    if isinstance(obj, TaskRef):
        return ("ref", _named(obj.key, names))
    if isinstance(obj, Alias):
        return ("alias", _named(obj.target, names))
    if isinstance(obj, DataNode):
        return ("data", _canonical(obj.value, names))
    if isinstance(obj, Task):
        local = {k: ("local", i) for a in obj.args if _is_subgraph(a) for i, k in enumerate(a)}
        if local:
            names = {**names, **local}
        return (
            type(obj).__name__,
            func_token(obj.func),
            [_canonical(a, names) for a in obj.args],
            {k: _canonical(v, names) for k, v in obj.kwargs.items()},
        )
    if type(obj) is dict:
        return ("dict", [(_canonical(k, names), _canonical(v, names)) for k, v in obj.items()])
    if type(obj) is str or type(obj) is tuple:
        named = _named(obj, names, _NOT_A_KEY)
        if named is not _NOT_A_KEY:
            return ("key", named)
    if type(obj) is list or type(obj) is tuple:
        return (type(obj).__name__, [_canonical(a, names) for a in obj])
    return obj


_NOT_A_KEY = object()


def _named(key: Any, names: Mapping[Any, Any], default: Any = None) -> Any:
    """What ``names`` calls ``key``; else ``default``, or ``key`` itself
    when no default is given."""
    try:
        return names.get(key, key if default is None else default)
    except TypeError:  # an unhashable tuple: no key
        return key if default is None else default


def _is_subgraph(obj: Any) -> bool:
    return type(obj) is dict and bool(obj) and all(isinstance(v, GraphNode) for v in obj.values())


def _renamed(k: Key, task: GraphNode, rename: Mapping[Key, Key]) -> GraphNode:
    new_key = rename[k]
    subs: dict[Key, Key | GraphNode] = {
        d: rename[d] for d in task.dependencies if rename.get(d, d) != d
    }
    node = task.substitute(subs, key=new_key)
    rekey: Any = getattr(task, "func", None)
    if isinstance(node, Task) and hasattr(rekey, "with_key"):
        # A coroutine call carries its own key (an async task cannot learn it
        # from distributed); keep it in step with the rename.
        node = Task(new_key, rekey.with_key(new_key), *node.args, **node.kwargs)
    return node


def _ordered_deps(task: GraphNode) -> list[Key]:
    """The task's dependencies in argument order (a frozenset has none, and
    string hashing differs between processes), the rest sorted by name."""
    deps = task.dependencies
    if len(deps) <= 1:
        return list(deps)
    found: dict[Key, None] = {}
    _walk_refs(task, found, deps)
    rest = sorted((d for d in deps if d not in found), key=str)
    return [*found, *rest]


def _walk_refs(obj: Any, found: dict[Key, None], deps: Iterable[Key]) -> None:
    if isinstance(obj, TaskRef):
        if obj.key in deps:
            found.setdefault(obj.key, None)
    elif isinstance(obj, Task):
        for a in obj.args:
            _walk_refs(a, found, deps)
        for a in obj.kwargs.values():
            _walk_refs(a, found, deps)
    elif isinstance(obj, Alias):
        found.setdefault(obj.target, None) if obj.target in deps else None
    elif isinstance(obj, (list, tuple)) and not isinstance(obj, DataNode):
        for a in obj:
            _walk_refs(a, found, deps)
