"""``dask_coro.result(x)``: wait for ``x`` from plain code, at any call depth."""

from __future__ import annotations

import sys
from typing import Any

from .._context import on_event_loop
from .._exceptions import DaskCoroError
from ..core.classify import classifier
from ..core.engine import current_trampoline
from ..core.structure import Structure
from .call import coroutine


def result(x: Any) -> Any:
    """Compute ``x`` and return its value, in the shape of ``x``.

    ``x`` is anything a coroutine may yield: Delayed objects, coroutine calls,
    Futures, dask collections, plain values, and lists, tuples and dicts of
    them (``BadYieldError`` names anything else, and where it is).

    Inside a ``@coroutine`` body, at any call depth (a plain helper of a
    helper), ``result(x)`` is a yield of that body: the children start in one
    batch, calls with plain arguments may run inline, and while it waits on
    the cluster the body's stack is parked in a greenlet: it holds no thread
    and no worker slot. A child's exception is raised here.

    Elsewhere it blocks, as ``compute`` does: in an ordinary task on a worker
    it secedes, as ``worker_client`` does (the thread stays held while it
    waits); in a client process it computes with dask's default scheduler (the
    default ``Client``, else in-process). On a running event loop it raises:
    waiting there would block the loop.
    """
    tramp = current_trampoline()
    if tramp is not None:
        return tramp.wait(x)
    outside = getattr(type(x), "__dask_coro_result__", None)
    if outside is not None:  # waits for itself from plain code (a group's next())
        return outside(x)
    # Refuse a bad x here, before any task: the error names result, as a
    # coroutine's names its yield.
    Structure(x, classifier("result", 0))
    if on_event_loop():
        raise DaskCoroError(
            "dask_coro.result() was called on a running event loop, where waiting "
            "would block the loop; in an async def coroutine, await "
            "dask_coro.gather(x) instead, or call result() from a thread"
        )
    call = _wait_for(_Opaque(x))
    if sys.modules.get("distributed") is not None:
        from .._internals.distributed.worker import thread_task_key

        if thread_task_key() is not None:  # an ordinary task on a worker's thread pool
            from distributed import worker_client

            with worker_client() as client:  # secedes; rejoins when done
                return client.compute(call).result()
    return call.compute()


class _Opaque:
    """Carries ``x`` into ``_wait_for`` untouched: dask does not look inside
    it, so ``x`` is yielded there, not computed as an argument."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return _Opaque, (self.value,)


@coroutine(name="result")
def _wait_for(box: _Opaque) -> Any:
    """``result(x)`` outside a coroutine: one task whose body yields ``x``."""
    return (yield box.value)
