"""A body run beside a run, on its worker, without a task of its own.

A feature that starts small ``async def`` children of a run (a group's,
``groups/worker.py``), or calls of a plain function measured short
(``timings.py``), may run them here instead of submitting them: no
scheduler, no key, no round trip. A plain function's body is one step,
timed (``timed``), which nothing interrupts. Such a body gets what a run's body gets on
a worker, but the task:

- a trampoline of its own, stepped on a lane of its own (``Lanes.pick``),
  each step holding a thread of the pool as the run's steps do
  (``Lanes.run``, in the share of the run's tree), so the pool still bounds the
  user code running at once; its asyncio awaits run on the lane's loop
  while it holds no thread;
- the cluster work it waits for (``await f(x)``, ``await gather(...)``, a
  ``result()`` in plain code it calls) is computed as *side children* of
  the run (``_Run.side``: one task per wait, keyed under the run, released
  once its value is here), as for an asyncio Task the run's body made;
- a group it opens submits through the run; an item it emits is dropped
  (it is no stream's producer, as a coroutine computed plainly).

Cancelling the asyncio task that awaits ``run_beside`` closes the body at
its current await (``GeneratorExit``; its ``finally`` blocks run, on its
lane) and releases its side children (the scheduler cancels them, closing
their bodies). A body stepping cannot be interrupted until it awaits, as an
inline call cannot.

Without a key it is not held for a re-run: a parent run again runs it
again, as a call it ran inline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any

from .. import _config
from .._exceptions import BaseExceptionError
from .._internals.distributed.worker import worker_is_closing
from ..core.engine import Await, Done, Frame, Raised, Returned, Submit
from .aio import watch
from .call import trampoline
from .extensions import Run
from .timings import TIMINGS, short_call

if TYPE_CHECKING:
    from dask.typing import Key

logger = logging.getLogger("dask_coro")


class Beside:
    """The host a body run beside a run sees (``Trampoline.host``), an
    ``extensions.Run``: the run for what it submits and waits for, with a
    step urgency and notes of its own, the annotations its starter gave
    (a group's deadline) over the run's, and no stream's producer. ``run``
    is the run itself (``_Run``), also for a body run beside a body run
    beside it; ``host`` what it was started beside."""

    beside = True
    #: The options of its function do not reach a body run beside a run.
    options: Mapping[str, Any] = {}

    def __init__(self, host: Run, annotations: dict[str, Any] | None = None):
        self.host = host
        self.run: Any = host.run if isinstance(host, Beside) else host
        self.extra = annotations or {}
        #: Per extension (by name), what it keeps for this body.
        self.notes: dict[str, Any] = {}
        #: The next step need not wait for a thread (a deadline passed).
        self.urgent = False
        #: A step runs on the body's lane now (``run_beside``).
        self.step: asyncio.Future[Any] | None = None
        #: Cancelled, and the body's close began (after any step running then).
        self.closing = False
        self.tramp: Any = None  # the body's engine, once it starts (``run_beside``)

    @property
    def stepping(self) -> bool:
        return self.step is not None and not self.step.done()

    # -- extensions.Run: the run's, but for the annotations ------------------

    @property
    def worker(self) -> Any:
        return self.run.worker

    @property
    def key(self) -> Key:
        key: Key = self.run.key
        return key

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop = self.run.loop
        return loop

    @property
    def trampoline(self) -> Any:
        """The body's own engine."""
        return self.tramp

    @property
    def client(self) -> Any:
        return self.run.client

    def annotations(self) -> dict[str, Any]:
        """The run's task annotations, with those its starter gave (a
        group's deadline, which a group the body opens takes)."""
        return {**self.host.annotations(), **self.extra}

    def ident(self, kind: str) -> Any:
        return self.run.ident(kind)

    def scope_here(self, tramp: Any) -> Any:
        """None: what the body waits for is computed as side children of the
        run, each let go of once its value is here; no cache to share."""
        return None

    async def start_children(
        self, leaves: list[Any], paths: list[Any], ident: Any, annotations: dict[str, Any] | None = None,
        scope: Any = None,
    ) -> list[Any]:
        out: list[Any] = await self.run.start_children(leaves, paths, ident, annotations, scope)
        return out

    def release(self, futures: Any) -> None:
        self.run.release(futures)

    async def gather(self, futures: Any) -> Any:
        return await self.run.gather(futures)

    async def received(self, values: list[Any]) -> None:
        await self.run.received(values)

    async def submitting_client(self) -> Any:
        return await self.run.submitting_client()

    def installed(self, name: str) -> bool:
        installed: bool = self.run.installed(name)
        return installed

    async def until(self, waiting: asyncio.Future[Any]) -> Any:
        return await self.run.until(waiting)


async def run_beside(host: Beside, func: Any, args: tuple[Any, ...], name: str, timed: str | None = None) -> Any:
    """Run the body ``func(*args)`` beside ``host.run`` (a ``_Run``; on its
    worker's loop) to its end: its value, or its error raised (see the
    module). ``host`` is what the body sees as its trampoline's host, and
    says whether it steps or closes now. ``timed``: the name of a plain
    function in ``timings.TIMINGS``, whose run is timed there if its first
    step ends it (as a task's run of it is)."""
    run = host.run
    lanes = run.watcher.lanes_of(run.worker)
    lane = lanes.pick()
    tramp = trampoline(name, inline=bool(_config.get("coro.inline.enabled")), short=short_call)
    seen: Run = host  # what the body's features use of it
    tramp.host = seen
    host.tramp = tramp
    ctx = run.ctx.copy()
    awaited: list[asyncio.Future[Any]] = []  # what the body awaits now, on its lane's loop
    untimed = [timed]  # the name, until the first step

    def on_lane(fn: Any, args: tuple[Any, ...]) -> Any:
        if awaited and fn == tramp.close:
            awaited.pop().cancel()  # as asyncio cancels what a cancelled task awaits
        awaited.clear()
        name = untimed.pop() if untimed else None
        if name is None:
            out = ctx.run(fn, *args)
        else:
            began = perf_counter()
            out = ctx.run(fn, *args)
            if type(out) is Done:
                TIMINGS.ran(name, perf_counter() - began)
        if type(out) is Await:
            out.obj, obj = watch(out)
            if obj is not None:
                awaited.append(obj)
        return out

    async def step(fn: Any, *args: Any) -> Any:
        urgent, host.urgent = host.urgent, False
        # Shielded: a cancel stops our wait, not the step, which runs on
        # (its user code cannot be interrupted) until its next await.
        host.step = asyncio.ensure_future(
            lanes.run(lane, run.key, run.start, on_lane, fn, args, tree=run.tree, weight=run.weight, urgent=urgent)
        )
        return await asyncio.shield(host.step)

    # Side children started for each frame's remote leaves: (frame, position) -> (task, i).
    started: dict[tuple[int, int], tuple[asyncio.Task[Any], int]] = {}
    try:
        out = await step(tramp.start, func, args, {})
        while type(out) is not Done:
            for frame, positions in out.batches:
                task = asyncio.ensure_future(run.side([frame.leaves[p] for p in positions]))
                for i, p in enumerate(positions):
                    started[id(frame), p] = (task, i)
            if type(out) is Await:
                error = await asyncio.wrap_future(out.obj)
                out = await step(tramp.proceed, error)
            elif type(out) is Submit and out.wait:
                out = await _join(step, tramp, out.frame, started)
            else:  # a Submit that does not wait; never Stopped (no pause, no cancel hook)
                out = await step(tramp.run)
    except asyncio.CancelledError:
        # Cancelled by the feature that started it: close the body where it
        # waits, on its lane (its finally blocks run there), once a step
        # running now got to its next await; or here if the worker is
        # closing (its lanes may be gone), as a run does.
        if host.step is not None and not host.step.done() and not worker_is_closing(run.worker):
            await asyncio.wait([host.step])
        host.closing = True
        if worker_is_closing(run.worker):
            try:
                tramp.close()
            except ValueError as e:  # "generator already executing": a step still runs
                logger.debug("coroutine %r not closed: %r", name, e)
            raise
        for error in await asyncio.shield(step(tramp.close)):
            logger.warning("coroutine %r raised while closing after cancellation: %r", name, error)
        raise
    finally:
        for task, _ in started.values():
            task.cancel()  # released by ``side``: the scheduler cancels them
        started.clear()
        lanes.unpin(lane)
    # How the body ended, raised outside the ``try``: a body's own
    # CancelledError is its error, not a cancel of this run.
    end = out.step
    if type(end) is Returned:
        return end.value
    assert type(end) is Raised
    raise end.error


async def _join(step: Any, tramp: Any, frame: Frame, started: dict[tuple[int, int], tuple[asyncio.Task[Any], int]]) -> Any:
    """Resume ``frame`` with the values of its remote leaves, or raise the
    first error at its yield."""
    values = []
    try:
        for p in frame.remote:
            task, i = started.pop((id(frame), p))
            values.append((await task)[i])
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # a child's error, whatever it is
        if type(e) is BaseExceptionError:
            e = e.error
        for k in [k for k in started if k[0] == id(frame)]:
            started.pop(k)[0].cancel()
        return await step(tramp.throw, e)
    return await step(tramp.resume, values)
