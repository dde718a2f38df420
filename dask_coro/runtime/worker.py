"""The worker side: a coroutine task running on a distributed worker.

distributed awaits ``CoroutineTask.__call__`` on the worker's event loop
(``Worker.execute`` -> ``_run_task_async``). The runner:

1. steps the body, and the coroutine calls it runs inline, through a
   ``Trampoline`` on the one lane the run is pinned to, while holding a
   thread of the worker's pool (``lanes.py``: CPU work never blocks the
   loop, a body keeps its thread, and one parked in ``result()`` resumes
   there), inside one ``contextvars.Context`` per run, where
   ``current_key()`` is set; an ``async def`` body's asyncio awaits run on
   the lane's event loop while the run holds no thread (``Await``);
2. submits what the trampoline hands out (the remote leaves of a frame's
   yield, calls promoted to tasks) in one ``update-graph`` message per step
   (``Client.get(..., sync=False)``), with keys derived from the frame's place
   under our key;
3. the first time it waits on the cluster, secedes: a ``SecedeEvent`` turns
   the task into a long-running one on worker and scheduler, so a waiting
   coroutine holds no slot and no thread, only this heap object;
4. releases a result as soon as no live lazy value of the frame depends on it
   (``ResultCache``), and everything at the end;
5. watches its own key through a worker plugin: when the scheduler cancels
   the task (root future cancelled, client closed), it stops, closes every
   open body (``finally`` blocks run) and releases its children, whose own
   runners then see their keys cancelled in turn;
6. while any run on the worker runs calls inline, hears from the scheduler
   how many threads are idle (``InlinePlugin``: pushed to a subscribed
   worker, or polled), which trampolines read to hand work out;
7. calls the hooks of the extensions enabled when it started
   (``extensions.py``): the features (the tree, durability, workers
   releasing keys, ...) plug in there, and the runner names none of them.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
from time import perf_counter, time
from typing import TYPE_CHECKING, Any

import dask
from dask.typing import Key
from dask.utils import funcname
from distributed import Future, Reschedule, get_client
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol.pickle import dumps
from distributed.worker import get_worker

from .. import _config
from .._context import gather_in_task, running_key
from .._exceptions import BaseExceptionError, CoroutineCancelledError, DaskCoroError, Released
from .._internals.dask_private import DataNode, Task
from .._internals.distributed.client import (
    annotated_graph,
    collections_message,
    flush_client_stream,
    future_settled,
    get_in_order,
    own_scheduler_rpc,
    seceding_waits,
    send_serialized,
    serialized_graph,
    set_batch_interval,
    submitting_as,
)
from .._internals.distributed.core import add_handlers
from .._internals.distributed.worker import (
    add_worker_plugin_now,
    as_worker,
    default_executor,
    send_on_worker_stream,
    worker_plugin,
)
from .._internals.distributed.worker_state_machine import (
    local_data,
    secede_from_loop,
    worker_free_slots,
    worker_next_ready,
    worker_slots_full,
    worker_task_annotations,
    worker_task_function,
    worker_task_priority,
    worker_task_state,
)
from ..core.engine import (
    Await,
    Done,
    Frame,
    Idle,
    Outcome,
    Raised,
    Returned,
    Stopped,
    Submit,
    Trampoline,
)
from ..core.plan import Plan, plan_yield
from ..core.scope import Scope
from . import extensions
from .aio import gathered, watch
from .call import PLAIN, CoroutineTask, _reraise, trampoline
from .extensions import PARENT, Active, Extension, Run
from .inplace import localizer
from .lanes import PATIENCE, Lane, Lanes, weight_of
from .scheduler import BUSY, IDLE, MODES, SUBSCRIBE, UNSUBSCRIBE
from .stealing import STEALING
from .timings import TIMINGS, name_of, short_call

if TYPE_CHECKING:
    from distributed import Client, Worker

logger = logging.getLogger("dask_coro")

_RUNNING_STATES = ("executing", "long-running")
#: The annotation that gives a child its tree and the tree's weight
#: (``_Run._share``): the threads of a worker are shared fairly between trees.
TREE = "dask_coro_tree"

#: s between a change of the threads seceded runs hold and telling the
#: scheduler what holds then (``_KeyWatcher._over_changed``).
BUSY_DELAY = 0.002

#: s a step paused for a coroutine task in the ready queue waits, at most,
#: for that task's first step to ask for a thread (``_KeyWatcher.yielded``).
YIELD_WAIT = 0.05

_QUIET = 1.0  # s without an inline run before a worker stops hearing of idle threads
# s a push is kept at least. A trampoline reads the count between inline
# calls only, so a push held for less than one call lasts is never read: with
# 20 ms calls and a 20 ms hold, a tree ran on one worker of two. A count kept
# too long costs at most that many calls handed out to threads busy again.
_MIN_HOLD = 0.25
# Tasks of a step's graph past which it is serialized on the lane, not on the
# event loop (some 10-30 us a task: a few ms here).
_SERIALIZE_HERE = 200


class _SwitchInterval:
    """The interpreter's switch interval while calls run inline in this
    process (``coro.inline.switch-interval``). A thread running Python code
    keeps the GIL until another has waited this long for it, and the event
    loop's thread gives it up at every system call: with CPython's default of
    5 ms, a push of idle threads or a stolen task's message waited some 5-30
    ms to be read, handled and sent on while a body ran inline. Set when the
    process's first inline run starts (all its workers share the interpreter),
    put back when its last ends, unless someone else changed it meanwhile."""

    def __init__(self) -> None:
        self.runs = 0
        self.before = 0.0
        self.set_to: float | None = None

    def enter(self, interval: float | None) -> None:
        if not self.runs:
            self.before = sys.getswitchinterval()
            self.set_to = None
            if interval and interval < self.before:
                sys.setswitchinterval(interval)
                self.set_to = sys.getswitchinterval()
        self.runs += 1

    def exit(self) -> None:
        self.runs -= 1
        if not self.runs and self.set_to is not None and sys.getswitchinterval() == self.set_to:
            sys.setswitchinterval(self.before)


_switching = _SwitchInterval()


def run_if_on_worker(task: CoroutineTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The coroutine that runs ``task`` on the distributed worker whose event
    loop calls this, or None if no worker's loop does."""
    try:
        worker = get_worker()  # thread_state, or the ContextVar Worker.execute sets
    except ValueError:
        return None
    if worker_task_state(worker, task.key) != "executing":
        # Called on the loop, but not as the task the worker is executing:
        # a synchronous scheduler run from inside an async task, or a key
        # renamed by graph fusion. Never hand back an unawaited coroutine.
        raise DaskCoroError(
            f"coroutine task {task.key!r} was called on a worker's event loop "
            "but is not a task executing there; compute coroutine calls from a "
            "thread (not inside an async task), and without low-level fusion"
        )
    return _started(worker, task, args, kwargs)


async def _started(worker: Worker, task: CoroutineTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``task`` once the plugins of the extensions its settings enable
    are installed: a plugin that cannot be fails the task, before its body
    runs (``_KeyWatcher.install_plugins``)."""
    active = extensions.active()  # raises on a bad setting, failing the task
    if await _watcher(worker).install_plugins(worker, active):
        # We waited (the first coroutine here): the key may have been
        # released meanwhile, and perhaps asked for again.
        state = worker_task_state(worker, task.key)
        if state == "resumed":
            raise Reschedule()
        if state != "executing":
            raise CoroutineCancelledError(f"coroutine {task.key!r} was cancelled")
    return await _Run(worker, task, active).main(args, kwargs)


class _KeyWatcher(WorkerPlugin):
    """Wakes the run of a key whenever the worker's state machine moves it.

    ``WorkerState._notify_plugins`` calls ``transition`` on the event loop for
    every transition of every task; we only look up a dict.
    """

    name = "dask-coro-key-watcher"
    idempotent = True

    def __init__(self) -> None:
        self.runs: dict[Key, _Run] = {}
        self.client: Client | None = None
        # The install of each extension's plugins (by its name), once per worker.
        self.installs: dict[str, asyncio.Future[None]] = {}
        # Inline runs: idle threads in the cluster as the scheduler last told
        # (pushed, or polled) while any run on this worker runs calls inline;
        # trampolines read it.
        self.idle = Idle()
        # What each tree's runs read of it (``_spread``): a tree and its
        # view, with how many runs of it are here.
        self.idle_of: dict[str, tuple[Idle, int]] = {}
        self.inline_runs = 0
        self.inline_ended_at = 0.0  # when the last inline run ended
        self.stealer: asyncio.Task[None] | None = None  # subscribed, or polling
        self.handler_added = False  # our handler of the scheduler's IDLE pushes
        self.pushes = 0  # pushes received
        self.interval = 0.0  # coro.inline.interval, read when subscribing
        self.pushed_at = 0  # the push idle.n came from (expiry)
        self.pushes_at_exec = 0  # pushes received when a task last went executing
        self.handed_out = 0.0  # when a run last handed work out
        self.lanes: Lanes | None = None  # made on first use (lanes.py)
        self.worker: Worker | None = None  # ours (``_watcher``)
        self.watching = False  # the ready queue is watched (``_queued``)
        self.busy_due = False  # a BUSY message is due (``_over_changed``)
        self.busy_sent = 0  # what the last BUSY message said
        # A step paused for a coroutine task in the ready queue (its key, as
        # a string) -> that task's key, and until when it waits for it.
        self.yielding: dict[str, tuple[Key, float]] = {}
        #: How those waits ended: its step asked first, it went, or time ran out.
        self.yields = dict.fromkeys(("asked", "gone", "timeout"), 0)

    def lanes_of(self, worker: Worker) -> Lanes:
        if self.lanes is None:
            self.lanes = Lanes(worker.state.nthreads, default_executor(worker))
            loop = asyncio.get_running_loop()

            def over_changed() -> None:  # on a lane's or a pool's thread
                try:
                    loop.call_soon_threadsafe(self._over_changed)
                except RuntimeError:  # the loop closed: the worker is gone
                    pass

            self.lanes.seats.on_over = over_changed
        return self.lanes

    async def yielded(self, key: Key) -> None:
        """Run ``key`` paused for a coroutine task waiting in the ready queue
        (``_queued``): before asking for a thread again, let that task's
        first step ask for one first (or ``YIELD_WAIT`` pass). Else the
        paused step, asking at once, took back the thread it gave, and the
        task that took its slot waited for another step's pause (seen: a
        small tree's root waited two leaves of a wide tree, not one)."""
        waited = self.yielding.pop(str(key), None)
        if waited is None or self.worker is None:
            return
        other, until = waited
        while time() < until:
            run = self.runs.get(other)
            if run is not None and run.stepping:
                self.yields["asked"] += 1  # its step asked (or is about to, on its lane)
                return
            if worker_task_state(self.worker, other) not in ("ready", "constrained", "executing"):
                self.yields["gone"] += 1  # it went elsewhere, or ended
                return
            await asyncio.sleep(0.001)
        self.yields["timeout"] += 1

    def _over_changed(self) -> None:
        """Steps of seceded runs took or gave back threads (``Seats.over``):
        tell the scheduler, a few ms later with what holds then (a pause
        gives a thread back and takes one again at once)."""
        if not self.busy_due:
            self.busy_due = True
            asyncio.get_running_loop().call_later(BUSY_DELAY, self._send_busy)

    def _send_busy(self) -> None:
        self.busy_due = False
        worker, lanes = self.worker, self.lanes
        if worker is None or lanes is None:
            return
        n = lanes.seats.over
        if n == self.busy_sent:
            return
        installed = self.installs.get(STEALING.name)
        if installed is None or not installed.done() or installed.cancelled() or installed.exception():
            return  # no scheduler plugin to tell: no run here hands calls out
        try:
            send_on_worker_stream(worker, {"op": BUSY, "n": n})
        except Exception as e:  # the stream is closed: the worker is going
            logger.debug("dask_coro busy threads not sent: %r", e)
            return
        self.busy_sent = n

    def teardown(self, worker: Worker) -> None:
        if self.lanes is not None:
            self.lanes.close()

    def inline_started(self, worker: Worker) -> None:
        # Raises, failing the task, on a bad setting: before anything runs.
        mode = _config.get_choice("coro.inline.stealing", MODES)
        # A count received before the latest task here went executing was
        # taken before this task took its thread; one received since was
        # taken after the scheduler gave it the thread (the scheduler looks
        # when a task starts on a subscribed worker, and its stream keeps
        # order), and stands.
        if self.pushes == self.pushes_at_exec:
            self.handed(self.idle.n)
        switch = _config.get_timedelta("coro.inline.switch-interval", allow_none=True)
        self.inline_runs += 1
        _switching.enter(switch)
        if self.stealer is None or self.stealer.done():
            steal = self._subscribed if mode == "push" else self._poll
            self.stealer = asyncio.ensure_future(steal(worker))

    def inline_ended(self) -> None:
        self.inline_runs -= 1
        _switching.exit()
        self.inline_ended_at = time()

    def handed(self, n: int) -> None:
        """A run handed ``n`` calls out: they take idle threads the last count
        announced, until a count sent after this says otherwise."""
        self._set_idle(self.idle.n - n)
        self.handed_out = time()

    async def install_plugins(self, worker: Worker, active: Active) -> bool:
        """Install the plugins of the ``active`` extensions installed at
        first use, each once per worker (a failed install is tried again by
        the next task); raise what stops one (``_install``). Nothing to wait
        for once they are; whether it waited."""
        wanted = []
        installs = self.installs
        for ext in active.at_first_use:
            fut = installs[ext.name] = _installing(installs.get(ext.name), worker, ext)
            wanted.append(fut)
        waited = False
        for fut in wanted:
            if not fut.done() or fut.cancelled() or fut.exception() is not None:
                waited = True
                await asyncio.shield(fut)
        return waited

    async def _installed(self, worker: Worker) -> bool:
        # InlinePlugin: not installed yet, or it failed: try again.
        fut = self.installs[STEALING.name] = _installing(self.installs.get(STEALING.name), worker, STEALING)
        try:
            await asyncio.shield(fut)
        except Exception:
            return False  # logged by _install; calls then run inline, none handed out
        return True

    def _quiet(self) -> bool:
        """No inline run here for a second: a worker running many short
        coroutines stays subscribed (or polling) between them."""
        return self.inline_runs == 0 and time() - self.inline_ended_at > _QUIET

    async def _subscribed(self, worker: Worker) -> None:
        """Push mode: subscribe to the scheduler's IDLE pushes while any run
        here runs calls inline (``InlinePlugin``)."""
        if not await self._installed(worker):
            return
        if not self.handler_added:
            # Before subscribing: an op with no handler closes the stream.
            add_handlers(worker, stream={IDLE: lambda n, at=None, **kw: self._pushed(n, at)})
            self.handler_added = True
        self.interval = _config.get_timedelta("coro.inline.interval")
        try:
            send_on_worker_stream(worker, {"op": SUBSCRIBE})
            while True:
                await asyncio.sleep(_QUIET)
                if self._quiet():
                    break
            send_on_worker_stream(worker, {"op": UNSUBSCRIBE})
        except Exception as e:  # the stream is closed: the worker is going
            logger.debug("dask_coro inline subscription ended: %r", e)
        self._set_idle(0)

    def _pushed(self, n: int, at: dict[str, int] | None = None) -> None:
        """The scheduler says ``n`` threads are idle: hand out up to that many
        calls, for one interval, and at least ``_MIN_HOLD`` (a count not used
        by then is out of date). Those it counted here (``at``: the idle
        threads by worker) are taken as this worker counts them now, and
        ``n`` is cut to what is left of them all: the scheduler hears of a thread a
        resumed step took back only a message later, a few ms, up to tens
        under load (the worker's loop waits for the GIL behind the steps),
        and a call handed out then would queue behind those very steps (seen:
        a small tree's call handed out to its own worker, where it waited a
        wide tree's leaf for a thread, then its parent another)."""
        self.pushes += 1
        if at and self.worker is not None:
            counted = at.get(self.worker.address, 0)
            if counted:
                wrong = max(0, counted - self._free_threads(self.worker))
                n = min(n, sum(at.values()) - wrong)
        self._set_idle(n)
        self.pushed_at = push = self.pushes
        hold = max(self.interval, _MIN_HOLD)
        asyncio.get_running_loop().call_later(hold, self._expire, push)

    def idle_for(self, tree: str) -> Idle:
        """The view of ``idle`` a run of ``tree`` reads (one more run of it);
        ``idle_done`` when the run ends."""
        view, count = self.idle_of.get(tree, (None, 0))
        if view is None:
            # A tree new here starts behind the others (at their least
            # virtual time, ``Seats._share``): none while another holds a thread.
            busy = self.lanes is not None and self.lanes.seats.busy()
            view = Idle(0 if busy else self.idle.n)
        self.idle_of[tree] = (view, count + 1)
        return view

    def idle_done(self, tree: str) -> None:
        view, count = self.idle_of[tree]
        if count > 1:
            self.idle_of[tree] = (view, count - 1)
        else:
            del self.idle_of[tree]

    def _set_idle(self, n: int) -> None:
        """The idle threads this worker may hand calls out to now, and each
        tree's view of them (``_spread``)."""
        self.idle.n = max(0, n)
        self._spread()

    def _spread(self) -> None:
        """Each tree's view of the idle threads: the count, but none for the
        trees furthest behind their share while others here are ahead
        (``Seats.behind``): their calls stay on the threads they hold. (The
        small tree beside a wide one: a call it handed out waited for a wide
        leaf to end on the thread it was given, and its parent for another
        to resume; inline, its calls never leave its thread.)"""
        n = self.idle.n
        behind = self.lanes.seats.behind() if n > 0 and self.lanes is not None and len(self.idle_of) > 1 else ()
        for tree, (view, _) in self.idle_of.items():
            view.n = 0 if tree in behind else n

    def _free_threads(self, worker: Worker) -> int:
        """Threads of the pool nobody holds now: less the tasks executing
        (not seceded) and the threads steps of seceded runs took again."""
        over = self.lanes.seats.over if self.lanes is not None else 0
        return worker_free_slots(worker) - over

    def _expire(self, push: int) -> None:
        if self.pushed_at == push:
            self._set_idle(0)

    async def _poll(self, worker: Worker) -> None:
        """Poll mode: ask the scheduler for idle threads every interval while
        any run here runs calls inline."""
        interval = _config.get_timedelta("coro.inline.interval")
        if not await self._installed(worker):
            return
        while not self._quiet():
            sent = time()
            try:
                n = await worker.scheduler.dask_coro_idle()
            except Exception as e:  # the scheduler is going away, or restarting
                logger.debug("dask_coro_idle failed: %r", e)
                n = 0
            self._set_idle(n if sent > self.handed_out else 0)
            await asyncio.sleep(interval)
        self._set_idle(0)

    def transition(self, key: Key, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing":
            self.pushes_at_exec = self.pushes
        elif (finish == "ready" or finish == "constrained") and not self.watching and self.worker is not None:
            # A task may wait for a thread slot that a run's inline calls hold.
            self.watching = True
            asyncio.get_running_loop().call_later(PATIENCE, self._queued)
        run = self.runs.get(key)
        if run is not None:
            run.changed()

    def _queued(self) -> None:
        """Every ``PATIENCE`` while a task waits in the worker's ready queue:
        if every thread slot is taken and a run's step holds a thread, ask the
        steps of other trees than the next task's that hold a slot and held
        their threads a time slice to pause (the first to pause secedes, and
        its slot is free; ``lanes.Seats.preempt_for``). Without this a small tree's root
        waited in the ready queue for the whole inline chain of another
        tree's task: seconds. One timer per worker, while a task waits."""
        worker, lanes = self.worker, self.lanes
        key = None if worker is None else worker_next_ready(worker)
        if key is None or worker is None:
            self.watching = False
            return
        if lanes is not None and lanes.seats.busy() and worker_slots_full(worker):
            given = worker_task_annotations(worker, key).get(TREE)
            tree = str(key) if given is None else str(given[0])
            holding = {str(k) for k, run in self.runs.items() if not run.seceded}
            asked = lanes.seats.preempt_for(tree, holding)
            if asked and isinstance(worker_task_function(worker, key), CoroutineTask):
                until = time() + YIELD_WAIT
                for step in asked:
                    self.yielding[step] = (key, until)
        asyncio.get_running_loop().call_later(PATIENCE, self._queued)


def _watcher(worker: Worker) -> _KeyWatcher:
    # Added synchronously: replacing it would drop the runs it watches.
    w: _KeyWatcher = add_worker_plugin_now(worker, _KeyWatcher.name, _KeyWatcher)
    w.worker = worker
    seceding_waits(worker, _secede_after)  # once per worker; a dict lookup after
    return w


def closing_here(worker: Worker, keys: list[Key]) -> list[Key]:
    """Those of ``keys`` whose coroutine run on ``worker`` will close (or
    closes now) once it hears it was cancelled: it waits at a yield or an
    await, or its body is being closed. Not one whose body runs code
    between two yields (it is closed at its next one, which may never
    come). On the worker's loop."""
    w = worker_plugin(worker, _KeyWatcher.name)
    if w is None:
        return []
    return [k for k in keys if (run := w.runs.get(k)) is not None and (run.closing or not run.stepping)]


def _secede_after() -> float | None:
    """``coro.secede-after``, read at each blocking call of the worker's
    client in a body (``_internals.seceding_waits``)."""
    return _config.get_timedelta("coro.secede-after", allow_none=True)


class _Planned:
    """One step's batches, planned (``_Run._plan``): the graph of their
    ``Delayed`` leaves and the keys to ask for, and per frame with
    collections its yield's annotations, its serialized message and the keys
    of its results."""

    __slots__ = ("graph", "wanted", "annotated", "plans", "computes", "message")

    def __init__(self) -> None:
        self.message: Any = None  # the graph, serialized (a big one)
        self.graph: dict[Key, Any] = {}
        self.wanted: dict[Key, None] = {}
        self.annotated: dict[Key, dict[str, Any]] = {}
        self.plans: list[tuple[Scope[Future], list[int], Plan]] = []
        self.computes: list[tuple[dict[str, Any] | None, Any, list[Key]]] = []


class _Run:
    """One run of a coroutine task on this worker; what features use of it
    is ``extensions.Run``."""

    beside = False  # a run of a task

    def __init__(self, worker: Worker, task: CoroutineTask, active: Active):
        self.worker = worker
        self.key = task.key
        #: The extensions enabled when it started, whose hooks it calls.
        self.active = active
        #: Per extension (by name), what it keeps for this run.
        self.notes: dict[str, Any] = {}
        self.func = task.func
        #: Its function's options, for the extensions that declare them.
        self.options = task.options
        self.name = funcname(task.func)
        self.loop = asyncio.get_running_loop()
        self.lane: Lane | None = None  # the lane of all our steps (lanes.py)
        # While a body awaits an asyncio future of the lane's loop: the future.
        self.awaited: asyncio.Future[Any] | None = None
        self.ctx = contextvars.copy_context()
        self.ctx.run(running_key.set, self.key)
        self.ctx.run(gather_in_task.set, self._gather_in_task)
        # Children computed for an asyncio Task of the body (``_gather_in_task``):
        # the loop tasks waiting for them, cancelled when the run ends.
        self.sides: set[asyncio.Task[Any]] = set()
        self.ended = False
        # While it waits for its children: what it awaits, cancelled when its
        # task stops running here (``changed``), and whether we cancelled it.
        self.waiting: asyncio.Future[Any] | None = None
        self.stopped = False
        self.tramp: Trampoline | None = None  # ``changed`` stops it
        self.root: Scope[Future] = Scope(self.key)
        self.scopes: dict[int, Scope[Future]] = {id(self.root): self.root}
        self.start = time()
        self.seceded = False
        self.idents: dict[str, int] = {}  # ``ident``: names given, per kind
        # Whose share of the threads our steps use, and its weight (``_share``).
        self.tree: str = ""
        self.weight = 1.0
        #: The next step need not wait for a thread of the pool (``Lanes.run``):
        #: set by a feature waking the body for a deadline.
        self.urgent = False
        self.stepping = False  # a step runs on our lane (user code, or a close)
        self.closing = False  # cancelled: closing the body

        self.planned: _Planned | None = None  # the last step's batches, planned on the lane
        # A plain function's name in ``TIMINGS``, until its first step: a
        # step that ends it is the time one of its calls takes here.
        self.timed: str | None = name_of(self.func) if getattr(self.func, "kind", None) == PLAIN else None

    @property
    def trampoline(self) -> Trampoline | None:
        return self.tramp

    @property
    def client(self) -> Client | None:
        """The worker's client our children are submitted through, once made."""
        return self.watcher.client

    # -- helpers -------------------------------------------------------------

    async def _step(self, tramp: Trampoline, fn: Any, *args: Any) -> Any:
        """Call into the trampoline on our lane, in our context: every step
        of a run on the one lane it was pinned to at its first, so its
        bodies keep their thread (and a body parked in ``result()`` can be
        resumed)."""
        lanes = self.watcher.lanes_of(self.worker)
        lane = self.lane
        if lane is None:
            lane = self.lane = lanes.pick()
        urgent, self.urgent = self.urgent, False
        self.stepping = True
        try:
            return await lanes.run(
                lane, self.key, self.start, self._on_lane, tramp, fn, args,
                tree=self.tree, weight=self.weight, pause=self._pause, urgent=urgent,
                over=self.seceded,
            )
        finally:
            self.stepping = False

    def _pause(self) -> None:
        """A step due more of the threads than ours waits for one (``Seats``,
        from its lane's thread, or a task in the worker's ready queue, from
        the loop): give ours back before our next inline call; ``main``
        secedes, so a task waiting for a thread slot may start, and steps
        on once we have a thread again."""
        tramp = self.tramp
        if tramp is not None:
            tramp.stop = True

    def _on_lane(self, tramp: Trampoline, fn: Any, args: tuple[Any, ...]) -> Any:
        """A step, on the lane (a callback of its event loop). After an
        ``Await``: what the body awaited is watched here, on its loop's own
        thread; ``out.obj`` becomes a future that the event loop sets when
        the body may go on (its result: None, or the error to raise at the
        await)."""
        awaited = self.awaited
        if awaited is not None and fn == tramp.close:
            # Cancelled while awaiting: as asyncio cancels what a cancelled
            # task awaits, before the body is closed.
            awaited.cancel()
        self.awaited = None
        timed = self.timed
        if timed is None:
            out = self.ctx.run(fn, *args)
        else:
            self.timed = None
            began = perf_counter()
            out = self.ctx.run(fn, *args)
            if type(out) is Done:
                TIMINGS.ran(timed, perf_counter() - began)
        if (type(out) is Submit or type(out) is Await) and out.batches:
            # Planned here, in the body's thread, as a worker_client task
            # builds its graph in its own: a big one never blocks the loop.
            self.planned = self.ctx.run(self._plan, out.batches, tramp.own_annotations)
        if type(out) is Await:
            # Watched here, on the lane, whose loop runs the awaited future.
            out.obj, self.awaited = watch(out)
        return out

    def _gather_in_task(self, value: Any) -> asyncio.Future[Any]:
        """``await gather(value)`` in an asyncio Task the body made (on the
        lane, ``runtime.aio.in_task``): ``value`` computed as a child of
        ours (``gathered``), awaited on the worker's loop; a future of the
        lane's loop for it. Cancelling that future (the Task cancelled: a
        timeout) releases the child."""
        done = asyncio.run_coroutine_threadsafe(self.side(value), self.loop)
        return asyncio.wrap_future(done)

    async def side(self, value: Any) -> Any:
        """``value`` computed as one child of ours (``gathered``), on our
        worker's loop: for an asyncio Task the body made, and for a body
        run beside us (``runtime.beside``). Released once its value is here,
        or when the awaiting task is cancelled (the scheduler cancels it)."""
        if self.ended:
            # A Task the body made and left running awaits after the body ended.
            raise RuntimeError(
                f"coroutine {self.key!r} has ended: cluster work awaited in an asyncio "
                "Task it made must be awaited before the body returns"
            )
        me = asyncio.current_task()
        assert me is not None
        self.sides.add(me)
        future: Future | None = None
        gathering: asyncio.Future[Any] | None = None
        try:
            client = await self._client()
            annotations = self._child_annotations()
            with submitting_as(self.key), dask.annotate(**annotations):
                future = client.compute(gathered(value))
            gathering = asyncio.ensure_future(client.gather(future, asynchronous=True))
            got = await asyncio.shield(gathering)
            await self.received([got])  # before the child goes
            return got
        finally:
            self.sides.discard(me)
            if gathering is not None and not gathering.done():
                gathering.add_done_callback(_retrieve)  # see _wait
            if future is not None:
                # Not done: the scheduler cancels it (DurablePlugin lets go of
                # a child released with work left), closing its body.
                self._release([future])

    def _alive(self) -> bool:
        return worker_task_state(self.worker, self.key) in _RUNNING_STATES

    def _secede(self) -> None:
        # Not twice: a body may have seceded already (distributed.secede(),
        # worker_client(), a blocking compute; lanes.py).
        if worker_task_state(self.worker, self.key) != "long-running":
            secede_from_loop(self.worker, self.key, time() - self.start)
        self.seceded = True

    async def _client(self) -> Client:
        # One lookup per worker: get_client() also logs a "worker-get-client"
        # event, which is a message to the scheduler on every call.
        client = self.watcher.client
        if client is None or client.status != "running":
            client = get_client()
            if client.status != "running":
                await client  # the worker's client is created lazily, unstarted
            # A client batches its messages to the scheduler over 10 ms
            # (Client._ensure_connected); a coroutine waits for each yield's
            # message, so on the worker's own client use coro.client-batch-interval
            # (default the 2 ms of the worker's stream, Worker.batched_stream).
            # null or 0 leaves distributed's interval alone.
            interval = _config.get_timedelta("coro.client-batch-interval", allow_none=True)
            if "-worker-" in client.id and interval:
                set_batch_interval(client, interval)
            self.watcher.client = client
        # Several workers in one process share the client the first of them
        # made, over that worker's connection pool: when that worker closes
        # (retired, scaled down), the others' coroutines would lose the
        # scheduler's RPCs under them. Once per client; a check after.
        own_scheduler_rpc(client, self.worker)
        return client

    def _share(self) -> tuple[str, float]:
        """Our tree and its weight: our root's, which our parent gave us
        (``TREE``); a root is a tree of its own, weighted by its priority
        (``dask.annotate(priority=...)``, ``lanes.weight_of``). The threads
        of a worker are shared fairly between trees (``lanes.Seats``)."""
        given = worker_task_annotations(self.worker, self.key).get(TREE)
        if given is not None:
            tree, weight = given
            return str(tree), float(weight)
        priority = worker_task_priority(self.worker, self.key)
        return str(self.key), weight_of(-priority[0] if priority else 0)

    def _child_annotations(self) -> dict[str, Any]:
        """Annotations for our children: our key as their ``PARENT`` when
        an enabled extension asks (``Extension.parent``), and what the
        enabled extensions add. (Their span is ours already: we
        run in the context Worker.execute annotates with our task's span, so
        the whole tree lives in the span its root was computed in.)"""
        out: dict[str, Any] = {PARENT: self.key} if self.active.parent else {}
        for ext in self.active.annotations:
            try:
                more = ext.annotations(self)
            except Exception:
                extensions.logger.exception("dask_coro extension %r failed in annotations", ext.name)
                continue
            if more:
                out.update(more)
        out[TREE] = (self.tree, self.weight)
        return out

    # -- the run -------------------------------------------------------------

    async def main(self, args: tuple, kwargs: dict) -> Any:
        state = worker_task_state(self.worker, self.key)
        if state != "executing":
            raise DaskCoroError(
                f"coroutine task {self.key!r} is not executing on this worker "
                f"(state {state!r}); was its key renamed by a "
                "graph optimization? Compute coroutine calls without low-level fusion."
            )
        watcher = self.watcher = _watcher(self.worker)
        self.tree, self.weight = self._share()
        active = self.active
        inline = bool(_config.get("coro.inline.enabled"))
        if inline:
            watcher.inline_started(self.worker)  # raises on a bad setting
        watcher.runs[self.key] = self
        count = inline and active.counts_calls
        idle = watcher.idle_for(self.tree)
        try:
            tramp = trampoline(
                self.name,
                inline=inline,
                idle=idle,
                cancelled=self._cancelled,
                on_ended=self._ended,
                localize=localizer(self._scope_of, self._fetch),
                count=count,
                short=short_call,
            )
        except BaseException:
            watcher.idle_done(self.tree)
            raise
        self.tramp = tramp
        host: Run = self  # for features that start children of their own
        tramp.host = host
        if active.run_started:
            extensions.notify(active.run_started, "run_started", self)
        step: Returned | Raised | None = None
        try:
            given = await self._given([self.key]) if active.supplied else None
            out: Any
            if given:
                # An extension has our outcome already: the body never runs.
                out = Done(given[self.key])
            else:
                out = await self._step(tramp, tramp.start, self.func, args, kwargs, self.root)
            while True:
                if type(out) is Done:
                    step = out.step
                    break
                if type(out) is Stopped and self._alive():
                    # Paused (``_pause``): the stop is not a cancel (``changed``
                    # sets it only when our task no longer runs here, on this
                    # loop, and clears it when it runs again). Let go of our
                    # thread slot too (a task waiting in the ready queue
                    # starts), and go on from the next inline call once the
                    # threads are ours again (``lanes.Seats``).
                    tramp.stop = False
                    if not self.seceded:
                        self._secede()
                    await watcher.yielded(self.key)
                    out = await self._step(tramp, tramp.run)
                    continue
                if type(out) is Stopped or not self._alive():
                    raise Released
                if type(out) is Await:
                    # An async body awaits asyncio: the lane's loop runs it
                    # while we hold no thread, as while we wait for children.
                    if out.batches:
                        await self._submit(out.batches, tramp.own_annotations)
                    if not self.seceded:
                        self._secede()
                    error = await self._around(self._until(asyncio.wrap_future(out.obj)))
                    out = await self._step(tramp, tramp.proceed, error)
                    continue
                assert type(out) is Submit
                if out.batches:
                    await self._submit(out.batches, tramp.own_annotations, now=not out.wait)
                    if not out.wait:
                        watcher.handed(sum(len(p) for _, p in out.batches))
                if not out.wait:
                    out = await self._step(tramp, tramp.run)
                    continue
                if not self.seceded:
                    self._secede()
                out = await self._join(tramp, out.frame)
            if type(step) is Returned:
                return step.value
            raise _deliverable(step.error)  # type: ignore[union-attr]
        except Released:
            logger.debug("coroutine %r cancelled; closing it", self.key)
            self.closing = True
            step = None
            # Let go of our children first, here on the loop: the scheduler
            # cancels their subtrees now, while closing the body below takes
            # a step, which waits for a thread (every thread may be running
            # code no cancel interrupts). The body is closed at its yield and
            # never sees their values.
            self._let_go_of_children()
            for error in await self._step(tramp, tramp.close):
                logger.warning(
                    "coroutine %r raised while closing after cancellation: %r",
                    self.key,
                    error,
                )
            if worker_task_state(self.worker, self.key) in (*_RUNNING_STATES, "resumed"):
                # Asked for again while we were closing: run it again rather than
                # report the cancellation as the task's error.
                raise Reschedule() from None
            # The worker discards the outcome of a cancelled task.
            raise CoroutineCancelledError(f"coroutine {self.key!r} was cancelled") from None
        except asyncio.CancelledError:
            # The worker is closing; no pool to run on. A step may still be
            # running in a pool thread: its bodies are busy, leave them.
            # distributed reschedules the task (Worker._run_task_async: an
            # async task cancelled while its worker closes): a lost worker,
            # whose children a re-run finds, not a parent giving them up.
            # Extensions hear of it first (DurablePlugin keeps the children).
            extensions.notify(active.run_left, "run_left", self)
            try:
                tramp.close()
            except ValueError as e:  # "generator already executing"
                logger.debug("coroutine %r not closed: %r", self.key, e)
            raise
        finally:
            if active.run_ended:
                # Ahead of our own end; with None (cancelled) they do not wait.
                await extensions.notify_async(active.run_ended, "run_ended", self, step)
            self.ended = True
            for side in list(self.sides):
                side.cancel()  # a Task of the body still waits: nobody will read it
            if inline:
                watcher.inline_ended()
            if self.lane is not None:
                watcher.lanes_of(self.worker).unpin(self.lane)
            watcher.idle_done(self.tree)
            if watcher.runs.get(self.key) is self:
                del watcher.runs[self.key]
                # Asked to pause for a queued task, it ended before it could.
                watcher.yielding.pop(str(self.key), None)
            self._let_go_of_children()

    def _let_go_of_children(self) -> None:
        """Release every child our yields hold (on the loop, no step runs)."""
        for scope in self.scopes.values():
            self._release((*scope.end_yield(), *scope.end_body()))
        self.scopes.clear()

    # -- children of a feature's own (a group's), outside any yield ---------

    def ident(self, kind: str) -> Any:
        """A new name under our key for a feature's children (``kind``), in
        the order the body asks: a re-run that asks in the same order gets
        the same names, so its children get the same keys."""
        n = self.idents.get(kind, 0)
        self.idents[kind] = n + 1
        return (self.key, kind, n)

    def scope_here(self, tramp: Trampoline) -> Scope[Future] | None:
        """The scope of our body running here (asked from it, on our lane):
        what a feature's children (a group's) share with its yields, as
        another yield would (``start_children``). None for a body that is
        not ours (run beside us) or has no frame yet (a plain function run
        inline, before its first wait)."""
        if tramp is not self.tramp:
            return None
        frame = tramp.running_frame()
        if frame is None:
            return self.root if not tramp.stack else None
        return self._scope_of(frame)

    async def start_children(
        self, leaves: list[Any], paths: list[Any], ident: Any, annotations: dict[str, Any] | None = None,
        scope: Scope[Future] | None = None,
    ) -> list[Future]:
        """Submit ``leaves`` as children of this run in one message, keyed as
        a yield's leaves at ``paths`` under ``ident`` (see ``ident``), ranked,
        annotated and held for a re-run as a yield's children are, with
        ``annotations`` too; the futures of their values, in order (one each,
        also for two leaves of one key). The caller holds them and lets go
        of them (``release``); the run lets go of nothing of them.

        With ``scope`` (``scope_here``), as a yield of its frame: results its
        earlier yields computed are used, not computed again, and the
        results of ``Delayed`` tasks below the leaves are kept there for its
        later yields, while a lazy value of the body depends on them (the
        leaves' own results are the caller's)."""
        client = await self._client()
        tramp = self.tramp
        own = tramp.own_annotations if tramp is not None else None
        if scope is not None and id(scope) not in self.scopes:
            scope = None  # its body ended: nothing to share with
        # Copies: the body may read the cache on our lane meanwhile (values
        # computed in place); its entries are added on this loop only.
        known = dict(scope.cache.known) if scope is not None else {}
        values = dict(scope.cache.values) if scope is not None else None
        plan = plan_yield(leaves, paths, known, ident, 0, values, own=own)
        compute = plan.compute  # collections, computed together as in a yield
        computed = list(dict.fromkeys(compute.outputs)) if compute is not None else []
        wanted = [k for k in Scope.wanted(plan.outputs, plan.keep, plan.graph) if k not in computed]
        if self.active.supplied and plan.graph:
            await self._given_in(plan.graph, plan.annotations)
        new: dict[Key, Future] = {}
        ann = {**self._child_annotations(), **(annotations or {})}
        with submitting_as(self.key), dask.annotate(**ann):
            if wanted:
                full = annotated_graph(plan.graph, plan.annotations)
                new.update(zip(wanted, client.get(full, wanted, sync=False)))
            if compute is not None:
                message = collections_message(compute.expr, compute.graph, compute.collections)
                new.update(zip(computed, send_serialized(client, message, computed)))
        outputs = set(plan.outputs)
        if scope is not None and plan.keep:
            # Held for the frame's later yields, as ``Scope.record`` holds a
            # yield's: its own Future, released when the layer dies.
            scope.cache.add(
                (layer, {old: k for old, k in mapping.items() if k not in outputs})
                for layer, mapping in plan.layers
            )
            for k in plan.keep:
                if k not in outputs and k in new:
                    scope.held[k] = new.pop(k)
        out: list[Future] = []
        for k in plan.outputs:
            # A key an earlier yield holds, or one of two leaves of one key:
            # a Future of its own, so each is let go of once.
            f = new.pop(k, None)
            out.append(f if f is not None else Future(k, client))
        if new:
            self._release(new.values())  # intermediate keys: the outputs need them, not us
        return out

    def release(self, futures: Any) -> None:
        """Let go of children ``start_children`` made (thread-safe)."""
        self._release(futures)

    async def gather(self, futures: Any) -> Any:
        """``Client.gather`` of ``futures`` (a list, or one) as from a task of
        this worker, on its loop: values in its memory read in place, the
        others straight from the workers holding them (``Client._gather``
        with ``get_worker()`` answering; outside a task it would go through
        the scheduler, ``Scheduler.gather``: two hops more, and a large
        value's bytes twice over the network)."""
        client = (futures[0] if isinstance(futures, list) else futures).client
        with as_worker(self.worker):
            return await client.gather(futures, asynchronous=True)

    async def received(self, values: list[Any]) -> None:
        """``values`` reach the body from the cluster: a yield's results, a
        group's children, a stream's items, what an asyncio Task of the
        body awaited. Tell the extensions (``results_received``: shared
        arrays in them are ours now, tied to our key) before letting go of
        the futures that held them; what a hook raises is raised here."""
        for ext in self.active.results_received:
            await ext.results_received(self, values)

    async def submitting_client(self) -> Client:
        """The worker's client this run submits with (made on first use)."""
        return await self._client()

    def installed(self, name: str) -> bool:
        """Whether the plugins of extension ``name`` are installed on this
        worker's scheduler (installed at first use, before the run starts)."""
        fut = self.watcher.installs.get(name)
        return fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None

    def annotations(self) -> dict[str, Any]:
        """The annotations of this run's own task (on the loop)."""
        return worker_task_annotations(self.worker, self.key)

    def _scope_of(self, frame: Frame) -> Scope[Future]:
        """The frame's scope, made the first time it needs one (on the loop,
        or on the thread pool while the trampoline computes a value in place)."""
        scope = frame.scope
        if scope is None:
            scope = frame.scope = Scope(frame.ident(self.key))
            self.scopes[id(scope)] = scope
        return scope

    def _fetch(self, scope: Scope[Future], keys: list[Key]) -> dict[Key, Any] | None:
        """Results of earlier yields held in this worker's memory, for a value
        computed in place (asked on the thread pool; read on the event loop,
        which owns the worker's data); None if any is not here."""
        renamed = [scope.cache.known[k] for k in keys]
        try:
            found = asyncio.run_coroutine_threadsafe(
                _local_data(self.worker, renamed), self.loop
            ).result(timeout=_FETCH_TIMEOUT)
        except Exception as e:  # the worker is closing, or its loop is stuck
            logger.debug("coroutine %r: local data of %r not read: %r", self.key, renamed, e)
            return None
        return None if found is None else dict(zip(keys, found))

    def _cancelled(self) -> bool:
        # Asked from the thread pool between inline calls: a dict lookup.
        return not self._alive()

    def _ended(self, frame: Frame) -> None:
        """A yield of ``frame`` ended, or its body did (called by the
        trampoline, on the thread pool; ``Future.release`` is thread-safe):
        release its transient futures (cancelling children nobody else holds,
        after an error), kept results no live lazy value depends on, and
        everything of a body that finished."""
        scope = frame.scope
        assert scope is not None
        self._release(scope.end_yield())
        if frame.done and scope is not self.root:
            self.scopes.pop(id(scope), None)
            self._release(scope.end_body())

    def _release(self, futures: Any) -> None:
        """Let go of ``futures`` (thread-safe), then tell the extensions
        (with worker release on, the children among them marked for our
        client are released at once)."""
        futures = list(futures)
        if futures and self.active.released:
            # Both in one callback on the loop: ``Future.release`` queues the
            # client's reference counting there, and an extension's reaction
            # (queued after it) then runs before the loop reads the scheduler's
            # answer to that release. From this thread, the two could be far
            # apart: descheduled between them, the thread would let the
            # scheduler free the keys first.
            try:
                self.loop.call_soon_threadsafe(self._released, futures)
                return
            except RuntimeError:  # the loop closed: the worker is gone
                pass
        for f in futures:
            f.release()

    def _released(self, futures: list[Any]) -> None:
        for f in futures:
            f.release()
        extensions.notify(self.active.released, "released", self, futures)

    def _plan(self, batches: list[tuple[Frame, list[int]]], own: Any) -> _Planned:
        """Plan the remote leaves of each frame (keys derived from the frame's
        place under our key, annotated as the frame's yield was, ``own`` the
        run's own annotations), and serialize each frame's collections as
        ``Client.compute`` would; off the event loop (``_on_lane``). A
        frame whose planning fails gets the error, raised at its yield."""
        planned = _Planned()
        for frame, positions in batches:
            scope = self._scope_of(frame)
            try:
                plan = plan_yield(
                    [frame.leaves[p] for p in positions],
                    [frame.path(p) for p in positions],
                    scope.cache.known,
                    scope.ident,
                    frame.index,
                    scope.cache.values,
                    annotations=frame.ann,
                    own=own,
                )
                if self.key in plan.graph:
                    # A key the user named as our own: we would wait for ourselves.
                    raise ValueError(
                        f"coroutine {self.key!r} yielded a task named {self.key!r}, "
                        "its own key: it would wait for itself; give the child "
                        "another dask_key_name"
                    )
                compute = plan.compute
                if compute is not None:
                    message = collections_message(compute.expr, compute.graph, compute.collections)
                    planned.computes.append((frame.ann, message, list(dict.fromkeys(compute.outputs))))
            except Exception as e:  # raised at the yield when the frame waits
                scope.error = e
                continue
            planned.graph.update(plan.graph)
            planned.annotated.update(plan.annotations)
            planned.wanted.update(dict.fromkeys(Scope.wanted(plan.outputs, plan.keep, plan.graph)))
            planned.plans.append((scope, positions, plan))
        if len(planned.graph) > _SERIALIZE_HERE:
            # A big graph: serialized here too, not on the loop.
            full = annotated_graph(planned.graph, planned.annotated)
            planned.message = serialized_graph(full)
        return planned

    async def _submit(self, batches: list[tuple[Frame, list[int]]], own: Any,
                      now: bool = False) -> None:
        """Submit what the last step planned (``_plan``) in one message, and
        each frame's collections in one message of their own, as
        ``Client.compute`` sends them; with ``now`` (calls handed out to idle
        threads, which wait for them) sent on the loop's next turn, not at
        the end of the client's batch."""
        planned, self.planned = self.planned, None
        if planned is None:
            planned = self._plan(batches, own)
        if self.active.supplied and planned.graph:
            await self._supply(planned)
        client = await self._client()
        graph, wanted, annotated = planned.graph, planned.wanted, planned.annotated
        new: dict[Key, Future] = {}
        if wanted or planned.computes:
            # What the extensions submit for the graph to depend on (shared
            # arrays the body passes on as values, as keys of this worker).
            passed_on: list[Future] = []
            try:
                for ext in self.active.submitting:
                    passed_on += await ext.submitting(self, client, graph)
            except Exception as e:  # nothing sent: raised at the yields, as a planning error
                for scope, _, _ in planned.plans:
                    scope.error = e
                return
            if passed_on:
                planned.message = None  # the graph changed since the lane serialized it
            # Children get priority over unrelated queued work: the scheduler
            # ranks a graph by its submitting task.
            annotations = self._child_annotations()
            with submitting_as(self.key), dask.annotate(**annotations):
                if planned.message is not None:
                    futures = send_serialized(client, planned.message, list(wanted))
                    new.update(zip(wanted, futures))
                elif wanted:
                    full = annotated_graph(graph, annotated)
                    if now:
                        # Calls handed out to idle threads: a few tasks, in the
                        # order they were handed out (the oldest, biggest, first);
                        # the scheduler need not order them, and the message goes
                        # at once.
                        futures = get_in_order(client, full, list(wanted))
                    else:
                        futures = client.get(full, list(wanted), sync=False)
                    new.update(zip(wanted, futures))
                for ann, message, outputs in planned.computes:
                    # The yield's annotations for every task of its
                    # collections, under those dask gives them, as
                    # Client.compute under dask.annotate.
                    with dask.annotate(**(ann or {})):
                        new.update(zip(outputs, send_serialized(client, message, outputs)))
            if now:
                flush_client_stream(client)
            del passed_on  # released after the graph: its tasks hold them now
        for scope, positions, plan in planned.plans:
            # Delayed results are held until no live lazy value needs them; the
            # rest (finalized collections) only until the body has them.
            scope.record(positions, plan.outputs, plan.keep, plan.layers, new)

    async def _given(self, keys: list[Key]) -> dict[Key, Returned | Raised]:
        """The outcomes the extensions have already for some of ``keys``
        (their ``supplied`` hook); one that raises is logged, and gives none."""
        out: dict[Key, Returned | Raised] = {}
        for ext in self.active.supplied:
            try:
                given = await ext.supplied(self, keys)
            except Exception:
                extensions.logger.exception("dask_coro extension %r failed in supplied", ext.name)
                continue
            for key, outcome in given.items():
                if key in keys and key not in out and type(outcome) in (Returned, Raised):
                    out[key] = outcome
        return out

    async def _supply(self, planned: _Planned) -> None:
        """Send the tasks of ``planned`` whose outcome an extension has already
        as that value (or a task raising that error), not as their tasks; the
        scheduler culls the tasks only they needed and nobody asks for."""
        if await self._given_in(planned.graph, planned.annotated):
            planned.message = None  # the graph changed since the lane serialized it

    async def _given_in(self, graph: dict[Key, Any], annotated: dict[Key, dict[str, Any]]) -> bool:
        """Replace the tasks of ``graph`` whose outcome an extension has
        (``_given``) by it, placed on this worker (``annotated``: each
        task's annotations); whether any was."""
        given = await self._given(list(graph))
        here = {"workers": [self.worker.address], "allow_other_workers": True}
        for key, outcome in given.items():
            annotated[key] = {**annotated.get(key, {}), **here}
            if type(outcome) is Returned:
                graph[key] = DataNode(key, outcome.value)
            else:
                graph[key] = Task(key, _reraise, DataNode(None, outcome.error))  # type: ignore[union-attr]
        return bool(given)

    async def _join(self, tramp: Trampoline, frame: Frame) -> Outcome:
        """Wait for the remote leaves of ``frame`` (the top one) and resume it
        with their results, or raise the first error at its yield."""
        scope = frame.scope
        assert scope is not None
        try:
            if scope.error is not None:
                raise scope.error
            client = await self._client()
            results = await self._around(self._wait(client, scope.handles(frame.remote)))
            # Before the children go; what it raises is raised at the yield.
            await self.received(results)
        except Released:
            raise
        except _NOT_A_CHILD_S:
            raise  # this worker is closing (or its loop is being stopped)
        except BaseException as e:
            # A child's error, a BaseException subclass too (as inline and
            # without a cluster); the original of one a coroutine child could
            # only deliver wrapped.
            if type(e) is BaseExceptionError:
                e = e.error
            return await self._step(tramp, tramp.throw, e)
        return await self._step(tramp, tramp.resume, results)

    def changed(self) -> None:
        """Our task changed state on this worker (a worker plugin's
        transition hook, on the event loop): if it no longer runs, stop
        waiting, and stop the trampoline before its next inline call."""
        tramp = self.tramp
        if self._alive():
            if tramp is not None:
                # Asked for again before the loop read the stop (cancelled,
                # then back to executing): go on, as if never stopped.
                tramp.stop = False
            return
        if tramp is not None:
            tramp.stop = True  # read by the pool thread before each call
        waiting = self.waiting
        if waiting is not None and not waiting.done():
            self.stopped = True
            waiting.cancel()

    async def _wait(self, client: Client, futures: list[Future]) -> list[Any]:
        """The results of ``futures``; raises the first error, or ``Released``.

        ``changed`` cancels what we await when our task stops running here.
        No event or ``asyncio.wait`` per wait, and for one child no gather
        while it runs: a waiting coroutine's memory is mostly what its wait
        holds."""
        if not futures:
            return []
        if len(futures) == 1 and not futures[0].done():
            # One child (``x = yield f(...)``, the commonest wait): wait on its
            # client-side state, then gather it (from this worker's memory if
            # it is here); a key lost meanwhile is pending again, and gather
            # waits for it.
            await self._until(future_settled(futures[0]))
        # Several: gather raises the first error as soon as it comes.
        gathering = asyncio.ensure_future(client.gather(futures, asynchronous=True))
        try:
            result: list[Any] = await self._until(asyncio.shield(gathering))
            return result
        finally:
            if not gathering.done():
                # Cancelling Client._gather mid-way orphans its inner tasks, which
                # then log "Task exception was never retrieved"; it ends on its
                # own once our futures are released, so only retrieve its end.
                gathering.add_done_callback(_retrieve)

    async def _around(self, waiting: Any) -> Any:
        """Await ``waiting`` inside the ``around_wait`` hooks of the
        extensions (the first outermost): a resource lent while we wait,
        taken back before the body goes on."""
        hooks = self.active.around_wait
        if not hooks:
            return await waiting
        for ext in reversed(hooks):
            waiting = ext.around_wait(self, waiting)
        return await waiting

    async def _until(self, waiting: asyncio.Future[Any]) -> Any:
        """Await ``waiting``; ``Released`` if our task stops running here
        meanwhile (``changed`` cancels it)."""
        if not self._alive():
            waiting.cancel()
            raise Released
        self.waiting = waiting
        try:
            return await waiting
        except asyncio.CancelledError:
            if self.stopped:
                raise Released from None
            waiting.cancel()
            raise  # the worker is closing
        finally:
            self.waiting = None
            self.stopped = False

    until = _until  # what ``extensions.Run`` calls it


def _installing(fut: asyncio.Future[None] | None, worker: Worker, ext: Extension) -> asyncio.Future[None]:
    """``fut``, the install of an extension's plugins, unless it failed (or
    there is none yet): then a new one."""
    if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
        fut = asyncio.ensure_future(_install(worker, ext))
        fut.add_done_callback(_retrieve)  # raised where it is awaited
    return fut


#: Not a child's error when ``_join`` sees it: distributed passes these on
#: (``_run_task_async`` re-raises SystemExit and KeyboardInterrupt) and
#: cancels with the first.
_NOT_A_CHILD_S = (asyncio.CancelledError, SystemExit, KeyboardInterrupt)


def _deliverable(error: BaseException) -> BaseException:
    """The error a coroutine task ends with for its body's ``error``: as is,
    but for a BaseException a client could not receive (see
    ``BaseExceptionError``)."""
    if isinstance(error, Exception) or (
        isinstance(error, _NOT_A_CHILD_S) and not isinstance(error, asyncio.CancelledError)
    ):
        # The body's own CancelledError is wrapped: raised as is, the worker
        # would take it for the task's cancellation (``main`` treats one as
        # the worker closing; ``_run_task_async`` reschedules the task).
        return error
    out = BaseExceptionError(
        f"coroutine raised {error!r}, a BaseException that is not an Exception: a "
        "distributed client waits forever on a task that ended with one, so the "
        "task ends with this error; .error (and __cause__) is the original",
        error,
    )
    out.__cause__ = error
    return out


async def _install(worker: Worker, ext: Extension) -> None:
    """Install an extension's scheduler plugin, and its worker plugin on
    every worker, from a worker (idempotent).

    What stops it fails the task that needs it, with an error that says what
    to do: a ``ValueError`` (a setting the plugin read on the scheduler when
    it started; ``_config``'s messages name it and its value) stays one,
    anything else (say, a scheduler that cannot import dask_coro) becomes a
    ``DaskCoroError``. distributed would only log an error raised in a
    plugin's hook (``Scheduler.register_scheduler_plugin`` does raise to the
    caller)."""
    for kind, plugin, register in (
        ("scheduler", ext.scheduler_plugin(), worker.scheduler.register_scheduler_plugin),
        # The scheduler adds it to every worker (``Scheduler.register_worker_plugin``).
        ("worker", ext.worker_plugin(), worker.scheduler.register_worker_plugin),
    ):
        if plugin is None:
            continue
        try:
            await register(plugin=dumps(plugin), name=plugin.name, idempotent=True)
        except Exception as e:
            turn_off = f"set {ext.setting}: false" if ext.setting else "use no coroutine"
            logger.warning(
                "dask_coro cannot install %s from worker %s: %r; coroutine tasks "
                "fail until it can be (or %s)",
                plugin.name,
                worker.address,
                e,
                turn_off,
            )
            if isinstance(e, ValueError):
                raise ValueError(f"{e} (on the scheduler, starting dask_coro's {plugin.name} plugin)") from e
            raise DaskCoroError(
                f"dask_coro cannot install its {kind} plugin {plugin.name!r} from "
                f"worker {worker.address}: {e!r}. The plugin {ext.what}; check that the "
                f"scheduler can import dask_coro, the same version as the workers, or {turn_off}"
            ) from e


async def _local_data(worker: Worker, keys: list[Key]) -> list[Any] | None:
    return local_data(worker, keys)


_FETCH_TIMEOUT = 5.0  # s; past it a value is computed as tasks, as before


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
