"""Worker side of worker release: ``ReleaseWorkerPlugin``.

Takes the scheduler's marks and revocations from the worker's stream, and
when the last dependent a mark names finished here, releases the key through
the worker's own state machine (``FreeKeysEvent``, the event ``free-keys``
makes), whose memory -> released transition tells the scheduler
(``ReleaseWorkerDataMsg``). Never a raw delete from ``worker.data``.
"""

from __future__ import annotations

import asyncio
from time import time
from typing import Any

from dask.typing import Key
from distributed.diagnostics.plugin import WorkerPlugin

from .._internals.distributed.client import client_holds
from .._internals.distributed.core import add_handlers, wrap_stream_handler
from .._internals.distributed.worker import send_on_worker_stream
from .._internals.distributed.worker_state_machine import (
    fetch_only_from_here_missing,
    release_own_keys,
    worker_dependent_states,
    worker_task_state,
)
from .book import EARLY, LET_GO, MARK, READY, REVOKE, Pending

#: The scheduler's messages that release keys on a worker.
_SCHEDULER_RELEASES = ("free-keys", "cancel-compute", "steal-request", "remove-replicas")
#: The stimulus of a compute given back (``ReleaseWorkerPlugin._reschedule``).
DROPPED = "dask-coro-dropped"

#: Worker task states in which a local task no longer needs its dependencies.
_DONE = frozenset({"memory", "error", "released", "forgotten"})


class ReleaseWorkerPlugin(WorkerPlugin):
    name = "dask-coro-release"
    idempotent = True

    def __init__(self) -> None:
        self.pending = Pending()
        self.freeing: frozenset[Key] = frozenset()  # keys the scheduler's message being handled releases
        self.dropped: set[Key] = set()  # computes the worker dropped on its own (``transition``)
        self.rescheduled = 0  # of those, given back to the scheduler
        self.clients: dict[str, Any] = {}  # this worker's clients that let go of children
        self.worker: Any = None

    def setup(self, worker: Any) -> None:
        self.worker = worker
        add_handlers(worker, stream={MARK: self.handle_mark, REVOKE: self.handle_revoke})
        wrap_stream_handler(worker, "compute-task", self._compute_task, "_dask_coro_release")
        for op in _SCHEDULER_RELEASES:
            wrap_stream_handler(worker, op, self._scheduler_releases, "_dask_coro_release")
        # Marks are sent only to workers that said they take them: a stream
        # message without a handler would close the worker's stream.
        send_on_worker_stream(worker, {"op": READY})

    def handle_mark(
        self,
        key: Key,
        dependents: list[Key],
        stimulus_id: str = "",
        client: str | None = None,
        more: bool = False,
        **kwargs: Any,
    ) -> None:
        """A mark of ``key`` naming ``dependents``, or with ``more``, more
        dependents for the mark of ``key`` sent before (one per dependent
        assigned here since)."""
        if client is not None:
            self.pending.mark_for_client(key, client)
            known = self.clients.get(client)
            if known is not None and not client_holds(known, key):
                self.let_go(known, [key])  # its coroutine let go before the mark came
            return
        done = [d for d in dependents if worker_task_state(self.worker, d) in ("memory", "error")]
        if (self.pending.extend if more else self.pending.mark)(key, dependents, done):
            self._soon([key])

    def handle_revoke(self, key: Key, stimulus_id: str = "", **kwargs: Any) -> None:
        self.pending.revoke(key)

    def transition(self, key: Key, start: str, finish: str, **kwargs: Any) -> None:
        if key in self.freeing:
            self.dropped.discard(key)  # the scheduler's own release
        elif start == "resumed" and finish == "released":
            # distributed released a task the scheduler asked this worker to
            # compute while its copy was in flight (``resumed``): a dependent
            # released here (early, or a cancelled one ending) releases its
            # dependencies that no task waits for, and ``resumed`` is not
            # spared (``WorkerState._transition_generic_released``; see
            # dask/distributed#6893). The scheduler is not told, and waits
            # for it for ever: once the transfer ended, it is given back
            # (``_reschedule``). Early releases make such transfers likely:
            # a dependent assigned after one fetches the key again.
            self.dropped.add(key)
        elif key in self.dropped and finish in ("released", "forgotten"):
            self.dropped.discard(key)  # the transfer ended, or asked to end
            asyncio.get_running_loop().call_soon(self._reschedule, key)
        if finish in ("memory", "error"):
            self.dropped.discard(key)  # asked for again, and done
            ready = self.pending.finished(key)
            if ready:
                self._soon(ready)
        if start == "memory" and key in self.pending:
            self.pending.revoke(key)  # released or lost meanwhile

    def _compute_task(self, handler: Any) -> Any:
        """``compute-task``: a key this worker released early may be named as
        held here alone by a scheduler that has not heard of the release yet
        (the message crossed ours, and the copy it was fetching from meanwhile
        was lost with its worker): not fetched from nobody
        (``fetch_only_from_here_missing``)."""

        def compute_task(**msg: Any) -> None:
            fetch_only_from_here_missing(self.worker, msg.get("who_has") or {}, msg.get("stimulus_id", ""))
            handler(**msg)

        return compute_task

    def _scheduler_releases(self, handler: Any) -> Any:
        """A scheduler's message that releases keys here: its keys are not
        dropped on the worker's own (``transition``)."""

        def releases(**msg: Any) -> None:
            keys = msg.get("keys")
            self.freeing = frozenset(keys if keys is not None else [msg["key"]])
            try:
                handler(**msg)
            finally:
                self.freeing = frozenset()

        return releases

    def _reschedule(self, key: Key) -> None:
        """Tell the scheduler that ``key``, which it sees processing here, is
        not: ``Scheduler._reschedule`` computes it again, and does nothing
        if the scheduler assigned it elsewhere or no longer wants it (or
        asked again meanwhile: the compute it sends next is released)."""
        state = worker_task_state(self.worker, key)
        if state == "cancelled":
            self.dropped.add(key)  # released while in flight: when the transfer ends
            return
        if state not in (None, "released"):
            return  # asked for again meanwhile
        self.rescheduled += 1
        send_on_worker_stream(self.worker, {"op": "reschedule", "key": key, "stimulus_id": f"{DROPPED}-{time()}"})

    def let_go(self, client: Any, keys: list[Key]) -> None:
        """This worker's ``client`` let go of ``keys`` (a coroutine resumed;
        run on the loop after the client's own reference counting): release
        those marked for it that it holds no reference to any more. The
        scheduler hears of the client's letting go first, on this worker's
        stream, so the release that follows finds them unwanted."""
        self.clients[client.id] = client
        keys = [k for k in self.pending.let_go(client.id, keys) if not client_holds(client, k)]
        self._release(keys, notice={"op": LET_GO, "client": client.id})

    def _soon(self, keys: list[Key]) -> None:
        # Not inside the state machine's transition (a plugin hook): after it.
        asyncio.get_running_loop().call_soon(self._release, keys)

    def _release(self, keys: list[Key], notice: dict[str, Any] | None = None) -> None:
        """Release those of ``keys`` that may go; ``notice``, sent first on
        the worker's stream with their keys, tells the scheduler why."""
        free = [k for k in keys if self._releasable(k)]
        if not free:
            return
        if notice is not None:
            send_on_worker_stream(self.worker, {**notice, "keys": free})
        self.pending.released += len(free)
        release_own_keys(self.worker, free, stimulus_id=f"{EARLY}-{time()}")

    def _releasable(self, key: Key) -> bool:
        """In memory here, and no task of this worker still needs it (a
        dependent the scheduler has not named yet, assigned meanwhile)."""
        return worker_task_state(self.worker, key) == "memory" and all(
            state in _DONE for state in worker_dependent_states(self.worker, key)
        )
