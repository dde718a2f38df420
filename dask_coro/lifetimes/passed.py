"""Shared arrays a coroutine's body passes on to its children as values.

A shared array that goes from task to task as a *key* reaches any host: the
worker that needs it fetches it (``get_data``), and a worker of another host
is sent its bytes once (``lifetimes.worker``, ``shm._as_copy``), which become
that host's copy, tied to the key. A body, though, holds the array itself
(``arr = yield produce()``) and passes it on as a *value*
(``yield total(arr)``): the value goes into the child's task, pickled as a
handle (the segment's name), through the scheduler to whichever worker runs
it, and a worker of another host finds no such segment there.

So before a body's yield is submitted, each shared array in the graph's
values is taken out and put in the parent's worker memory under a key of its
own (``scatter`` to that worker: it maps the same segment, no copy); the task
refers to that key instead, and the array travels as a key does. The key is
released as soon as it is submitted: the scheduler keeps it while the tasks
that need it wait for it, then forgets it, and a host copy tied to it goes
with it.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from dask.typing import Key

from .._internals.dask_private import Alias, DataNode, Task, parse_input

#: The keys of arrays passed on: ``dask-coro-shared-<hex>``.
KEY_PREFIX = "dask-coro-shared-"


def any_shared() -> bool:
    """Whether this process maps a segment the cluster manages (cheap: a
    body's yield asks it every time)."""
    shm = sys.modules.get("dask_coro.lifetimes.shm")
    return shm is not None and bool(shm.any_attached())


async def pass_on(client: Any, address: str, graph: dict[Key, Any]) -> list[Any]:
    """Put the shared arrays ``graph`` holds as values in the memory of the
    worker at ``address`` (the body's own) under keys of their own, which
    the graph then refers to (``take_out``); answers their futures, to be
    let go of once the graph is submitted. Does nothing, and answers ``[]``,
    when this process maps no managed segment."""
    if not any_shared():
        return []
    shared = take_out(graph)
    if not shared:
        return []
    # Over the worker's connection to itself: the array pickles as a handle
    # and maps the same segment there; the scheduler learns the keys'
    # holder before the graph that needs them arrives (same client, after).
    futures = await client.scatter(shared, workers=[address], hash=False, asynchronous=True)
    return list(futures.values())


def take_out(graph: dict[Key, Any]) -> dict[Key, Any]:
    """Replace in ``graph``, in place, every managed shared array held as a
    value in a task (an argument, or in a list, tuple or dict of them) or as
    a data node by a reference to a new key; answers ``{new key: array}``.
    One array object passed twice gets one key."""
    from .shm import ShmArray

    out: dict[Key, Any] = {}
    by_id: dict[int, Key] = {}

    def key_of(a: Any) -> Key:
        k = by_id.get(id(a))
        if k is None:
            k = by_id[id(a)] = f"{KEY_PREFIX}{uuid.uuid4().hex}"
            out[k] = a
        return k

    def sub(obj: Any) -> Any:
        """``obj`` with its shared arrays replaced by aliases, or ``obj``
        itself if it holds none."""
        t = type(obj)
        if isinstance(obj, ShmArray):
            segment = obj._segment
            if segment is not None and segment.managed:
                return Alias(key_of(obj))
            return obj
        if t is list or t is tuple:
            items = [sub(o) for o in obj]
            if all(n is o for n, o in zip(items, obj)):
                return obj
            return parse_input(t(items))
        if t is dict:
            values = {k: sub(v) for k, v in obj.items()}
            if all(values[k] is v for k, v in obj.items()):
                return obj
            return parse_input(values)
        if t is Task:
            return _task(obj, sub)
        return obj

    for k, node in list(graph.items()):
        t = type(node)
        if t is Task:
            new = _task(node, sub)
        elif t is DataNode:
            value = sub(node.value)
            new = node if value is node.value else Task(k, _identity, value)
        else:
            continue
        if new is not node:
            graph[k] = new
    return out


def _task(node: Any, sub: Any) -> Any:
    args = [sub(a) for a in node.args]
    kwargs = {k: sub(v) for k, v in node.kwargs.items()}
    if all(n is o for n, o in zip(args, node.args)) and all(kwargs[k] is v for k, v in node.kwargs.items()):
        return node
    return Task(node.key, node.func, *args, _data_producer=node.data_producer, **kwargs)


def _identity(x: Any) -> Any:
    return x
