"""Which keys a worker may release on its own (pure: no dask, no distributed).

The scheduler frees a result once every dependent has run, by ``free-keys``
after it handled the last ``task-finished``; a busy scheduler handles it late,
and the data sits in the worker's memory meanwhile (dask/distributed #5114).
Here the scheduler says ahead, when it assigns the last dependent of a key to
the worker that alone holds it: "once these dependents finished here, the key
is yours to release" (a *mark*), and takes it back (a *revocation*) when the
key gains a dependent or a client elsewhere. A worker that fetches a copy of a
key to run dependents of its own gets a mark for its copy too: dropping a copy
loses nothing while the key lives elsewhere, and if it no longer does, the
key is computed again. Marks and revocations travel on
the worker's ordered stream, before the assignments they go with.

Safety does not rest on the revocation arriving in time. A worker releases a
marked key only when every dependent the mark names finished *on this
worker* and no other task of its own still needs it, and it releases it
through its state machine, which tells the scheduler (``release-worker-data``).
A dependent or client that needed the key after all finds it gone: the
scheduler recomputes it from its lineage, as for any lost replica. So a late
revocation costs a recompute, never a wrong result.

``Marks`` is the scheduler's book, ``Pending`` the worker's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the type checker only: this module does not import dask
    from dask.typing import Key


#: Stream ops: scheduler -> worker (a mark, a revocation), worker -> scheduler.
MARK = "dask-coro-releasable"
REVOKE = "dask-coro-keep"
READY = "dask-coro-release-ready"
LET_GO = "dask-coro-client-lets-go"  # worker -> scheduler: its own client let go of keys
EARLY = "dask-coro-released-early"  # the stimulus of a worker's own release


class Marks:
    """Scheduler side: marked key -> {worker address: the dependents named}.
    A key is marked on the one worker that holds it, or, for a copy a
    worker fetches to run dependents of its own, on each such worker."""

    def __init__(self) -> None:
        self.marked: dict[Key, dict[str, frozenset[Key]]] = {}
        self.by_dependent: dict[Key, set[tuple[Key, str]]] = {}  # dependent -> marks naming it
        self.made = 0  # marks sent
        self.revoked = 0  # revocations sent

    def mark(self, key: Key, worker: str, dependents: Iterable[Key]) -> bool:
        """Mark ``key`` on ``worker``; False if it is marked so already."""
        deps = frozenset(dependents)
        on = self.marked.get(key, {})
        if on.get(worker) == deps:
            return False
        self._unname(key, worker)
        self.marked.setdefault(key, {})[worker] = deps
        for d in deps:
            self.by_dependent.setdefault(d, set()).add((key, worker))
        self.made += 1
        return True

    def names(self, key: Key, dependent: Key) -> bool:
        """Whether a mark of ``key`` names ``dependent``."""
        return any(dependent in deps for deps in self.marked.get(key, {}).values())

    def drop(self, key: Key, worker: str | None = None) -> list[str]:
        """Forget the marks of ``key`` (on ``worker`` only, if given); the
        workers they were on."""
        on = self.marked.get(key)
        if not on:
            return []
        workers = [worker] if worker is not None and worker in on else ([] if worker is not None else list(on))
        for w in workers:
            self._unname(key, w)
            del on[w]
        if not on:
            del self.marked[key]
        return workers

    def revoke(self, key: Key, worker: str | None = None) -> list[str]:
        """Take the marks of ``key`` back: the workers to tell."""
        workers = self.drop(key, worker)
        self.revoked += len(workers)
        return workers

    def naming(self, dependent: Key) -> list[tuple[Key, str]]:
        """The marks ``(key, worker)`` that name ``dependent``."""
        return list(self.by_dependent.get(dependent, ()))

    def _unname(self, key: Key, worker: str) -> None:
        deps = self.marked.get(key, {}).get(worker, frozenset())
        for d in deps:
            marks = self.by_dependent.get(d)
            if marks is not None:
                marks.discard((key, worker))
                if not marks:
                    del self.by_dependent[d]


class Pending:
    """Worker side: marked key -> the dependents named in its mark that have
    not finished here yet."""

    def __init__(self) -> None:
        self.waiting: dict[Key, set[Key]] = {}
        self.by_dependent: dict[Key, set[Key]] = {}
        # key -> the client (this worker's own) whose letting go releases it:
        # a coroutine's child, wanted by its coroutine only until it resumes
        self.on_let_go: dict[Key, str] = {}
        self.released = 0  # keys released early

    def mark(self, key: Key, dependents: Iterable[Key], finished: Iterable[Key] = ()) -> bool:
        """The scheduler marked ``key``; ``finished``: dependents already
        finished here. True when nothing is left to wait for."""
        self.revoke(key)
        left = set(dependents) - set(finished)
        if not left:
            return True
        self.waiting[key] = left
        for d in left:
            self.by_dependent.setdefault(d, set()).add(key)
        return not left

    def mark_for_client(self, key: Key, client: str) -> None:
        """The scheduler marked ``key``, wanted by ``client`` alone: release
        it when that client lets go of it."""
        self.revoke(key)
        self.on_let_go[key] = client

    def let_go(self, client: str, keys: Iterable[Key]) -> list[Key]:
        """``client`` let go of ``keys``: those marked for it."""
        out = [k for k in keys if self.on_let_go.get(k) == client]
        for k in out:
            del self.on_let_go[k]
        return out

    def revoke(self, key: Key) -> None:
        self.on_let_go.pop(key, None)
        left = self.waiting.pop(key, None)
        for d in left or ():
            keys = self.by_dependent.get(d)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.by_dependent[d]

    def finished(self, dependent: Key) -> list[Key]:
        """``dependent`` finished here: the marked keys it was the last for."""
        ready = []
        for key in self.by_dependent.pop(dependent, ()):
            left = self.waiting.get(key)
            if left is None:
                continue
            left.discard(dependent)
            if not left:
                del self.waiting[key]
                ready.append(key)
        return ready

    def __contains__(self, key: Key) -> bool:
        return key in self.waiting or key in self.on_let_go
