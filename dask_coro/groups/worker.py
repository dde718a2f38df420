"""A group in a body running on a distributed worker.

A child is a task (one per leaf of what was spawned, a list of calls being
several): the run submits it as it submits a yield's children
(``_Run.start_children``: a key derived from the run's key, the group's
number and the child's index; ranked as the run's child, annotated with the
parent's key, so ``DurablePlugin`` holds it for a re-run), sharing the
results of the body that opened the group as that body's yields share
theirs (``_Run.scope_here``). The spawns of one step go in one message. Never a call run in the body's thread: a group
exists to act on each child as it finishes, and a child run inline would
make the body wait for all of it, so neither a first-of nor a deadline could
hold. But a small ``async def`` call (``_near``) runs *beside* the run on
this worker, a run of its own without a task (``runtime/beside.py``): it
mostly awaits, and a task would cost two trips through the scheduler. So
does a call of a plain function measured short here (``_short``,
``runtime/timings.py``: its runs far under a task's round trip, which the
group measures on its child tasks): microseconds of work gain nothing from
a task elsewhere. One never measured here is a task (and is measured where
it runs): children of 10 ms and more fan out.

Threads: the body (``spawn``, ``next``) runs on the run's lane; children's
results arrive on the worker's event loop. The group's book is shared under
its lock. ``next()`` runs ``_next`` in place (``InPlace``): it takes a child
the book has ready, else awaits a future of the lane's loop, which the
worker's loop sets when a child finishes or the deadline passes (the engine
hands that await to the runner as any asyncio await of an async body: the
run waits without a thread, ``core.engine.Await``). The deadline is a timer
on the worker's event loop (``call_at``): no thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from time import perf_counter
from typing import TYPE_CHECKING, Any

from .. import _config
from .._exceptions import BaseExceptionError
from .._internals.distributed.client import future_settled, send_on_client_stream
from .._internals.distributed.worker import scheduler_stream_open, send_on_worker_stream
from ..core.engine import NOT_DONE
from ..core.structure import Structure
from ..diagnostics.activity import GROUP_OP, REPORT_INTERVAL
from ..diagnostics.extension import TREE
from ..durability.scheduler import GROUP_LOG
from ..durable import order as durable_order
from ..runtime.beside import Beside, run_beside
from ..runtime.call import ASYNC, PLAIN, CoroutineCall
from ..runtime.errors import task_error
from ..runtime.extensions import Run
from ..runtime.timings import TIMINGS, function_name
from ..runtime.worker import closing_here
from .book import CANCELLED, Child, leaves, paths
from .request import Request

if TYPE_CHECKING:
    from distributed import Future

#: The group (``api.Group``; not imported: it imports this module).
_Group = Any


logger = logging.getLogger("dask_coro")


class WorkerBackend:
    def __init__(self, group: _Group, run: Run, tramp: Any):
        self.group = group
        self.run = run
        self.loop: asyncio.AbstractEventLoop = run.loop  # the worker's
        self.ident = run.ident("group")
        group.name = f"group {self.ident[2]} of {run.key!r}"
        # The body's results its children share, as its yields share them
        # (``_Run.scope_here``: asked here, in the body that opened the group).
        self.scope = run.scope_here(tramp)
        # Started children's futures (one per leaf of what was spawned), by index.
        self.futures: dict[int, list[Future]] = {}
        # The shapes of started children spawned as more than one value
        # (``book.shaped``; their leaves let go of), by index.
        self.shapes: dict[int, Structure] = {}
        self.pending: list[Child] = []  # to submit on the loop's next turn
        self.flushing = False
        self.waiter: asyncio.Future[None] | None = None  # of the lane's loop
        self.timer: asyncio.TimerHandle | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.durable = False  # DurablePlugin keeps what this group delivered
        self.stored = False  # so does a durable run's store (``durable/order.py``)
        # Children run beside the run, by index: the task running each, and its host.
        self.near: dict[int, tuple[asyncio.Task[None], Beside]] = {}
        self.settled: list[tuple[Child, list[Future]]] = []  # ended, to gather
        self.watchers: dict[int, asyncio.Task[None]] = {}  # by index, until settled
        # Child tasks of a plain function, by index: when each was submitted,
        # and its function's name (``timings``), to measure the round trip.
        self.sent: dict[int, tuple[float, str]] = {}
        # Stream children, by index: the task taking their items, the stream,
        # and an event set once the body took every item given so far.
        self.streams: dict[int, tuple[asyncio.Task[None], Any, asyncio.Event]] = {}
        self.gathering = False
        # Set once the replay (what an earlier run of the parent was given)
        # and the deadline are known: the first take waits for it.
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        # The counts last sent to the dashboard's plugin, and the next look.
        self.reported: tuple[list[int], bool] | None = None
        self.report_timer: asyncio.TimerHandle | None = None
        self.loop.call_soon_threadsafe(self._spawn_task, self._prepare())
        self.loop.call_soon_threadsafe(self._report)

    def check_stream(self, s: Any) -> None:
        self.group.place(s, "worker", getattr(s.backend, "run", None) is self.run)

    # -- on the lane (the body's thread) -------------------------------------

    def start(self, children: list[Child]) -> None:
        with self.group.lock:
            self.pending.extend(children)
            if self.flushing:
                return
            self.flushing = True
        self.loop.call_soon_threadsafe(self._flush)

    def stop(self, children: list[Child], closing: bool) -> None:
        self.loop.call_soon_threadsafe(self._stop, children, closing)

    def request(self, kind: str) -> Request:
        fn = {"next": _next, "more": _more, "all": _all, "aclose": _aclose}[kind]
        return Request(fn, self.group)

    def delivered(self, child: Child, replayed: bool) -> None:
        """``child`` was taken for the body (on the lane): record it for a
        re-run, unless it was replayed (recorded by the run that took it first).
        A stream child whose items were all taken: its next ones may come."""
        if child.items is not None and not child.items:
            entry = self.streams.get(child.index)
            if entry is not None:
                self.loop.call_soon_threadsafe(entry[2].set)
        if replayed:
            return
        if self.stored:
            durable_order.delivered(self.run, self.ident[2], index=child.index)
        if self.durable:
            self.loop.call_soon_threadsafe(self._spawn_task, self._log(index=child.index))

    # -- on the worker's loop ---------------------------------------------------

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _prepare(self) -> None:
        """Ask the scheduler what an earlier run of the parent was given by
        this group (its order, its deadline); take the tighter of our
        deadline and the one our own task carries (a child of a group with a
        deadline); arm the timer."""
        g = self.group
        try:
            inherited = self.run.annotations().get("dask_coro_deadline")
            if inherited is not None and (g.deadline is None or inherited < g.deadline):
                g.deadline = inherited
            self.durable = self.run.installed("durability")
            log: dict[str, Any] = {"deadline": None, "order": []}
            try:
                if self.durable:
                    log = await self.run.worker.scheduler.dask_coro_group_replay(key=self.run.key, group=self.ident[2])
            finally:
                # A durable run's store: what a run before the loss of the
                # cluster (or of the scheduler) delivered, then the scheduler's.
                stored = await durable_order.replay(self.run, self.ident[2], list(log["order"]))
                self.stored = stored is not None
                if stored is not None:
                    log = {"deadline": stored["deadline"] if stored["deadline"] is not None else log["deadline"],
                           "order": stored["order"]}
                with g.lock:
                    if log["deadline"] is not None:
                        g.deadline = log["deadline"]  # the first run's
                    g.book.replay = list(log["order"])
            if g.deadline is not None and log["deadline"] is None:
                if self.stored:
                    durable_order.delivered(self.run, self.ident[2], deadline=g.deadline)
                if self.durable:
                    await self._log(deadline=g.deadline)
        except Exception as e:  # the scheduler is going; the group goes on without a replay
            logger.warning("%s: no replay of an earlier run: %r", g.name, e)
        finally:
            if g.deadline is not None and not g.book.closed:
                self._arm()
            self.ready.set_result(None)
            with g.lock:
                waiter, self.waiter = self.waiter, None
            _wake(waiter)

    async def _log(self, index: int | None = None, deadline: float | None = None) -> None:
        client = await self.run.submitting_client()
        msg = {"op": GROUP_LOG, "key": self.run.key, "group": self.ident[2], "index": index, "deadline": deadline}
        send_on_client_stream(client, msg)

    def _report(self) -> None:
        """Send the group's children by state to the scheduler's TreePlugin
        (the dashboard's Coroutines page) if they changed since last sent:
        every ``REPORT_INTERVAL`` while the group is open, and once it
        closed (``_stop``), on the worker's stream, ahead of the parent's
        end. Nothing if the tree is off (no plugin to hear it: a stream
        message nobody handles would close the stream)."""
        self.report_timer = None
        if not self.run.installed(TREE.name):
            return
        g = self.group
        with g.lock:
            counts = g.book.counts()
            closed = g.book.closed
        worker = self.run.worker
        if (counts, closed) != self.reported and scheduler_stream_open(worker):
            self.reported = (counts, closed)
            send_on_worker_stream(worker, {
                "op": GROUP_OP, "key": self.run.key, "group": self.ident[2], "counts": counts,
                "limit": g.book.limit, "closed": closed,
            })
        if not closed:
            self.report_timer = self.loop.call_later(REPORT_INTERVAL, self._report)

    def _arm(self) -> None:
        deadline = self.group.deadline
        assert deadline is not None
        self.timer = self.loop.call_later(max(0.0, deadline - time.time()), self._expire)

    def _expire(self) -> None:
        self.timer = None
        if self.group.book.closed:
            return
        # The body hears of it at its wait without waiting for a thread.
        self.run.urgent = True
        self._stop(self.group.expire(), closing=True)

    def _start_here(self, children: list[Child]) -> None:
        """``start``, on the loop: flushed now, not on the loop's next turn."""
        with self.group.lock:
            self.pending.extend(children)
            if self.flushing:
                return  # a flush is queued: it takes these too
            self.flushing = True
        self._flush()

    def _flush(self) -> None:
        with self.group.lock:
            batch, self.pending = self.pending, []
            self.flushing = False
        batch = [c for c in batch if c.state != CANCELLED]
        tasks = []
        for c in batch:
            if c.items is not None:
                if self.group.deadline is not None:  # its producer's groups take the tighter
                    c.obj.backend.annotations["dask_coro_deadline"] = self.group.deadline
                drained = asyncio.Event()
                self.streams[c.index] = (asyncio.ensure_future(self._pump(c, c.obj, drained)), c.obj, drained)
            elif _near(c.obj) or _short(c.obj):
                host = Beside(self.run, {"dask_coro_deadline": self.group.deadline} if self.group.deadline is not None else None)
                self.near[c.index] = (asyncio.ensure_future(self._beside(c, host)), host)
            else:
                tasks.append(c)
        if tasks:
            task = asyncio.ensure_future(self._submit(tasks))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _submit(self, batch: list[Child]) -> None:
        """Submit the children of ``batch`` in one message: the leaves of
        each, as a yield of what it spawned would submit them (a plain
        value, with none, is delivered as it is)."""
        g = self.group
        objs = [c.obj for c in batch]
        now = perf_counter()
        for c, obj in zip(batch, objs, strict=True):
            c.obj = None  # the task holds it now
            if type(obj) is CoroutineCall and obj._fn is not None and obj._fn.kind == PLAIN:
                self.sent[c.index] = (now, function_name(obj._fn))
        todo: list[Any] = []
        where: list[Any] = []
        counts: list[int] = []  # leaves per child
        for c, obj in zip(batch, objs, strict=True):
            mine = leaves(obj)
            todo += mine
            where += [(c.index, *p) for p in paths(obj)]  # one leaf: (index,), as ever
            counts.append(len(mine))
            if type(obj) is Structure:
                self.shapes[c.index] = obj.without_leaves()
        try:
            futures = await self.run.start_children(
                todo, where, self.ident,
                {"dask_coro_deadline": g.deadline} if g.deadline is not None else None,
                self.scope,
            ) if todo else []
        except Exception as e:  # planning failed (a bad graph, a lost Future)
            del todo
            if len(batch) > 1:  # each child on its own: the others' error is not theirs
                for c, obj in zip(batch, objs, strict=True):
                    c.obj = obj if c.state != CANCELLED else None
                del objs
                for c in batch:
                    if c.state != CANCELLED:
                        await self._submit([c])
                return
            for c in batch:
                self.shapes.pop(c.index, None)
                self._finished(c, False, e)
            return
        del todo, objs
        at = 0
        for c, n in zip(batch, counts, strict=True):
            fs, at = futures[at:at + n], at + n
            if c.state == CANCELLED:
                self.shapes.pop(c.index, None)
                self.run.release(fs)
                continue
            if not fs:  # a plain value (no leaf): its value, at once
                self._finished(c, True, self._rebuild(c, []))
                continue
            self.futures[c.index] = fs
            self.watchers[c.index] = asyncio.ensure_future(self._watch(c, fs))

    def _rebuild(self, child: Child, values: list[Any]) -> Any:
        shape = self.shapes.pop(child.index, None)
        return values[0] if shape is None else shape.rebuild(values)

    async def _beside(self, child: Child, host: Beside) -> None:
        """Run ``child`` (a small ``async def`` call, or a short plain one)
        beside the run: no task, no round trip through the scheduler
        (``runtime.beside``). A plain function's run is timed there."""
        call, child.obj = child.obj, None
        fn = call._fn
        timed = function_name(fn) if fn.kind == PLAIN else None
        try:
            value = await run_beside(host, call.__dask_coro_inline__, call.__dask_coro_args__, fn.prefix, timed)
        except BaseException as e:  # the child's error, whatever it is
            me = asyncio.current_task()
            if child.state == CANCELLED or (me is not None and me.cancelling()):
                # The group let go of it (``_stop``), or the worker is closing.
                if isinstance(e, asyncio.CancelledError):
                    raise
                return
            # A CancelledError of the body's own too: its error, as a task's
            # would reach us (``runtime.errors.task_error``).
            self._finished(child, False, task_error(e))
            return
        finally:
            self.near.pop(child.index, None)
            del call
        if child.state != CANCELLED:
            self._finished(child, True, value)

    async def _pump(self, child: Child, s: Any, drained: asyncio.Event) -> None:
        """Take stream child ``child``'s items as its producer hands them out,
        each delivered on its own; the next batch once the body took this
        one (the stream's buffer holds: the producer is not let run further
        ahead of the body than its buffer and one batch)."""
        g = self.group
        try:
            while True:
                drained.clear()
                items = await s._batch()
                if items:
                    with g.lock:
                        for item in items:
                            g.book.emitted(child, item)
                        waiter, self.waiter = self.waiter, None
                    _wake(waiter)
                if s.end is not None:
                    self._finished(child, *s.end)
                    return
                if items:
                    await drained.wait()
        except asyncio.CancelledError:
            raise  # the group let go of it (``_stop``), or the worker is closing
        except Exception as e:  # the stream's fetch failed: the child's error
            if child.state != CANCELLED:
                self._finished(child, False, e)
        finally:
            self.streams.pop(child.index, None)

    async def _watch(self, child: Child, futures: list[Future]) -> None:
        """Wait until the client hears that ``futures`` ended, or one of
        them failed (no message), then gather them with every other child
        that ended meanwhile: one ``gather`` for the children of one turn of
        the loop, as a yield gathers its children, not one each."""
        try:
            if len(futures) == 1:
                await future_settled(futures[0])
            else:
                await _settled(futures)
        except asyncio.CancelledError:
            return  # the group let go of it (``_stop``)
        finally:
            self.watchers.pop(child.index, None)
        if child.state == CANCELLED:
            return
        self.settled.append((child, futures))
        if not self.gathering:
            self.gathering = True
            self._spawn_task(self._gather_settled())

    async def _gather_settled(self) -> None:
        try:
            await asyncio.sleep(0)  # the children settling this turn join
            while self.settled:
                batch, self.settled = self.settled, []
                batch = [(c, fs) for c, fs in batch if c.state != CANCELLED]
                if not batch:
                    continue
                futures = [f for _, fs in batch for f in fs]
                try:
                    values = await self.run.gather(futures)
                    await self.run.received(values)  # before the children go (``_finished``)
                except BaseException:  # a child's error (any class): each child on its own
                    for c, fs in batch:
                        self._spawn_task(self._gather_one(c, fs))
                    continue
                at = 0
                for c, fs in batch:
                    self._finished(c, True, self._rebuild(c, values[at:at + len(fs)]))
                    at += len(fs)
        finally:
            self.gathering = False
            if self.settled:  # settled while we finished
                self.gathering = True
                self._spawn_task(self._gather_settled())

    async def _gather_one(self, child: Child, futures: list[Future]) -> None:
        try:
            values = await self.run.gather(futures)
            await self.run.received(values)
        except asyncio.CancelledError:
            if child.state == CANCELLED:
                return
            raise
        except BaseException as e:  # a child's error, a BaseException too
            if child.state == CANCELLED:
                return  # released by the group: its error is of no one
            if type(e) is BaseExceptionError:
                e = e.error
            self._finished(child, False, e)
            return
        self._finished(child, True, self._rebuild(child, values))

    def _finished(self, child: Child, ok: bool, value: Any) -> None:
        sent = self.sent.pop(child.index, None)
        if sent is not None and ok:
            mean = TIMINGS.mean(sent[1])  # measured by then if it ran here
            if mean is not None:
                TIMINGS.tripped(perf_counter() - sent[0] - mean)
        g = self.group
        with g.lock:
            more = g.book.finished(child, ok, value)
            waiter, self.waiter = self.waiter, None
        self.shapes.pop(child.index, None)
        fs = self.futures.pop(child.index, None)
        if fs is not None:
            self.run.release(fs)  # consumed: held for a re-run within the budget
        if more:
            self._start_here(more)
        _wake(waiter)

    def _stop(self, children: list[Child], closing: bool) -> None:
        """Let go of the children's tasks (the scheduler cancels those nobody
        else wants; a coroutine child's run closes its body)."""
        out = [f for c in children for f in self.futures.pop(c.index, ())]
        for c in children:
            self.shapes.pop(c.index, None)
            self.sent.pop(c.index, None)
            near = self.near.get(c.index)
            if near is not None:
                near[0].cancel()  # closes its body at its await; gone from ``near`` once closed
            watcher = self.watchers.pop(c.index, None)
            if watcher is not None:
                watcher.cancel()  # a released future's state never settles
            stream = self.streams.pop(c.index, None)
            if stream is not None:
                stream[0].cancel()
                stream[1].close()  # its producer is let go of: the scheduler cancels it
        if out:
            self.run.release(out)
        if closing and self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if closing and self.report_timer is not None:
            self.report_timer.cancel()
            self._report()  # the last counts, closed
        # The body may wait in next() for these very children: once no
        # child is left it must hear so (``_take`` answers None), as a
        # group on the client does, whoever cancelled them (the body's
        # other task, another thread).
        with self.group.lock:
            waiter, self.waiter = self.waiter, None
        _wake(waiter)

    async def _ended(self, keys: list[Any]) -> None:
        """Until every child run beside us has closed (``_stop`` cancelled
        them, on this loop, before this) and the scheduler runs none of ``keys``."""
        while True:
            # As for child tasks (``_closed``): not one whose body runs code
            # between two awaits, which may never get to its next.
            closing = [task for task, host in self.near.values() if host.closing or not host.stepping]
            if not closing:
                break
            await asyncio.wait(closing, timeout=0.05)
        if keys:
            await self._gone(keys)
            await self._closed(keys)

    async def _gone(self, keys: list[Any]) -> None:
        """Until the scheduler runs none of ``keys`` (forgotten, or finished
        before the release reached it: held for a re-run)."""
        client = await self.run.submitting_client()

        async def running() -> list[Any]:
            nonlocal keys  # asked again for those still running only
            states = await client.scheduler.get_task_status(keys=keys)
            keys = [k for k, s in states.items() if s not in _ENDED]
            return keys

        await _until_none(running)

    async def _closed(self, keys: list[Any]) -> None:
        """Until no worker has a coroutine child of ``keys`` to close: the
        scheduler forgets a cancelled task at once, while its worker still
        closes the child's body (its ``finally`` blocks). Asked of every
        worker (``Client.run``), as only the workers know. A child running
        code between two yields, or a plain function, is not waited for:
        nothing can stop it, and it may never get to its next yield (it is
        closed there; a plain function's result is dropped)."""
        client = await self.run.submitting_client()

        async def closing() -> list[Any]:
            per_worker = await client.run(_closing_here, keys=keys)
            return [k for ks in per_worker.values() for k in ks]

        await _until_none(closing)


async def _settled(futures: list[Future]) -> None:
    """Until the client hears that every one of ``futures`` ended, or that
    one of them failed (its error is the child's: a yield raises the first)."""
    waiting = {future_settled(f): f for f in futures}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for w in done:
                if waiting.pop(w).status != "finished":
                    return
    finally:
        for w in waiting:
            w.cancel()  # off the future's event


async def _until_none(ask: Any) -> None:
    """Ask ``ask()`` again, less and less often (5 ms, doubling up to
    100 ms), until it answers nothing."""
    delay = 0.005
    while await ask():
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)


_ENDED = (None, "memory", "erred", "released", "forgotten")


def _closing_here(dask_worker: Any, keys: list[Any]) -> list[Any]:
    """Which of ``keys`` are coroutine runs this worker has yet to close
    (``Client.run``; ``runtime.worker.closing_here``)."""
    return closing_here(dask_worker, keys)


def _near(obj: Any) -> bool:
    """Whether child ``obj`` runs beside the run rather than as a task: a
    call of an ``async def`` coroutine that may run inline (plain
    arguments, no name, no annotations of its own, not ``inline=False``),
    with inline calls enabled. Such a child mostly awaits (I/O, timers),
    holding no thread, so running it here costs the worker nothing a task
    would not, and saves the round trip through the scheduler."""
    return (
        type(obj) is CoroutineCall
        and obj.__dask_coro_inline__ is not None
        and obj.__dask_coro_value__ is NOT_DONE
        and obj._fn is not None
        and obj._fn.kind == ASYNC
        and bool(_config.get("coro.inline.enabled"))
    )


def _short(obj: Any) -> bool:
    """Whether child ``obj`` is a call of a plain function that may run
    inline (as ``_near`` asks) and whose calls are short here
    (``runtime.timings``: measured, well under a task's round trip): it runs
    beside the run, as a small ``async def`` call does, rather than pay a
    round trip through the scheduler for microseconds of work. A function
    not measured yet, or slow, goes out as a task: its children fan out."""
    if type(obj) is not CoroutineCall:
        return False
    fn = obj._fn
    return (
        fn is not None
        and fn.kind == PLAIN
        and obj.__dask_coro_inline__ is not None
        and obj.__dask_coro_value__ is NOT_DONE
        and TIMINGS.short(function_name(fn))
        and bool(_config.get("coro.inline.enabled"))
    )


def _producer_key(backend: WorkerBackend, child: Child) -> Any:
    """The key of stream child ``child``'s producer, if it was submitted."""
    entry = backend.streams.get(child.index)
    future = None if entry is None else entry[1].backend.future
    return None if future is None else future.key


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is None:
        return
    loop = waiter.get_loop()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    try:
        loop.call_soon_threadsafe(wake)
    except RuntimeError:  # the lane's loop closed: the run is gone
        pass


async def _take(g: _Group) -> Child | None:
    """The next child to deliver, waiting for one to finish; None if none is
    left. ``TimeoutError`` once the deadline passed."""
    backend: WorkerBackend = g.backend
    if not backend.ready.done():
        await asyncio.wrap_future(backend.ready)
    while True:
        with g.lock:
            replayed = g.book.replayed
            child = g.book.take()
            if child is not None:
                backend.delivered(child, g.book.replayed != replayed)
            else:
                if g.expired:
                    raise g.timeout_error()
                if not g.book.left:
                    return None
                waiter = backend.waiter = asyncio.get_running_loop().create_future()
        if child is not None:
            return child
        await waiter


async def _more(g: _Group) -> tuple[Child, Any] | None:
    child = await _take(g)
    return None if child is None else g.deliver(child)


async def _next(g: _Group) -> tuple[Child, Any]:
    got = await _more(g)
    if got is None:
        raise g.no_child("next")
    return got


async def _all(g: _Group) -> list[Any]:
    with g.lock:
        pending = g.book.pending()
    out: dict[int, Any] = {}
    while True:
        child = await _take(g)
        if child is None:
            break
        g.collect(out, g.deliver(child))
    return g.values(pending, out)


async def _aclose(g: _Group) -> None:
    """Cancel the rest, and wait until the scheduler let go of every child
    task and every child run beside us has closed."""
    backend: WorkerBackend = g.backend
    stop = g.cancel_all() or []
    keys = [f.key for c in stop for f in backend.futures.get(c.index, ())]
    keys += [k for k in (_producer_key(backend, c) for c in stop) if k is not None]
    backend.stop(stop, closing=True)
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(backend._ended(keys), backend.loop))
