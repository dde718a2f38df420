"""Scheduler side of inline execution: telling workers that run coroutine
calls inline when threads are idle, so they hand unstarted calls out as tasks.

Two ways, chosen on each worker by ``coro.inline.stealing``:

* ``push`` (the default): a worker that starts running calls inline
  *subscribes* on its own stream (``SUBSCRIBE``, once its handler of
  ``IDLE`` is registered: an op with no handler closes a stream). The plugin
  looks at the idle threads only after an *idle event* (a task leaves
  ``processing``, a task secedes, a queued or unrunnable task goes, a worker
  joins or runs again, a worker subscribes; and, while threads were idle at
  the last look with no worker to tell, a task starts on a subscribed worker:
  a new tree there frees no thread until it ends), at most once per ``coro.inline.interval`` (a start at most once per
  interval besides; a look
  that only task starts, or the look again after a push, asked for and that
  finds no idle thread does not count), and when some are idle it sends ``{op: IDLE, n}``
  to as few subscribers as it takes: round robin, one idle thread each (the
  ``n`` split among them when there are more threads than subscribers), so one
  freed thread makes one worker hand out one task, whatever the number of
  workers. While threads stay idle (the chosen workers had nothing to hand out)
  it looks again, backing off to once a second. The worker unsubscribes
  (``UNSUBSCRIBE``) a second after its last inline run ended. The scheduler's
  cost grows with idle events, not with workers times time.
* ``poll``: each worker running inline asks ``IDLE`` (an RPC) every
  ``coro.inline.interval``; kept to compare against, and for workers of
  earlier versions.

``counts`` says what the plugin did (messages sent and received, checks).
"""

from __future__ import annotations

import asyncio
from time import monotonic
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .. import _config
from .._internals.distributed.core import add_handlers, wrap_stream_handler
from .._internals.distributed.scheduler import idle_by_worker, idle_threads, send_to_worker

NAME = "dask-coro-inline"
IDLE = "dask_coro_idle"  # the push to a worker, and the RPC of poll mode
SUBSCRIBE = "dask-coro-inline-subscribe"
UNSUBSCRIBE = "dask-coro-inline-unsubscribe"
#: A worker's threads that steps of seceded runs hold (``lanes.Seats.over``):
#: distributed counts a seceded task as holding none.
BUSY = "dask-coro-inline-busy"
MODES = ("push", "poll")

#: Longest wait between two looks at threads that stay idle with no new event.
MAX_BACKOFF = 1.0

#: Transitions out of these states may leave a thread idle: a task done or
#: released from a worker, a queued or unrunnable task gone (idle threads are
#: counted less the tasks waiting for one).
_FREEING = frozenset({"processing", "queued", "no-worker"})


class InlinePlugin(SchedulerPlugin):
    """Tells workers running coroutines inline when threads are idle.

    Installed by the first worker that runs a coroutine inline (one round
    trip per worker), by ``client.register_plugin(InlinePlugin())`` or by
    ``dask scheduler --preload dask_coro``; installing it again is a no-op.
    ``coro.inline.interval`` is read when it starts."""

    name = NAME
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None
        self.interval = 0.0
        self.order: list[str] = []  # subscribed workers, round robin
        self.subscribed: set[str] = set()
        self.cursor = 0
        #: Per worker, the threads steps of its seceded runs hold (``BUSY``).
        self.busy: dict[str, int] = {}
        #: What the plugin did: ``subscribe``/``unsubscribe`` (stream messages
        #: received), ``push`` (messages sent), ``pushed`` (idle threads they
        #: announced), ``poll`` (RPCs answered), ``event`` (idle events seen
        #: while a worker was subscribed), ``check`` (looks at the idle threads).
        self.counts = dict.fromkeys(
            ("subscribe", "unsubscribe", "push", "pushed", "poll", "event", "check"), 0
        )
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # when the timer fires
        self._last = -float("inf")  # when the last check ran
        self._last_start = -float("inf")  # when the last look a start asked for ran
        self._backoff = 0.0
        self._left = 0  # idle threads at the last check
        self._counted = False  # the next check was asked for by more than task starts
        #: The last look found threads idle and told no worker (none had a task
        #: running): a task that starts on a subscribed worker may give them work.
        self._stranded = False

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.interval = _config.get_timedelta("coro.inline.interval")
        self._backoff = self.interval
        add_handlers(
            scheduler,
            rpc={IDLE: self.handle_idle},
            stream={
                SUBSCRIBE: self.handle_subscribe,
                UNSUBSCRIBE: self.handle_unsubscribe,
                BUSY: self.handle_busy,
            },
        )
        for op in ("long-running", "worker-status-change"):
            wrap_stream_handler(scheduler, op, self._then_event, "_dask_coro_inline")

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- poll mode -------------------------------------------------------------

    def handle_idle(self) -> int:
        self.counts["poll"] += 1
        return idle_threads(self.scheduler, self.busy)

    # -- push mode: subscriptions -------------------------------------------------

    def handle_subscribe(self, worker: str, **kwargs: Any) -> None:
        self.counts["subscribe"] += 1
        if worker in self.subscribed or worker not in self.scheduler.workers:
            return
        self.subscribed.add(worker)
        self.order.append(worker)
        self._event()  # threads may be idle already

    def handle_busy(self, worker: str, n: int = 0, **kwargs: Any) -> None:
        """``worker``'s seceded runs hold ``n`` of its threads with their
        steps: a thread distributed counts free is not (a run that waited
        and resumed, or that paused for another tree, secedes for good).
        Counted free, it made other runs hand calls out to threads that
        would only queue them behind those steps."""
        if worker not in self.scheduler.workers:
            return
        before = self.busy.get(worker, 0)
        if n > 0:
            self.busy[worker] = n
        else:
            self.busy.pop(worker, None)
        if n < before:
            self._event()

    def handle_unsubscribe(self, worker: str, **kwargs: Any) -> None:
        self.counts["unsubscribe"] += 1
        self._drop(worker)

    def _drop(self, worker: str) -> None:
        if worker in self.subscribed:
            self.subscribed.discard(worker)
            i = self.order.index(worker)
            del self.order[i]
            if i < self.cursor:
                self.cursor -= 1

    # -- idle events -------------------------------------------------------------

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        # Every transition of every task: keep it to a few tests.
        if not self.subscribed:
            return
        if finish == "processing":
            if self._stranded:
                # Threads were idle at the last look, with no worker to tell,
                # and a task starts on a subscribed worker: it may be a
                # coroutine that runs calls inline and can give them work (a
                # worker stays subscribed between runs, so a new tree sends
                # nothing of its own, and no thread may free until it ends).
                # Not after a push: the calls it handed out are on their way,
                # and threads still idle are looked at again anyway.
                ts = self.scheduler.tasks.get(key)
                ws = None if ts is None else ts.processing_on
                if ws is not None and ws.address in self.subscribed:
                    self._event(start=True)
        elif start in _FREEING:
            self._event()

    def add_worker(self, scheduler: Any, worker: str) -> None:
        self._event()

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self._drop(worker)
        self.busy.pop(worker, None)

    def _then_event(self, handler: Any) -> Any:
        def wrapped(**kwargs: Any) -> Any:
            out = handler(**kwargs)
            self._event()
            return out

        return wrapped

    def _event(self, start: bool = False) -> None:
        """Something may have left a thread idle (or, with ``start``, a task
        that may give idle threads work started): look, once the current
        transitions are done (a queued task may take the thread at once), and
        no sooner than ``interval`` after the last look that counts (see
        ``_check``). A start is looked at no sooner than ``interval`` after
        the last start looked at: its own limit, as the looks at the threads
        the last tree left idle (which told nobody) come just before it, and
        would hold the new tree's first hand-out back by up to an interval."""
        if not self.subscribed:
            return
        self.counts["event"] += 1
        now = monotonic()
        if start:
            delay = max(0.0, self._last_start + self.interval - now)
            self._last_start = now + delay
        else:
            self._counted = True
            delay = max(0.0, self._last + self.interval - now)
        self._look(delay)

    def _look(self, delay: float) -> None:
        due = monotonic() + delay
        if self._timer is not None:
            if self._due <= due:
                return
            self._timer.cancel()
        self._due = due
        self._timer = asyncio.get_running_loop().call_later(delay, self._check)

    def _check(self) -> None:
        self._timer = None
        if not self.subscribed:
            return
        counted, self._counted = self._counted, False
        self.counts["check"] += 1
        at = idle_by_worker(self.scheduler, self.busy)
        n = idle_threads(self.scheduler, at=at)
        if n > 0 or counted:
            self._last = monotonic()
        # else: only tasks started since the last look, and no thread is idle
        # now (the common case: the thief of the last push started). Such a
        # look does not delay the next: a thread that frees soon after is
        # looked at without waiting an interval. They are as few as the looks
        # that found idle threads (one needs the last look to have found some
        # and told nobody).
        if n <= 0:
            self._backoff = self.interval
            self._left = 0
            self._stranded = False
            return
        # Threads are still idle that the last push announced: the workers it
        # went to had nothing to hand out, or their tasks are on their way.
        # Look again later, backing off while nothing changes.
        if n < self._left:
            self._backoff = self.interval
        elif self._left:
            self._backoff = min(MAX_BACKOFF, max(self._backoff, self.interval, 0.001) * 2)
        self._left = n
        self._stranded = not self._push(n, at)
        # The look again, below, counts only if it finds threads still idle
        # (then it pushes again). One that finds none (the thieves started:
        # the common case) must not delay the look at the next thread that
        # frees by an interval: that thread would idle for up to 20 ms.
        # Such looks are at most one per push.
        self._look(self._backoff)

    def _push(self, n: int, at: dict[str, int] | None = None) -> int:
        """Announce ``n`` idle threads to the next subscribers round robin,
        one thread each (more each if there are fewer subscribers than
        threads), with where they are (``at``: a worker corrects its own
        count, which it knows better, ``_KeyWatcher._pushed``). Only those running a task that has not seceded, if any: a
        worker whose coroutines all wait on the cluster promoted every
        unstarted call already (and its own thread is among the idle ones);
        else those, as a coroutine that resumed may run calls inline again.
        Never one with no task processing (its inline runs ended: it
        unsubscribes soon)."""
        order = self.order
        workers = self.scheduler.workers
        k = len(order)
        chosen: list[str] = []
        waiting: list[str] = []
        seen = 0
        while seen < k and len(chosen) < n:
            address = order[(self.cursor + seen) % k]
            seen += 1
            ws = workers.get(address)
            if ws is None or not ws.processing:
                continue
            if len(ws.processing) > len(ws.long_running):
                chosen.append(address)
            else:
                waiting.append(address)
        chosen = chosen or waiting[:n]
        if not chosen:
            return 0
        self.cursor = (self.cursor + seen) % k
        each, extra = divmod(n, len(chosen))
        sent = 0
        for i, address in enumerate(chosen):
            share = each + (i < extra)
            # Sent now, not at the end of the stream's 5 ms batch: a thread
            # idles until the worker hears of it (the push that follows a
            # tree's start, right after its compute-task, waited out the batch).
            msg: dict[str, Any] = {"op": IDLE, "n": share}
            if at and address in at:
                msg["at"] = at
            if send_to_worker(self.scheduler, address, msg, now=True):
                self.counts["push"] += 1
                self.counts["pushed"] += share
                sent += 1
        return sent
