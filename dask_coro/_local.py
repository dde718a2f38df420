"""The in-process driver: a coroutine call run without a distributed cluster.

Used when a coroutine task is called by dask's threaded, synchronous or
multiprocessing scheduler. Each yield's graph is computed with the synchronous
scheduler in this thread (children that are coroutines recurse into this
driver), with the same plan, keys, compute-once cache and exceptions as on a
cluster.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from dask._task_spec import DataNode, TaskRef
from dask.local import get_sync
from dask.utils import funcname

from ._cache import ResultCache
from ._classify import classifier
from ._context import running_key
from ._driver import Driver, Returned, Yielded
from ._plan import Plan, plan_yield
from ._structure import Structure

if TYPE_CHECKING:
    from ._api import CoroutineTask


def run_local(task: CoroutineTask, args: tuple, kwargs: dict) -> Any:
    name = funcname(task.func)
    ctx = contextvars.copy_context()
    ctx.run(running_key.set, task.key)
    driver = Driver(name)
    cache = ResultCache()
    values: dict[Any, Any] = {}  # renamed key -> value, for keys in cache
    step = ctx.run(driver.start, task.func, args, kwargs)
    index = 0
    try:
        while type(step) is Yielded:
            try:
                structure = Structure(step.value, classifier(name, index))
                del step
                plan = plan_yield(
                    structure.leaves, structure.paths, cache.known, task.key, index
                )
                results = _compute(plan, values, structure.leaves)
                cache.add(plan.layers)
                del plan
            except Exception as e:
                step = ctx.run(driver.throw, e)
            else:
                value = structure.rebuild(results)
                del structure, results
                step = ctx.run(driver.send, value)
                del value
            index += 1
            for k in cache.sweep():
                values.pop(k, None)
    finally:
        driver.close()
        cache.clear()
    if type(step) is Returned:
        return step.value
    raise step.error


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
