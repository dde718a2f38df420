"""The in-process driver: a coroutine call run without a distributed cluster.

Used when a coroutine task is called by dask's threaded, synchronous or
multiprocessing scheduler. The same ``Trampoline`` as on a worker runs the body
and the calls it may run inline (no idle capacity to hand work to here); what
it hands out is computed at once with the synchronous scheduler in this thread
(children that are coroutines recurse into this driver), with the same plan,
keys, compute-once cache and exceptions as on a cluster.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from dask._task_spec import DataNode, TaskRef
from dask.local import get_sync
from dask.utils import funcname

from .. import _config
from .call import CoroutineCall, mark_done
from ..core.cache import ResultCache
from ..core.classify import classifier
from .._context import running_key
from ..core.driver import Returned
from ..core.trampoline import Done, Frame, Submit, Trampoline
from ..core.plan import Plan, plan_yield

if TYPE_CHECKING:
    from .call import CoroutineTask


class _Scope:
    """What one frame's yields computed: the compute-once cache, the values of
    the keys it keeps, and the results of its current yield by position."""

    __slots__ = ("ident", "cache", "values", "results", "error")

    def __init__(self, ident: Any):
        self.ident = ident
        self.cache = ResultCache()
        self.values: dict[Any, Any] = {}  # renamed key -> value, for keys in cache
        self.results: dict[int, Any] = {}
        self.error: Exception | None = None


def run_local(task: CoroutineTask, args: tuple, kwargs: dict) -> Any:
    name = funcname(task.func)
    ctx = contextvars.copy_context()
    ctx.run(running_key.set, task.key)
    inline = bool(_config.get("coro.inline.enabled"))
    tramp = Trampoline(
        name,
        call_type=CoroutineCall if inline else None,
        classify=classifier,
        mark_done=mark_done,
        on_ended=_ended,
    )
    out = ctx.run(tramp.start, task.func, args, kwargs, _Scope(task.key))
    try:
        while type(out) is not Done:
            assert type(out) is Submit
            for frame, positions in out.batches:
                if frame.ext is None:
                    frame.ext = _Scope(frame.ident(task.key))
                _compute_batch(frame, positions)
            if not out.wait:
                out = ctx.run(tramp.run)
                continue
            scope: _Scope = out.frame.ext
            if scope.error is not None:
                error, scope.error = scope.error, None
                out = ctx.run(tramp.throw, error)
            else:
                values = [scope.results.pop(p) for p in out.frame.remote]
                out = ctx.run(tramp.resume, values)
                del values
    finally:
        tramp.close()
    step = out.step
    if type(step) is Returned:
        return step.value
    raise step.error  # type: ignore[union-attr]


def _ended(frame: Frame) -> None:
    """A yield of ``frame`` ended (or its body did): drop what it needed."""
    scope: _Scope = frame.ext
    scope.results.clear()
    for k in scope.cache.sweep():
        scope.values.pop(k, None)
    if frame.done:
        scope.cache.clear()
        scope.values.clear()


def _compute_batch(frame: Frame, positions: list[int]) -> None:
    """Compute the leaves of ``frame`` at ``positions`` now, with the
    synchronous scheduler; the first error is raised at the frame's yield."""
    scope: _Scope = frame.ext
    if scope.error is not None:
        return
    leaves = [frame.leaves[p] for p in positions]
    try:
        plan = plan_yield(
            leaves, [frame.path(p) for p in positions], scope.cache.known, scope.ident, frame.index
        )
        results = _compute(plan, scope.values, leaves)
        scope.cache.add(plan.layers)
    except Exception as e:
        scope.error = e
        return
    scope.results.update(zip(positions, results))


def _compute(plan: Plan, values: dict[Any, Any], leaves: list[Any]) -> list[Any]:
    graph: dict[Any, Any] = dict(plan.graph)
    for k in values.keys() & _needed(plan):
        graph[k] = DataNode(k, values[k])
    for leaf in leaves:
        if isinstance(leaf, TaskRef) and leaf.key not in graph:
            graph[leaf.key] = DataNode(leaf.key, leaf.result())  # type: ignore[attr-defined]
    out = get_sync(graph, list(dict.fromkeys(plan.outputs + plan.keep)))
    found = dict(zip(dict.fromkeys(plan.outputs + plan.keep), out))
    for k in plan.keep:
        values[k] = found[k]
    return [found[k] for k in plan.outputs]


def _needed(plan: Plan) -> set[Any]:
    needed = set(plan.outputs)
    for t in plan.graph.values():
        needed.update(t.dependencies)
    return needed
