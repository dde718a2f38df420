"""The local runner: a coroutine call run without a distributed cluster.

Used when a coroutine task is called by dask's threaded, synchronous or
multiprocessing scheduler. The same engine as on a worker runs the body and
the calls it may run inline (no idle capacity to hand work to here); what it
hands out is computed at once with the synchronous scheduler in this thread
(children that are coroutines recurse into this runner), with the same plan,
keys, compute-once cache and exceptions as on a cluster. A ``Scope``'s
handles are the computed values themselves.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from dask.local import get_sync
from dask.utils import funcname

from .. import _config
from .._context import running_key
from .._internals.dask_private import DataNode, TaskRef
from ..core.engine import Await, Done, Frame, Returned, Submit
from ..core.plan import Plan, plan_yield
from ..core.scope import Scope
from .aio import stepping, wait_here
from .call import trampoline
from .inplace import localizer

if TYPE_CHECKING:
    from .call import CoroutineTask


def run_local(task: CoroutineTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    ctx = contextvars.copy_context()
    ctx.run(running_key.set, task.key)
    key = task.key

    def scope_of(frame: Frame) -> Scope[Any]:
        if frame.scope is None:
            frame.scope = Scope(frame.ident(key))
        return frame.scope

    tramp = trampoline(
        funcname(task.func),
        inline=bool(_config.get("coro.inline.enabled")),
        on_ended=_ended,
        localize=localizer(scope_of, _fetch),
    )
    out = stepping(ctx.run, tramp.start, task.func, args, kwargs, Scope(task.key))
    try:
        while type(out) is not Done:
            for frame, positions in out.batches:
                if frame.scope is None:
                    frame.scope = Scope(frame.ident(task.key))
                _compute_batch(frame, positions)
            if type(out) is Await:
                # An async body awaits asyncio: this thread's loop runs it.
                out = stepping(ctx.run, tramp.proceed, wait_here(out))
                continue
            assert type(out) is Submit
            if not out.wait:
                out = stepping(ctx.run, tramp.run)
                continue
            scope = out.frame.scope
            assert scope is not None
            if scope.error is not None:
                error, scope.error = scope.error, None
                out = stepping(ctx.run, tramp.throw, error)
            else:
                out = stepping(ctx.run, tramp.resume, scope.handles(out.frame.remote))
    finally:
        stepping(tramp.close)
    step = out.step
    if type(step) is Returned:
        return step.value
    raise step.error  # type: ignore[union-attr]


def _fetch(scope: Scope[Any], keys: list[Any]) -> dict[Any, Any] | None:
    """Results of earlier yields, for a value computed in place: here a
    scope's handles are the values themselves."""
    known, held = scope.cache.known, scope.held
    if not all(known[k] in held for k in keys):
        return None
    return {k: held[known[k]] for k in keys}


def _ended(frame: Frame) -> None:
    """A yield of ``frame`` ended (or its body did): drop what it needed."""
    scope = frame.scope
    assert scope is not None
    scope.end_yield()
    if frame.done:
        scope.end_body()


def _compute_batch(frame: Frame, positions: list[int]) -> None:
    """Compute the leaves of ``frame`` at ``positions`` now, with the
    synchronous scheduler; the first error is raised at the frame's yield."""
    scope = frame.scope
    assert scope is not None
    if scope.error is not None:
        return
    leaves = [frame.leaves[p] for p in positions]
    try:
        plan = plan_yield(
            leaves,
            [frame.path(p) for p in positions],
            scope.cache.known,
            scope.ident,
            frame.index,
            scope.cache.values,
        )
        found = _compute(plan, scope.held, leaves)
    except Exception as e:
        scope.error = e
        return
    scope.record(positions, plan.outputs, plan.keep, plan.layers, found)


def _compute(plan: Plan, values: dict[Any, Any], leaves: list[Any]) -> dict[Any, Any]:
    """The values of the plan's outputs and kept keys; ``values`` holds those
    of keys computed by earlier yields."""
    graph: dict[Any, Any] = dict(plan.graph)
    for k in values.keys() & _needed(plan):
        graph[k] = DataNode(k, values[k])
    for leaf in leaves:
        if isinstance(leaf, TaskRef) and leaf.key not in graph:
            graph[leaf.key] = DataNode(leaf.key, leaf.result())  # type: ignore[attr-defined]
    keys = list(dict.fromkeys(plan.outputs + plan.keep))
    return dict(zip(keys, get_sync(graph, keys)))


def _needed(plan: Plan) -> set[Any]:
    needed = set(plan.outputs)
    for t in plan.graph.values():
        needed.update(t.dependencies)
    return needed
