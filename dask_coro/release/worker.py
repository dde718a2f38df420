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

from .._internals import distributed_private as private
from .book import MARK, READY, REVOKE, Pending

#: Worker task states in which a local task no longer needs its dependencies.
_DONE = frozenset({"memory", "error", "released", "forgotten"})


class ReleaseWorkerPlugin(WorkerPlugin):
    name = "dask-coro-release"
    idempotent = True

    def __init__(self) -> None:
        self.pending = Pending()
        self.worker: Any = None

    def setup(self, worker: Any) -> None:
        self.worker = worker
        private.add_handlers(worker, stream={MARK: self.handle_mark, REVOKE: self.handle_revoke})
        # Marks are sent only to workers that said they take them: a stream
        # message without a handler would close the worker's stream.
        private.send_on_worker_stream(worker, {"op": READY})

    def handle_mark(self, key: Key, dependents: list[Key], stimulus_id: str = "", **kwargs: Any) -> None:
        done = [d for d in dependents if private.worker_task_state(self.worker, d) in ("memory", "error")]
        if self.pending.mark(key, dependents, done):
            self._soon([key])

    def handle_revoke(self, key: Key, stimulus_id: str = "", **kwargs: Any) -> None:
        self.pending.revoke(key)

    def transition(self, key: Key, start: str, finish: str, **kwargs: Any) -> None:
        if finish in ("memory", "error"):
            ready = self.pending.finished(key)
            if ready:
                self._soon(ready)
        if start == "memory" and key in self.pending:
            self.pending.revoke(key)  # released or lost meanwhile

    def _soon(self, keys: list[Key]) -> None:
        # Not inside the state machine's transition (a plugin hook): after it.
        asyncio.get_running_loop().call_soon(self._release, keys)

    def _release(self, keys: list[Key]) -> None:
        free = [k for k in keys if self._releasable(k)]
        if free:
            self.pending.released += len(free)
            private.release_own_keys(self.worker, free, stimulus_id=f"dask-coro-released-early-{time()}")

    def _releasable(self, key: Key) -> bool:
        """In memory here, and no task of this worker still needs it (a
        dependent the scheduler has not named yet, assigned meanwhile)."""
        return private.worker_task_state(self.worker, key) == "memory" and all(
            state in _DONE for state in private.worker_dependent_states(self.worker, key)
        )
