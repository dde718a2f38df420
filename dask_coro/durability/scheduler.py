"""Scheduler side of durability: ``DurablePlugin``.

Children are held from their submission as a ``Variable`` or ``Queue`` holds
keys: on behalf of a client of the plugin's own (``client_desires_keys``),
here one per parent, ``dask-coro-held-<parent>``, so they outlive the
worker's client that submitted them, finished or still running: a child
running on another worker when its parent's worker dies runs on, once, for
the re-run. When the parent ends (memory, erred, forgotten) its children are
let go of, on the next turn of the event loop (not inside a transition).

What the worker's client lets go of (its ``client-releases-keys``, wrapped
here) tells the rest. A child let go of while it has work left (a sibling
failed, the yield was cancelled) is let go of here too, and so cancelled as
in plain Dask. A child let go of in memory was consumed: only the hold keeps
it, so its bytes count against its worker's budget
(``coro.durability.hold-bytes``, ``budget.py``), over which the oldest
consumed children there are let go of. A worker client that dies with its
worker sends nothing (``Scheduler.remove_client`` releases its keys
directly), so what its coroutine had not consumed stays held, uncharged: it
was in memory for that coroutine already. Nor is a release by a run of the
parent that has left its worker (a retired worker's client letting go as the
worker closes, after ``retire_workers`` moved the parent): the book counts
the parent's runs, and only what the current run asked for can be given up
or consumed by it.

A coroutine lost with its worker while it waited on its children was not
running code that could have killed the worker, so it should not count
toward ``distributed.scheduler.allowed-failures``. ``Scheduler.remove_worker``
counts every task that was processing on the lost worker before any plugin
hears of it, so the count is given ahead: while a parent has children with
work left (it waits), its ``suspicious`` count is one lower, and the lost
worker's increment takes that credit instead of failing it.
"""

from __future__ import annotations

import asyncio
import logging
from time import time
from typing import Any

from dask.typing import Key
from distributed.diagnostics.plugin import SchedulerPlugin

from .. import _config
from .._internals.distributed.core import add_handlers, wrap_stream_handler
from .._internals.distributed.scheduler import adjust_suspicion, drop_client_state
from ..runtime.extensions import children_by_parent
from .book import UNFINISHED, HoldBook
from .budget import HoldBudget
from .order import DeliveryLog

logger = logging.getLogger("dask_coro")

NAME = "dask-coro-durable"
#: On a worker's client stream, ahead of the releases of a run its closing
#: worker cancelled: {"op": RUN_LEFT, "key": parent, "address": worker}.
RUN_LEFT = "dask-coro-run-left"
#: A group of a parent delivered a child, or opened with a deadline (a
#: worker's client stream): {"op": GROUP_LOG, "key": parent, "group": n,
#: "index": i or None, "deadline": t or None}. ``GROUP_REPLAY`` (an RPC) gives
#: a re-run what to replay (``order.DeliveryLog``).
GROUP_LOG = "dask-coro-group-log"
GROUP_REPLAY = "dask_coro_group_replay"
_ENDED = ("memory", "erred", "forgotten")
_DONE = ("memory", "erred")
#: The scheduler's client of ``distributed.fire_and_forget`` (``Scheduler.__init__``).
FIRE_AND_FORGET = "fire-and-forget"


def holder(parent: Key) -> str:
    """The scheduler-side client that holds ``parent``'s children."""
    return f"dask-coro-held-{parent!r}"


class DurablePlugin(SchedulerPlugin):
    """Installed by the first coroutine that submits children on each worker
    (when ``coro.durability.hold-children`` is on), by
    ``client.register_plugin(DurablePlugin())`` or by
    ``dask scheduler --preload dask_coro``; installing it again is a no-op."""

    name = NAME
    idempotent = True

    def __init__(self) -> None:
        # Read (and checked: a bad value fails the coroutine that installs
        # the plugin, naming the setting) where the plugin is made.
        self.hold_bytes = _config.get_size_or_fraction("coro.durability.hold-bytes")
        self.book = HoldBook()
        self.budget = HoldBudget(self._limit)
        # children let go of, and why; run-left: let go of by a run that left its
        # worker, kept for the re-run
        self.counts = {"budget": 0, "given-up": 0, "run-left": 0}
        self.where: dict[Key, str] = {}  # parent -> address of the worker running it
        self.left: dict[Key, str] = {}  # parent -> the worker it last left
        self.credited: set[Key] = set()  # waiting parents, their suspicion given ahead
        self.forgiven = 0  # how many lost waiting parents were not counted
        self.scheduler: Any = None
        self.deliveries = DeliveryLog()

    def keeps(self, key: Key, copy: bool) -> bool:
        """A child held for its coroutine stays until the coroutine ends (or
        the budget lets go of it); a copy of it is no hold's business, as
        it is no client's (``DurableExtension.keeper``: worker release asks)."""
        return not copy and key in self.book.parent_of

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        wrap_stream_handler(scheduler, "client-releases-keys", self._then_released, "_dask_coro_durable")
        wrap_stream_handler(scheduler, "cancel-keys", self._cancelling_first, "_dask_coro_durable")
        wrap_stream_handler(scheduler, "client-desires-keys", self._late_fire_and_forget, "_dask_coro_durable")
        add_handlers(
            scheduler,
            rpc={GROUP_REPLAY: self._group_replay},
            stream={RUN_LEFT: self._run_left, GROUP_LOG: self._group_log},
        )

    def update_graph(
        self,
        scheduler: Any,
        *,
        keys: Any = (),
        annotations: dict[str, dict[Key, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        book, budget = self.book, self.budget
        for k in keys or ():
            # A re-run parent asks for a child again: asked for by its current
            # run, and not consumed.
            book.ask(k)
            budget.discharge(k)
        # Only what the parent asks for is held: a re-run finds its results,
        # and the tasks below them (a collection's chunks) go as they would
        # for client.compute, once their dependents ran.
        asked = keys if isinstance(keys, (set, frozenset, dict)) else set(keys or ())
        for parent, children in children_by_parent(annotations).items():
            ts = scheduler.tasks.get(parent)
            if ts is None or ts.state in _ENDED:
                continue  # a parent that ended meanwhile holds nothing
            held = self.book.adopt(
                parent, [k for k in children if k in asked and k in scheduler.tasks], self._state
            )
            if held:
                # Held before this graph's transitions run: from now on the
                # worker's client is not their only holder.
                scheduler.client_desires_keys(keys=held, client=holder(parent))
            if ts.processing_on is not None:
                self.where[parent] = ts.processing_on.address
            self._credit(parent)

    def transition(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        parent = self.book.moved(key, start, finish)
        if parent is not None:
            self._credit(parent)
        if start == "memory" and finish == "released":
            # Its data died with a worker: held no more, so that it is not
            # kept computing for nobody (a re-run yielding it asks anew). The
            # transitions reporting the loss have already recommended it
            # "waiting" (transition_memory_released: it was wanted), so it may
            # be sent to a worker once before this release gets there.
            parent = self.book.lost(key)
            self.budget.discharge(key)
            if parent is not None:
                asyncio.get_running_loop().call_soon(self._let_go_of, parent, key)
        if finish == "memory":
            parent = self.book.finished(key)
            if parent is not None:
                # Held now, before the worker's client lets go of it.
                self.scheduler.client_desires_keys(keys=[key], client=holder(parent))
        if self.book.is_parent(key):
            if start == "processing" and key in self.where:
                # Where it last ran: remove_worker moves a lost worker's
                # tasks on before plugins hear of the loss.
                self.left[key] = self.where.pop(key)
            if start == "processing" and finish not in _ENDED:
                # Its run is over (its worker was lost or retired, or it was
                # rescheduled): what that run's client lets go of from now on
                # (a retiring worker's, as it closes) is no choice of the
                # parent's. Held, uncharged, as after a kill.
                self.book.left(key)
            if finish == "processing":
                ws = self.scheduler.tasks[key].processing_on
                if ws is not None:
                    self.where[key] = ws.address
            elif finish in _ENDED:
                self.deliveries.end(key)
                self.where.pop(key, None)
                self.left.pop(key, None)
                self._uncredit(key)
                children = self.book.end(key)
                for k in children:
                    self.budget.discharge(k)
                asyncio.get_running_loop().call_soon(self._let_go, key, children)
        if finish == "forgotten":
            self.deliveries.end(key)
            self.book.forget(key)
            self.budget.discharge(key)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        # Consumed children whose data lived there alone were discharged as
        # they went memory -> released; the others (copied away by
        # retire_workers, or replicas) count on a worker that holds them now.
        # Scheduler.remove_worker calls this hook after it removed the
        # worker from each task's who_has.
        for w in self.budget.left(worker, self._where_now):
            asyncio.get_running_loop().call_soon(self._enforce, w)
        for parent, address in list(self.left.items()):
            if address != worker:
                continue
            del self.left[parent]
            if parent in self.credited:
                # The lost worker's count took the credit: not counted.
                self.credited.discard(parent)
                ts = scheduler.tasks.get(parent)
                if ts is not None:
                    adjust_suspicion(ts, 0, prefix=-1)
                self.forgiven += 1
                self._credit(parent)  # still waiting on children of its own

    # -- what the worker's client let go of ------------------------------------

    def _run_left(self, key: Key, address: str, **kwargs: Any) -> None:
        """The run of ``key`` on worker ``address`` was cancelled as that
        worker closes (``Worker.close`` not through ``retire_workers``, which
        moves the parent first): its client's releases that follow on the same
        stream are not the parent's choice. Nothing to do if the parent moved
        on already (its transition counted the run)."""
        ts = self.scheduler.tasks.get(key)
        if ts is not None and ts.processing_on is not None and ts.processing_on.address == address:
            self.book.left(key)

    def _group_log(self, key: Key, group: int, index: int | None = None,
                   deadline: float | None = None, **kwargs: Any) -> None:
        ts = self.scheduler.tasks.get(key)
        if ts is None or ts.state in _ENDED:
            return  # a run that lost its task (cancelled): nothing to replay
        self.deliveries.record(key, group, index, deadline)

    def _group_replay(self, key: Key, group: int, **kwargs: Any) -> dict[str, Any]:
        return self.deliveries.get(key, group)

    def _then_released(self, handler: Any) -> Any:
        def client_releases_keys(**kwargs: Any) -> Any:
            result = handler(**kwargs)
            try:
                self._released(kwargs.get("keys") or ())
            except Exception:  # a hook's error must not close the client's stream
                logger.exception("dask_coro: DurablePlugin failed on client-releases-keys")
            return result

        return client_releases_keys

    def _late_fire_and_forget(self, handler: Any) -> Any:
        """``distributed.fire_and_forget`` asks for a key that has already
        finished: let it go for the fire-and-forget client at once, as the
        key's transition to memory (or to erred) would have, had the ask come
        first (``SchedulerState._transition_processing_memory``). The ask goes
        on the client's batched stream after the graph, so a task that runs
        within one batch interval (a worker's client: 2 ms here, 10 ms by
        default) can finish before it: the scheduler would then keep the key
        for that client for ever."""

        def client_desires_keys(**kwargs: Any) -> Any:
            result = handler(**kwargs)
            if kwargs.get("client") == FIRE_AND_FORGET:
                try:
                    tasks = self.scheduler.tasks
                    done = [k for k in kwargs.get("keys") or () if (ts := tasks.get(k)) is not None and ts.state in _DONE]
                    if done:
                        self.scheduler.client_releases_keys(
                            keys=done, client=FIRE_AND_FORGET, stimulus_id=f"dask-coro-late-fire-and-forget-{time()}"
                        )
                except Exception:  # a hook's error must not close the client's stream
                    logger.exception("dask_coro: DurablePlugin failed on client-desires-keys")
            return result

        return client_desires_keys

    def _cancelling_first(self, handler: Any) -> Any:
        def cancel_keys(**kwargs: Any) -> Any:
            try:
                self._cancelling(kwargs.get("keys") or (), kwargs.get("client"), kwargs.get("force"))
            except Exception:  # a hook's error must not close the client's stream
                logger.exception("dask_coro: DurablePlugin failed on cancel-keys")
            return handler(**kwargs)

        return cancel_keys

    def _cancelling(self, keys: Any, client: str | None, force: bool | None) -> None:
        """A client is about to cancel ``keys`` (``Scheduler.stimulus_cancel``).
        distributed cancels a key, and then its dependents, only when that
        client is the key's one wanter (``force``: whoever wants it). The hold
        is no wanter of the user's: a held child that would be cancelled
        without it is let go of first, so a body waiting on a cancelled
        Future (``yield f``: a child of ours that depends on f) gets
        ``FutureCancelledError`` at its yield, as a ``worker_client`` task
        waiting on f does, instead of f's value."""
        s = self.scheduler
        if force or client is None or client not in s.clients:
            return
        book = self.book
        todo, seen = list(keys), set()
        while todo:
            key = todo.pop()
            if key in seen:
                continue
            seen.add(key)
            ts = s.tasks.get(key)
            if ts is None:
                continue
            parent = book.parent_of.get(key)
            hold = holder(parent) if parent is not None and key in book.held.get(parent, ()) else None
            wanters = {cs.client_key for cs in ts.who_wants or ()} - {hold}
            if wanters != {client}:
                continue  # wanted by someone else too: not cancelled, as in plain Dask
            if hold is not None:
                self.counts["given-up"] += 1
                self._drop(key, "dask-coro-cancelled")
            todo.extend(dts.key for dts in ts.dependents)

    def _released(self, keys: Any) -> None:
        """A client let go of ``keys`` (``Scheduler.client_releases_keys`` ran)."""
        book, s = self.book, self.scheduler
        for key in keys:
            parent = book.parent_of.get(key)
            if parent is None or key not in book.held.get(parent, ()):
                continue
            ts = s.tasks.get(key)
            if ts is None:
                continue
            name = holder(parent)
            if any(cs.client_key != name for cs in ts.who_wants or ()):
                continue  # wanted by another client still: the hold costs nothing
            if not book.asked_now(key):
                # Let go of by a run of the parent that left its worker: kept
                # for the re-run, as after a kill, neither consumed nor given up.
                self.counts["run-left"] += 1
                continue
            if ts.state == "memory":
                ws = next(iter(ts.who_has or ()), None)
                if ws is None:
                    continue
                for child in self.budget.charge(key, ws.address, ts.nbytes):
                    self.counts["budget"] += 1
                    self._drop(child, "dask-coro-budget")
            elif ts.state in UNFINISHED or ts.state == "erred":
                # The parent gave up on it (a sibling failed, its yield was
                # cancelled): not kept running for nobody.
                self.counts["given-up"] += 1
                self._drop(key, "dask-coro-given-up")

    def _drop(self, child: Key, why: str) -> None:
        """Let go of a held ``child`` now (not inside a transition)."""
        parent = self.book.lost(child)
        if parent is None:
            return
        s = self.scheduler
        cs = s.clients.get(holder(parent))
        ts = s.tasks.get(child)
        if cs is None or ts is None or ts not in cs.wants_what:
            return
        s.client_releases_keys(keys=[child], client=holder(parent), stimulus_id=f"{why}-{parent}")

    def _enforce(self, worker: str) -> None:
        for child in self.budget.over(worker):
            self.counts["budget"] += 1
            self._drop(child, "dask-coro-budget")

    def _limit(self, worker: str) -> int | None:
        """The budget of ``worker`` in bytes (None: no bound)."""
        if self.hold_bytes is None or isinstance(self.hold_bytes, int):
            return self.hold_bytes
        ws = self.scheduler.workers.get(worker) if self.scheduler is not None else None
        return int(self.hold_bytes * (ws.memory_limit or 0)) if ws is not None else 0

    def _where_now(self, child: Key) -> str | None:
        ts = self.scheduler.tasks.get(child)
        if ts is None or ts.state != "memory" or not ts.who_has:
            return None
        return next(iter(ts.who_has)).address

    # -- helpers -------------------------------------------------------------

    def _state(self, key: Key) -> str | None:
        ts = self.scheduler.tasks.get(key)
        return None if ts is None else ts.state

    def _credit(self, parent: Key) -> None:
        """Give the count ahead while ``parent`` waits; take it back when not."""
        ts = self.scheduler.tasks.get(parent)
        if ts is None:
            self.credited.discard(parent)
            return
        if self.book.waiting(parent):
            if parent not in self.credited and ts.state not in _ENDED:
                self.credited.add(parent)
                adjust_suspicion(ts, -1)
        else:
            self._uncredit(parent)

    def _uncredit(self, parent: Key) -> None:
        if parent in self.credited:
            self.credited.discard(parent)
            ts = self.scheduler.tasks.get(parent)
            if ts is not None:
                adjust_suspicion(ts, 1)

    def _let_go_of(self, parent: Key, child: Key) -> None:
        s = self.scheduler
        ts = s.tasks.get(child)
        client = s.clients.get(holder(parent))
        if ts is None or client is None or ts not in client.wants_what:
            return
        if self.book.parent_of.get(child) == parent and child in self.book.held.get(parent, ()):
            return  # finished again meanwhile, and held again
        s.client_releases_keys(keys=[child], client=holder(parent), stimulus_id=f"dask-coro-lost-{parent}")

    def _let_go(self, parent: Key, children: list[Key]) -> None:
        s = self.scheduler
        client = holder(parent)
        if client not in s.clients:
            return
        keys = [k for k in children if k in s.tasks]
        if keys:
            s.client_releases_keys(keys=keys, client=client, stimulus_id=f"dask-coro-let-go-{parent}")
        drop_client_state(s, client)
