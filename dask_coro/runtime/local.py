"""The local runner: a coroutine call run without a distributed cluster.

Used when a coroutine task is called by dask's threaded, synchronous or
multiprocessing scheduler. The same engine as on a worker runs the body and
the calls it may run inline (no idle capacity to hand work to here); what it
hands out is computed at once in this thread, with the same plan, keys,
compute-once cache and exceptions as on a cluster. A ``Scope``'s handles are
the computed values themselves.

Children that are coroutine tasks do not recurse: ``run_local`` drives a
stack of runs (``_run``, one generator per coroutine task), and a run that
needs a child's value yields it (``_Child``) to that loop, which runs the
child on top of the stack and sends its value (or throws its error) back.
So a recursion of task children is as deep as memory allows, not as the
interpreter's stack (a ``get_sync`` per level ran out at depth ~70), as on a
cluster, where each child is a task of its own.
"""

from __future__ import annotations

import contextvars
from collections.abc import Generator
from typing import Any

from dask.utils import funcname

from .. import _config
from .._context import gather_in_task, running_key
from .._internals.dask_private import DataNode, Task, TaskRef, expression_graph
from ..core.engine import Await, Done, Failed, Frame, Raised, Returned, Submit
from ..core.localize import arguments
from ..core.plan import Plan, plan_yield
from ..core.scope import Scope
from .aio import gather_locally, stepping, wait_here
from .call import CoroutineTask, trampoline
from .errors import task_error
from .inplace import localizer


class _Failed(Exception):
    """Carries an error out of a task run here, or a child's back into its
    parent, through generators: raised bare, a ``StopIteration`` would become
    a ``RuntimeError`` on leaving one (PEP 479); unwrapped at the yield."""

    def __init__(self, error: BaseException):
        self.error = error
        self.key: Any = None  # the task that raised it (set by ``_execute``)
        self.done: dict[Any, Any] = {}  # what the batch computed before it


class _Child:
    """What a run yields to ``run_local``: run coroutine task ``task`` with
    these arguments, send back its value (or throw its error)."""

    __slots__ = ("task", "args", "kwargs")

    def __init__(self, task: CoroutineTask, args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.task = task
        self.args = args
        self.kwargs = kwargs


#: A coroutine task's run: it yields the children it needs, and returns how
#: its body ended (``Returned`` or ``Raised``).
Run = Generator[_Child, Any, "Returned | Raised"]


def run_local(task: CoroutineTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run coroutine task ``task`` to the end here: its value, or its error
    raised. Its coroutine children, at any depth, run in this loop."""
    stack: list[Run] = [_run(task, args, kwargs)]
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            top = stack[-1]
            try:
                if error is None:
                    child = top.send(value)
                else:
                    # Taken before the throw: the run may end there (caught,
                    # it returns), and the error must not reach its parent.
                    thrown, error = error, None
                    # As a task's error reaches its parent on a cluster.
                    child = top.throw(_Failed(task_error(thrown)))
                    del thrown
            except StopIteration as stop:
                stack.pop()
                step = stop.value
                if type(step) is Returned:
                    if not stack:
                        return step.value
                    value = step.value
                    del step
                    continue
                error = step.error
            except BaseException as e:  # of this runner's own
                stack.pop()
                error = e
            else:
                # Hold no value or argument here longer than its run does
                # (the caller's result cache decides how long a value lives).
                value = None
                stack.append(_run(child.task, child.args, child.kwargs))
                del child
                continue
            # A run ended in an error: its parent's, raised at its yield.
            if not stack:
                assert error is not None
                raise error
            value = None
    finally:
        # Only when this loop itself is interrupted: close the runs still open,
        # innermost first (their bodies' finally blocks run).
        while stack:
            stack.pop().close()


def _run(task: CoroutineTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Run:
    """One coroutine task's run: what ``run_local`` did for one level."""
    ctx = contextvars.copy_context()
    ctx.run(running_key.set, task.key)
    ctx.run(gather_in_task.set, gather_locally)
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
                yield from _compute_batch(frame, positions)
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
                handles = scope.handles(out.frame.remote)
                failed = next((h for h in handles if type(h) is Failed), None)
                if failed is not None:
                    # A key an earlier yield computed to an error: the same
                    # error again (a computed key keeps its outcome).
                    out = stepping(ctx.run, tramp.throw, failed.error)
                else:
                    out = stepping(ctx.run, tramp.resume, handles)
                del handles
    finally:
        stepping(tramp.close)
    # Returned or Raised, never raised here: a StopIteration raised in a
    # generator becomes a RuntimeError (PEP 479).
    return out.step


def _fetch(scope: Scope[Any], keys: list[Any]) -> dict[Any, Any] | None:
    """Results of earlier yields, for a value computed in place: here a
    scope's handles are the values themselves."""
    known, held = scope.cache.known, scope.held
    if not all(known[k] in held and type(held[known[k]]) is not Failed for k in keys):
        return None  # not all here, or one erred: planned, it raises again
    return {k: held[known[k]] for k in keys}


def _ended(frame: Frame) -> None:
    """A yield of ``frame`` ended (or its body did): drop what it needed."""
    scope = frame.scope
    assert scope is not None
    scope.end_yield()
    if frame.done:
        scope.end_body()


def _compute_batch(frame: Frame, positions: list[int]) -> Generator[_Child, Any, None]:
    """Compute the leaves of ``frame`` at ``positions`` now; the first error
    is raised at the frame's yield."""
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
        found = yield from _compute(plan, scope.held, leaves)
    except _Failed as f:
        # A task's or child's error, a BaseException too: raised at the
        # yield, as an inline call's is (the engine catches BaseException
        # from a body).
        scope.error = f.error
        _record_failed(scope, plan, f)
        return
    except Exception as e:  # planning it failed (a bad graph, a lost Future)
        scope.error = e
        return
    scope.record(positions, plan.outputs, plan.keep, plan.layers, found)


def _compute(plan: Plan, values: dict[Any, Any], leaves: list[Any]) -> Generator[_Child, Any, dict[Any, Any]]:
    """The values of the plan's outputs and kept keys; ``values`` holds those
    of keys computed by earlier yields."""
    graph: dict[Any, Any] = dict(plan.graph)
    if plan.compute is not None:  # the yield's collections, as dask.compute
        graph.update(expression_graph(plan.compute.expr))
        graph.update(plan.compute.graph)
    for k in values.keys() & _needed(plan):
        v = values[k]
        graph[k] = Task(k, _reraise, DataNode(None, v.error)) if type(v) is Failed else DataNode(k, v)
    for leaf in leaves:
        if isinstance(leaf, TaskRef) and leaf.key not in graph:
            graph[leaf.key] = DataNode(leaf.key, leaf.result())  # type: ignore[attr-defined]
    keys = list(dict.fromkeys(plan.outputs + plan.keep))
    return (yield from _execute(graph, keys))


def _execute(graph: dict[Any, Any], keys: list[Any]) -> Generator[_Child, Any, dict[Any, Any]]:
    """Run the tasks ``keys`` need, one at a time in this thread, as dask's
    synchronous scheduler would (``dask.local.get_sync``: dependencies first,
    the first error raised), but for a coroutine task: its value is asked of
    ``run_local`` (``_Child``) instead of calling it here. Dependencies run
    in the order the keys and their arguments name them (depth first, no
    recursion); a value no task still needs is let go of."""
    order: list[Any] = []
    seen: set[Any] = set()
    for key in keys:
        stack: list[tuple[Any, bool]] = [(key, False)]
        while stack:
            k, expanded = stack.pop()
            if expanded:
                order.append(k)
                continue
            if k in seen:
                continue
            seen.add(k)
            stack.append((k, True))
            stack.extend((d, False) for d in reversed(list(graph[k].dependencies)))
    waiting: dict[Any, int] = dict.fromkeys(keys, 1)  # the caller needs these
    for k in order:
        for d in graph[k].dependencies:
            waiting[d] = waiting.get(d, 0) + 1
    have: dict[Any, Any] = {}
    for k in order:
        node = graph[k]
        deps = node.dependencies
        try:
            if type(node) is Task and type(node.func) is CoroutineTask:
                args, kwargs = arguments(node, have)
                child: Any = _Child(node.func, args, kwargs)
            else:
                child, value = None, node({d: have[d] for d in deps})
        except BaseException as e:  # a task may raise anything
            # What the task's Future would raise on a cluster.
            failed: _Failed | None = _Failed(task_error(e))
        else:
            failed = None
            if child is not None:
                try:
                    value = yield child  # its error comes back as _Failed
                except _Failed as f:
                    failed = f
        if failed is not None:
            failed.key = k
            failed.done = {key: have[key] for key in keys if key in have}
            raise failed from None
        have[k] = value
        for d in deps:
            waiting[d] -= 1
            if not waiting[d]:
                del have[d]
    return {k: have[k] for k in keys}


def _record_failed(scope: Scope[Any], plan: Plan, failed: _Failed) -> None:
    """A batch failed at task ``failed.key``: keep the outcome of its kept
    keys as a cluster's client would hold their futures, so a later yield of
    the same lazy value gets the same answer (dask's rule: a computed key
    keeps its outcome): the values computed before the error, and the error
    for the failed task and every task above it. Tasks that never ran are
    not kept (computed if yielded again)."""
    erred = {failed.key}
    for k, node in plan.graph.items():  # dependencies first
        if not erred.isdisjoint(node.dependencies):
            erred.add(k)
    outcome: dict[Any, Any] = dict(failed.done)
    for k in erred:
        outcome[k] = Failed(failed.error)
    keep = [k for k in plan.keep if k in outcome]
    if not keep:
        return
    kept = set(keep)
    scope.cache.add(
        [(layer, {o: n for o, n in names.items() if n in kept}) for layer, names in plan.layers]
    )
    for k in keep:
        scope.held[k] = outcome[k]


def _reraise(error: BaseException) -> Any:
    raise error


def _needed(plan: Plan) -> set[Any]:
    needed = set(plan.outputs)
    for t in plan.graph.values():
        needed.update(t.dependencies)
    return needed
