"""Every use of dask's private or undocumented API, in one place.

Checked against dask 2025.9.0 to 2026.8.0 (the supported window,
docs/development.md); ``tests/internals/test_internals.py`` pins each assumption, so a
dask release that changes one fails a named test. Imports
dask only (no distributed): the pure core may use it.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

# The task specification (dask._task_spec): the graph nodes dask builds and
# distributed runs. Plans rename them, promises rewrite them.
from dask._task_spec import Alias as Alias
from dask._task_spec import DataNode as DataNode
from dask._task_spec import GraphNode as GraphNode
from dask._task_spec import NestedContainer as NestedContainer
from dask._task_spec import Task as Task
from dask._task_spec import TaskRef as TaskRef
from dask._task_spec import convert_legacy_task as convert_legacy_task
from dask._task_spec import parse_input as parse_input
from dask.base import _annotations
from dask.delayed import Delayed
from dask.delayed import _swap as swap  # noqa: F401

# ``swap``: what ``Delayed``'s swapped operators call (``dask.delayed.right``:
# ``0 + x`` is ``partial(_swap, operator.add)``); core.localize computes them in place.

#: The annotations ``dask.annotate`` has in effect here (``dask.base._annotations``,
#: a ContextVar holding a dict, or None/empty). Read on the hot path of making
#: a coroutine call: a ContextVar ``get`` is one C call, a helper would be two.
annotations_in_effect: ContextVar[dict[str, Any] | None] = _annotations


def delayed_slot(name: str) -> Any:
    """The slot descriptor ``Delayed.__dict__[name]`` (``_key``, ``_dask``,
    ``_layer``, ``_length``): a coroutine call fills Delayed's own slots when
    dask first asks for its key or graph."""
    return Delayed.__dict__[name]


def finalized_graph(coll: Any, *, optimize: bool) -> tuple[Any, dict[Any, Any]]:
    """The key and graph of ``coll``'s computed result, as ``Client.compute``
    builds them (``FinalizeCompute(collections_to_expr(...)).optimize()``)."""
    out, dsk, _ = finalized(coll, optimize=optimize)
    return out, dsk


def finalized(coll: Any, *, optimize: bool) -> tuple[Any, dict[Any, Any], dict[str, dict[Any, Any]]]:
    """``finalized_graph`` and the annotations the scheduler would give its
    tasks, ``{annotation: {key: value}}``: the expression's
    ``__dask_annotations__``, which ``distributed.scheduler._materialize_graph``
    reads for the graph ``Client.compute`` sends."""
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr
    from dask.core import flatten

    expr = FinalizeCompute(collections_to_expr([coll], optimize_graph=optimize)).optimize()
    (out,) = flatten(expr.__dask_keys__())
    return out, dict(expr.__dask_graph__()), dict(expr.__dask_annotations__())


def finalized_together(colls: list[Any]) -> tuple[Any, list[Any]]:
    """The expression ``Client.compute(colls)`` sends, and the key of each
    collection's result in it: ``FinalizeCompute(collections_to_expr(colls,
    optimize_graph=True)).optimize()``, its keys ``flatten(__dask_keys__())``,
    one per collection in order (``distributed.Client.compute``). Not
    materialized: the scheduler builds the tasks (``_materialize_graph``)."""
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr
    from dask.core import flatten

    expr = FinalizeCompute(collections_to_expr(list(colls), optimize_graph=True)).optimize()
    keys = list(flatten(expr.__dask_keys__()))
    if len(keys) == len(colls):
        return expr, keys
    # dask 2025.9.x (fixed by dask/dask#12081, in 2025.10.0):
    # _ExprSequence._simplify_down drops a collection backed by an expression
    # (a dataframe) that comes before the first one backed by a graph (an
    # array, a bag): dask.compute(df.a.sum(), arr.sum()) lost the first. The
    # graph-backed ones go first then, and the keys back in the given order.
    order = sorted(range(len(colls)), key=lambda i: not _graph_backed(colls[i]))
    expr = FinalizeCompute(
        collections_to_expr([colls[i] for i in order], optimize_graph=True)
    ).optimize()
    ordered = list(flatten(expr.__dask_keys__()))
    if len(ordered) != len(colls):
        raise RuntimeError(f"dask gave {len(ordered)} keys for {len(colls)} collections computed together")
    keys = [None] * len(colls)
    for pos, i in enumerate(order):
        keys[i] = ordered[pos]
    return expr, keys


def _graph_backed(coll: Any) -> bool:
    """Whether ``coll`` is backed by a graph (``HLGExpr``: an array, a bag, a
    ``Delayed``) rather than an expression of its own (a dataframe)."""
    from dask._expr import HLGExpr, HLGFinalizeCompute
    from dask.base import collections_to_expr

    return any(
        isinstance(op, (HLGExpr, HLGFinalizeCompute, dict))
        for op in collections_to_expr([coll], optimize_graph=True).operands
    )


def expression_graph(expr: Any) -> dict[Any, Any]:
    """The tasks of ``expr`` as the scheduler materializes them
    (``distributed.scheduler._materialize_graph``: ``__dask_graph__``, then
    ``convert_legacy_graph``)."""
    from dask._task_spec import convert_legacy_graph

    return convert_legacy_graph(dict(expr.__dask_graph__()))


def holds_any(coll: Any, keys: Any) -> bool:
    """Whether ``coll``'s graph holds a task of one of ``keys`` (a set-like
    of keys of ``Delayed`` objects), without building its tasks.

    A ``Delayed``'s tasks enter a collection as a graph of their own, which
    the collection's expression keeps as an operand: a ``HighLevelGraph``
    (an ``HLGExpr``'s ``dsk``: arrays, bags, ``da.from_delayed``), a
    ``Delayed`` (dask-expr's ``_DelayedExpr.obj``: ``dd.from_delayed``,
    ``map_partitions`` with a ``Delayed`` argument), a collection (whose
    graph is looked at the same way) or a plain dict (``FromGraph``'s
    layer). In a ``HighLevelGraph`` only materialized layers hold tasks of a
    ``Delayed`` (``Delayed`` layers are ``MaterializedLayer``s); a
    ``Blockwise`` layer only refers to them."""
    if not keys:
        return False
    from dask.base import collections_to_expr

    expr = collections_to_expr([coll], optimize_graph=False)
    return expression_holds_any(expr, keys)


def expression_holds_any(expr: Any, keys: Any) -> bool:
    """``holds_any`` of an expression: whether ``expr`` (what
    ``Client.compute`` and ``Client.persist`` send, ``_graph_to_futures``'s
    ``expr``) holds a task of one of ``keys``, looked for in its operands
    (``Expr.walk``) as ``holds_any`` does; False for anything that is no
    expression (a graph already serialized)."""
    from dask._expr import Expr

    if not keys or not isinstance(expr, Expr):
        return False
    return any(_operand_holds(op, keys) for e in expr.walk() for op in e.operands)


def _graph_holds(graph: Any, keys: Any) -> bool:
    from dask.highlevelgraph import HighLevelGraph

    if isinstance(graph, HighLevelGraph):
        return any(
            layer.is_materialized() and not keys.isdisjoint(layer.keys())
            for layer in graph.layers.values()
        )
    if isinstance(graph, dict):
        return not keys.isdisjoint(graph.keys())
    return False


def _operand_holds(op: Any, keys: Any) -> bool:
    from dask._expr import Expr
    from dask.base import is_dask_collection
    from dask.highlevelgraph import HighLevelGraph

    if isinstance(op, (HighLevelGraph, dict)):
        return _graph_holds(op, keys)
    if isinstance(op, (list, tuple)):
        return any(_operand_holds(o, keys) for o in op)
    if not isinstance(op, Expr) and is_dask_collection(op):
        if hasattr(op, "expr") and isinstance(op.expr, Expr):
            return holds_any(op, keys)
        return _graph_holds(op.__dask_graph__(), keys)
    return False
