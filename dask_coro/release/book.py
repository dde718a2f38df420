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
    worker fetches to run dependents of its own, on each such worker. A
    mark grows one dependent at a time (``name``) as dependents are assigned
    to its worker, so that D dependents cost O(D) in all, and it is indexed
    by worker, so that a worker's leaving costs O(its marks)."""

    def __init__(self) -> None:
        self.marked: dict[Key, dict[str, set[Key]]] = {}
        self.by_dependent: dict[Key, set[tuple[Key, str]]] = {}  # dependent -> marks naming it
        self.by_worker: dict[str, set[Key]] = {}  # worker -> keys marked on it
        self.made = 0  # marks sent
        self.named = 0  # dependents named in the marks sent and their growth
        self.revoked = 0  # revocations sent

    def mark(self, key: Key, worker: str, dependents: Iterable[Key]) -> bool:
        """Mark ``key`` on ``worker``; False if it is marked so already."""
        deps = set(dependents)
        on = self.marked.get(key, {})
        if on.get(worker) == deps:
            return False
        self._unname(key, worker)
        self.marked.setdefault(key, {})[worker] = deps
        self.by_worker.setdefault(worker, set()).add(key)
        for d in deps:
            self.by_dependent.setdefault(d, set()).add((key, worker))
        self.made += 1
        self.named += len(deps)
        return True

    def is_marked(self, key: Key, worker: str) -> bool:
        return worker in self.marked.get(key, ())

    def name(self, key: Key, worker: str, dependent: Key) -> bool:
        """One more dependent for the mark of ``key`` on ``worker``; False if
        there is no such mark or it names ``dependent`` already."""
        deps = self.marked.get(key, {}).get(worker)
        if deps is None or dependent in deps:
            return False
        deps.add(dependent)
        self.by_dependent.setdefault(dependent, set()).add((key, worker))
        self.named += 1
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
            keys = self.by_worker[w]
            keys.discard(key)
            if not keys:
                del self.by_worker[w]
        if not on:
            del self.marked[key]
        return workers

    def drop_worker(self, worker: str) -> None:
        """``worker`` left: forget its marks (it took its keys with it)."""
        for key in list(self.by_worker.get(worker, ())):
            self.drop(key, worker)

    def revoke(self, key: Key, worker: str | None = None) -> list[str]:
        """Take the marks of ``key`` back: the workers to tell."""
        workers = self.drop(key, worker)
        self.revoked += len(workers)
        return workers

    def naming(self, dependent: Key) -> list[tuple[Key, str]]:
        """The marks ``(key, worker)`` that name ``dependent``."""
        return list(self.by_dependent.get(dependent, ()))

    def clear(self) -> None:
        """Every key is gone (``Scheduler.restart``); the counts stay."""
        self.marked.clear()
        self.by_dependent.clear()
        self.by_worker.clear()

    def _unname(self, key: Key, worker: str) -> None:
        deps = self.marked.get(key, {}).get(worker, ())
        for d in deps:
            marks = self.by_dependent.get(d)
            if marks is not None:
                marks.discard((key, worker))
                if not marks:
                    del self.by_dependent[d]


#: Scheduler task states of a dependent that no longer needs its dependencies.
FINISHED = frozenset({"memory", "erred"})


class Dependents:
    """Scheduler side: the dependents of each *watched* key (one in memory
    that a dependent was assigned to a worker for), counted by state: how
    many finished, and which are processing on which worker, kept from the
    dependents' own transitions. Whether every dependent of a key finished
    or is processing on one worker (``settled_on``) is then a comparison of
    two numbers: without it, each of D dependents assigned would walk all D
    (O(D) each, O(D^2) in all). A key starts being watched with one walk of
    its dependents (``scanned`` counts the dependents read) and stops when it
    leaves memory; a dependent's transition costs O(its watched dependencies).

    A task distributed's work stealing moves from one worker to another
    changes worker without a transition (``stealing.py``
    ``move_task_confirm``): it stays counted on the worker it was assigned
    to until it leaves processing. Both counts then err on the safe side: a
    mark for the first worker names a dependent that never finishes there
    (the key is not released early), and the second worker's count lacks it
    (the key is not marked there)."""

    def __init__(self) -> None:
        self.members: dict[Key, set[Key]] = {}  # watched key -> its dependents counted
        self.done: dict[Key, int] = {}  # watched key -> how many of them finished
        self.on: dict[Key, dict[str, set[Key]]] = {}  # watched key -> worker -> processing there
        self.of: dict[Key, set[Key]] = {}  # dependent -> the watched keys it counts in
        self.where: dict[Key, str] = {}  # dependent counted and processing -> its worker
        self.scanned = 0  # dependents read to start watching keys

    def watch(self, key: Key, dependents: Iterable[tuple[Key, str, str | None]]) -> None:
        """Count the dependents of ``key`` from now on, given as
        ``(dependent, its state, its worker if processing)``; a key watched
        already is counted anew."""
        self.unwatch(key)
        self.members[key] = set()
        self.done[key] = 0
        self.on[key] = {}
        for dependent, state, worker in dependents:
            self.scanned += 1
            self.add(key, dependent, state, worker)

    def add(self, key: Key, dependent: Key, state: str, worker: str | None = None) -> None:
        """``dependent`` of the watched ``key`` is new (submitted since)."""
        members = self.members.get(key)
        if members is None or dependent in members:
            return
        members.add(dependent)
        self.of.setdefault(dependent, set()).add(key)
        if state in FINISHED:
            self.done[key] += 1
        elif state == "processing" and worker is not None:
            self.where[dependent] = worker
            self.on[key].setdefault(worker, set()).add(dependent)

    def moved(self, dependent: Key, start: str, finish: str, worker: str | None = None) -> None:
        """A task moved from ``start`` to ``finish`` (``worker``: where it is
        processing now); only the keys it counts in are touched."""
        keys = self.of.get(dependent)
        if not keys:
            return
        if start == "processing":
            was = self.where.pop(dependent, None)
            if was is not None:
                for k in keys:
                    on = self.on[k]
                    there = on.get(was)
                    if there is not None:
                        there.discard(dependent)
                        if not there:
                            del on[was]
        if start in FINISHED:
            for k in keys:
                self.done[k] -= 1
        if finish == "forgotten":  # no longer a dependent of anything
            for k in self.of.pop(dependent):
                self.members[k].discard(dependent)
        elif finish in FINISHED:
            for k in keys:
                self.done[k] += 1
        elif finish == "processing" and worker is not None:
            self.where[dependent] = worker
            for k in keys:
                self.on[k].setdefault(worker, set()).add(dependent)

    def unwatch(self, key: Key) -> None:
        """``key`` left memory (or was forgotten): counted no more."""
        members = self.members.pop(key, None)
        if members is None:
            return
        del self.done[key]
        del self.on[key]
        for d in members:
            keys = self.of.get(d)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.of[d]
                    self.where.pop(d, None)

    def watched(self, key: Key) -> bool:
        return key in self.members

    def counted(self, key: Key) -> int:
        """How many dependents of ``key`` are counted (0 if not watched)."""
        return len(self.members.get(key, ()))

    def settled_on(self, key: Key, worker: str) -> bool:
        """Whether every counted dependent of the watched ``key`` finished or
        is processing on ``worker``."""
        return len(self.members[key]) == self.done[key] + len(self.on[key].get(worker, ()))

    def processing_on(self, key: Key, worker: str) -> list[Key]:
        """The counted dependents of ``key`` processing on ``worker``."""
        return list(self.on.get(key, {}).get(worker, ()))


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

    def extend(self, key: Key, dependents: Iterable[Key], finished: Iterable[Key] = ()) -> bool:
        """The scheduler named more dependents for the mark of ``key`` (a
        mark is sent whole once, then grown); a key no longer pending (its
        named dependents all finished meanwhile, or never marked) is marked
        with these. True when nothing is left to wait for."""
        left = self.waiting.get(key)
        if left is None:
            return self.mark(key, dependents, finished)
        for d in set(dependents) - set(finished):
            if d not in left:
                left.add(d)
                self.by_dependent.setdefault(d, set()).add(key)
        return False

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
