"""asyncio awaits in an ``async def`` body: what both runners share.

An ``async def`` body may await any asyncio awaitable. Its steps run with an
event loop as the thread's running loop (on a worker, the lane's own loop,
``lanes.py``; without a cluster, one loop per thread, ``stepping``), so
``asyncio.sleep``, ``asyncio.open_connection`` and the like find it; when the
body hands an asyncio future up to the engine (``core.engine.Await``), the
runner lets that loop run until the future is done, then steps the body on,
as asyncio's ``Task.__step`` would. ``check`` is the part of ``Task.__step``
that judges what a coroutine yielded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from .._context import body_loops, gather_in_task
from .._exceptions import BadYieldError
from ..core.engine import Await

_LOCAL = threading.local()


def check(out: Await, loop: asyncio.AbstractEventLoop) -> BaseException | None:
    """What asyncio's ``Task.__step`` says of ``out.obj``, the object an
    ``await`` handed up, on ``loop``: None to wait for it (an asyncio future
    of ``loop``, made ready to be awaited here) or to go on at once (a bare
    ``yield``, as ``asyncio.sleep(0)`` makes); else the error to raise at
    the await."""
    obj = out.obj
    if obj is None:
        return None
    blocking = getattr(obj, "_asyncio_future_blocking", None)
    if blocking is None:
        return BadYieldError(
            f"coroutine {out.frame.label!r} awaited {obj!r}, which is neither an asyncio "
            "future nor a dask_coro awaitable; an async coroutine may await "
            "dask_coro.gather(...), a coroutine call, and asyncio awaitables"
        )
    if obj.get_loop() is not loop:
        return RuntimeError(
            f"coroutine {out.frame.label!r} awaited {obj!r}, a future of another event "
            "loop (the worker's?): an async body runs on an event loop of its own "
            "thread; await dask_coro.gather(...) for cluster work, and asyncio code "
            "of its own"
        )
    if not blocking:
        return RuntimeError(f"yield was used instead of yield from with {obj!r}")
    obj._asyncio_future_blocking = False
    return None


def watch(out: Await) -> tuple[concurrent.futures.Future[BaseException | None], asyncio.Future[Any] | None]:
    """What asyncio's ``Task.__step`` does with what a coroutine yields, on
    the running loop (a lane's, on its thread): a future set once the body
    may go on (with None, or the error to raise at its await), and the
    asyncio future it waits for (None if it goes on at once: a bare
    ``yield``, as ``asyncio.sleep(0)`` makes, or an error), which the
    caller cancels if the body is closed meanwhile."""
    ready: concurrent.futures.Future[BaseException | None] = concurrent.futures.Future()
    error = check(out, asyncio.get_running_loop())
    if error is not None or out.obj is None:
        ready.set_result(error)
        return ready, None
    obj = out.obj

    def wake(_: Any) -> None:
        try:
            ready.set_result(None)
        except concurrent.futures.InvalidStateError:
            pass  # the runner stopped waiting (cancelled)

    obj.add_done_callback(wake)
    return ready, obj


def thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's loop for local runs, made on first use."""
    loop: asyncio.AbstractEventLoop | None = getattr(_LOCAL, "loop", None)
    if loop is None or loop.is_closed():
        loop = _LOCAL.loop = asyncio.new_event_loop()
        body_loops.add(loop)
    return loop


def stepping(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` (a step) with this thread's loop as the running loop
    (``asyncio._set_running_loop``, the hook asyncio gives loop
    implementations), unless one already runs here; the previous one is put
    back."""
    previous = asyncio._get_running_loop()
    loop = thread_loop()
    if previous is loop:
        return fn(*args)
    asyncio._set_running_loop(loop)
    try:
        return fn(*args)
    finally:
        asyncio._set_running_loop(previous)


def wait_here(out: Await) -> BaseException | None:
    """Run this thread's loop until what ``out``'s body awaited is done (a
    local run: the thread is the body's); the error to raise at the await,
    or None."""
    loop = thread_loop()
    error = check(out, loop)
    if error is not None:
        return error
    previous = asyncio._get_running_loop()
    asyncio._set_running_loop(None)
    try:
        if out.obj is None:
            loop.run_until_complete(asyncio.sleep(0))  # one turn, as a task gives up
        else:
            loop.run_until_complete(_settled(out.obj))
    finally:
        asyncio._set_running_loop(previous)
    return None


async def _settled(fut: asyncio.Future[Any]) -> None:
    await asyncio.wait([fut])



# -- cluster work awaited in an asyncio Task a body made -----------------------
#
# ``asyncio.wait_for(gather(x), t)``, ``asyncio.wait([...])`` and
# ``create_task`` run an await in an asyncio Task of the body's loop, which the
# engine does not drive: the Task refuses the ``Request`` and throws
# "Task got bad yield" in at the await (``core.engine.Request.__await__``),
# which asks ``in_task`` for an asyncio future instead. The runner of the body
# (found in the Task's context, copied from the body's step) computes the
# value as one child task of its own, ``gathered``, whose body yields it: the
# rules of a yield hold. Cancelling the Task (a timeout) releases that child:
# the scheduler cancels it, its body is closed, its children are released.


class Held:
    """A value handed to ``gathered`` as it is: dask does not look inside it
    for lazy values to compute first, so ``gathered`` yields them."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __reduce__(self) -> Any:
        return (Held, (self.value,))


def _gathered(held: Held) -> Any:
    return (yield held.value)


def gathered(value: Any) -> Any:
    """A coroutine call (a task named ``gather``) whose body yields ``value``."""
    from .call import coroutine

    global _GATHERED
    if _GATHERED is None:
        _GATHERED = coroutine(_gathered, name="gather", inline=False)
    return _GATHERED(Held(value))


_GATHERED: Any = None


def in_task(request: Any) -> asyncio.Future[Any]:
    """An asyncio future of the running loop with the value of
    ``request.value``, for an ``await gather(...)`` an asyncio Task drives
    (``core.engine.Request.in_task``)."""
    run = gather_in_task.get(None)
    if run is None:
        raise BadYieldError(
            f"{request!r} was awaited in an asyncio Task that no coroutine body "
            "made: await dask_coro.gather(...) in an async coroutine's body, or in "
            "a Task (asyncio.wait_for, asyncio.wait, create_task) that body made"
        )
    fut: asyncio.Future[Any] = run(request.value)
    return fut


def gather_locally(value: Any) -> asyncio.Future[Any]:
    """``in_task`` of a local run: ``value`` computed at once, as a local run
    computes what a body yields (a timeout cannot interrupt it), on a thread
    of its own (whose loop any async body under it may run: this one runs)."""
    import dask

    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    outcome: list[Any] = []

    def compute() -> None:
        try:
            outcome.append((True, dask.compute(gathered(value), scheduler="sync")[0]))
        except BaseException as e:  # raised at the await, whatever it is
            outcome.append((False, e))
        finally:
            made = getattr(_LOCAL, "loop", None)
            if made is not None:
                body_loops.discard(made)
                made.close()

    thread = threading.Thread(target=compute, name="dask-coro-gather")
    thread.start()
    thread.join()
    ok, got = outcome[0]
    if ok:
        fut.set_result(got)
    else:
        fut.set_exception(got)
    return fut
