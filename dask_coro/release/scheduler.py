"""Scheduler side of worker release: ``ReleasePlugin`` marks and revokes.

When a task is assigned to a worker (its transition to ``processing``), each
of its dependencies that only that worker holds, whose every unfinished
dependent is assigned there too, and that nothing else may need (see
``markable``), and each dependency the worker will fetch a copy of
(``copy_markable``), is *marked* on that worker's stream, ahead of the assignment
(plugins' transition hooks run before ``Scheduler.send_all`` sends the
transitions' messages). A new dependent elsewhere or a client asking for it
*revokes* the mark. The worker releases a marked key itself once the named
dependents finished there (``release/worker.py``); its state machine tells us
(``release-worker-data``, ``Scheduler.release_worker_data``), and the key is
then gone from that worker as for any released replica.
"""

from __future__ import annotations

from time import time
from typing import Any

from dask.typing import Key
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.protocol.pickle import dumps

from .._internals.distributed.core import add_handlers, wrap_stream_handler
from .._internals.distributed.scheduler import scheduler_plugin, store_worker_plugin
from ..runtime import extensions
from ..runtime.extensions import children_by_parent
from .book import EARLY, LET_GO, MARK, READY, REVOKE, Dependents, Marks

NAME = "dask-coro-release"
_DONE = ("memory", "erred")


class ReleasePlugin(SchedulerPlugin):
    """Installed by ``dask scheduler --preload dask_coro`` or by the first
    coroutine on each worker when ``coro.worker-release.enabled`` is on, or
    by ``client.register_plugin(ReleasePlugin())``; installing it again is a
    no-op. It installs its worker plugin on every worker, present and future."""

    name = NAME
    idempotent = True

    def __init__(self) -> None:
        self.marks = Marks()
        self.deps = Dependents()  # dependents of keys in memory, counted by state
        self.ready: set[str] = set()  # workers whose plugin can take marks
        self.released_early = 0  # release-worker-data of a marked key, from its worker
        self.children: dict[Key, tuple[str, str]] = {}  # coroutine child -> (its client, its worker)
        self.for_client: dict[Key, str] = {}  # keys marked to go when that client lets go
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        from .worker import ReleaseWorkerPlugin

        self.scheduler = scheduler
        add_handlers(scheduler, stream={READY: self.handle_ready, LET_GO: self.handle_let_go})
        wrap_stream_handler(scheduler, "release-worker-data", self._count_early, "_dask_coro_release")
        wrap_stream_handler(scheduler, "client-desires-keys", self._revoke_wanted, "_dask_coro_release")
        plugin = dumps(ReleaseWorkerPlugin())
        store_worker_plugin(scheduler, ReleaseWorkerPlugin.name, plugin)
        await scheduler.broadcast(
            msg={"op": "plugin-add", "plugin": plugin, "name": ReleaseWorkerPlugin.name},
            on_error="ignore",
        )

    # -- hooks ---------------------------------------------------------------

    def transition(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        # O(1) amortised per dependent: a key with D dependents is walked once
        # when it starts being watched, then each dependent's transition
        # updates its watched dependencies' counts (``Dependents``) and a mark
        # grows by the one dependent assigned (``Marks.name``).
        s = self.scheduler
        ts = s.tasks[key] if finish == "processing" else None
        ws = ts.processing_on if ts is not None else None
        self.deps.moved(key, start, finish, ws.address if ws is not None else None)
        if start == "memory" or finish == "forgotten":
            self.deps.unwatch(key)
        if finish == "forgotten":
            self.children.pop(key, None)
        if start == "memory" and key in self.marks.marked:
            self.marks.drop(key)  # gone (released, lost): the workers drop it too
            self.for_client.pop(key, None)
        if finish == "memory":
            self._mark_for_client(s.tasks[key])
        if ts is not None:
            if ws is None or ws.address not in self.ready:
                return
            for dts in ts.dependencies:
                if ws in (dts.who_has or ()):
                    ok = self.markable(dts, ws)
                else:
                    ok = self.copy_markable(dts)
                if not ok:
                    self._revoke(dts.key, ws.address)
                elif self.marks.is_marked(dts.key, ws.address):
                    # Every dependent assigned to ws since the mark was
                    # named when it was (or the mark revoked): this one is new.
                    if self.marks.name(dts.key, ws.address, key):
                        self._send(ws.address, {"op": MARK, "key": dts.key, "dependents": [key], "more": True})
                else:
                    # In memory on ws alone: its unfinished dependents, all
                    # processing there; a copy: the dependents it is for.
                    named = self.deps.processing_on(dts.key, ws.address)
                    if self.marks.mark(dts.key, ws.address, named):
                        self._send(ws.address, {"op": MARK, "key": dts.key, "dependents": named})
        elif start == "processing":
            # A named dependent leaves its worker other than by finishing
            # (rescheduled, lost with a worker): its marks no longer hold.
            if finish not in _DONE:
                for k, w in self.marks.naming(key):
                    self._revoke(k, w)

    def update_graph(
        self, scheduler: Any, *, client: str = "", keys: Any = (), tasks: Any = (),
        annotations: Any = None, **kwargs: Any,
    ) -> None:
        for parent, children in children_by_parent(annotations).items():
            pts = scheduler.tasks.get(parent)
            if pts is not None and pts.processing_on is not None:
                # Submitted by the client of the worker running the coroutine.
                for k in children:
                    self.children[k] = (client, pts.processing_on.address)
        deps = self.deps
        if deps.members:
            # New dependents of watched keys are counted from their state now
            # (this hook runs before the new tasks' first transitions).
            for k in tasks or ():
                ts = scheduler.tasks.get(k)
                if ts is None:
                    continue
                for dts in ts.dependencies:
                    if deps.watched(dts.key):
                        ws = ts.processing_on
                        deps.add(dts.key, k, ts.state, ws.address if ws is not None else None)
        marked = self.marks.marked
        if not marked:
            return
        for k in keys or ():
            if k in marked:
                self._revoke(k)  # a client asks for it
        for k in tasks or ():
            ts = scheduler.tasks.get(k)
            if ts is None:
                continue
            for dts in ts.dependencies:
                if dts.key in marked and not self.marks.names(dts.key, k):
                    self._revoke(dts.key)  # re-marked if ``k`` goes to the same worker

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self.ready.discard(worker)
        self.marks.drop_worker(worker)

    def restart(self, scheduler: Any) -> None:
        # Scheduler.restart forgets every task without transitions.
        self.marks.clear()
        self.deps = Dependents()
        self.children.clear()
        self.for_client.clear()

    # -- what may be marked ----------------------------------------------------

    def markable(self, dts: Any, ws: Any) -> bool:
        """Whether ``dts`` may be released by ``ws`` once its dependents
        assigned there finished: it is in memory on ``ws`` alone; no client
        wants it (a coroutine's children, held for it, are wanted); it can be
        recomputed (not scattered: it has a run_spec); it is no actor, and
        no plugin keeps it (a promise or promise target, a key resources are
        tied to, a child held for its coroutine: ``_kept``); every dependent
        has finished or is processing on ``ws``."""
        if dts.state != "memory" or dts.who_wants or dts.actor or dts.run_spec is None:
            return False
        who_has = dts.who_has
        if not who_has or len(who_has) != 1 or ws not in who_has:
            return False
        self._watch(dts)
        if not self.deps.settled_on(dts.key, ws.address):
            return False
        return not self._kept(dts.key, False)

    def copy_markable(self, dts: Any) -> bool:
        """Whether the copy of ``dts`` a worker fetches to run a dependent of
        its own may be dropped once its dependents there finished: ``dts``
        lives on another worker (dropping the copy loses nothing; were that
        one lost too, ``dts`` is computed again), can be recomputed, is no
        actor, promise or tied key. Clients and other workers' dependents do
        not matter to a copy, nor does a hold for a coroutine."""
        if dts.state != "memory" or not dts.who_has or dts.actor or dts.run_spec is None:
            return False
        self._watch(dts)
        return not self._kept(dts.key, True)

    def _watch(self, dts: Any) -> None:
        """Count the dependents of ``dts`` (in memory) if not counted yet:
        one walk of them per stay in memory. A count that no longer matches
        its dependents (an edge added or removed other than by a submission
        or a forgotten task: a promise rewired) is made anew."""
        deps = self.deps
        if deps.watched(dts.key) and deps.counted(dts.key) == len(dts.dependents):
            return
        deps.watch(
            dts.key,
            (
                (d.key, d.state, d.processing_on.address if d.processing_on is not None else None)
                for d in dts.dependents
            ),
        )

    def _mark_for_client(self, ts: Any) -> None:
        """A coroutine's child in memory: wanted by its coroutine's worker
        client alone, on that worker alone, with no dependent left, it may
        go as soon as the coroutine lets go of it (after it resumed), without
        waiting for this scheduler's free-keys. (Held for its coroutine by
        DurablePlugin, it is wanted twice: not marked.)"""
        who_has, who_wants = ts.who_has, ts.who_wants
        if not who_has or len(who_has) != 1 or not who_wants or len(who_wants) != 1:
            return
        (ws,) = who_has
        (cs,) = who_wants
        if self.children.pop(ts.key, None) != (cs.client_key, ws.address) or ws.address not in self.ready:
            return
        if ts.actor or ts.run_spec is None or any(d.state not in _DONE for d in ts.dependents):
            return
        if self._kept(ts.key, False):
            return  # a promise, a tied key, held for its coroutine until that ends
        if self.marks.mark(ts.key, ws.address, ()):
            self.for_client[ts.key] = cs.client_key
            self._send(ws.address, {"op": MARK, "key": ts.key, "dependents": [], "client": cs.client_key})

    def handle_let_go(self, client: str, keys: list[Key], worker: str, **kwargs: Any) -> None:
        """A worker's own client let go of keys marked for it: the scheduler
        hears it here, on the worker's stream, before that worker's
        release-worker-data of them (the client's own message, on its own
        stream, may come later; it then finds nothing to do)."""
        s = self.scheduler
        mine = [k for k in keys if self.for_client.get(k) == client and worker in self.marks.marked.get(k, {})]
        for k in mine:
            del self.for_client[k]
        if mine and client in s.clients:
            s.client_releases_keys(keys=mine, client=client, stimulus_id=f"{LET_GO}-{time()}")

    def _kept(self, key: Key, copy: bool) -> bool:
        """Whether a plugin keeps ``key`` (``copy``: the copy a worker
        fetched): each installed plugin of an extension that says it keeps
        keys (``Extension.keeper``) is asked its ``keeps``."""
        s = self.scheduler
        for name in extensions.keepers():
            keeper = scheduler_plugin(s, name)
            if keeper is not None and keeper.keeps(key, copy):
                return True
        return False

    # -- messages --------------------------------------------------------------

    def handle_ready(self, worker: str, **kwargs: Any) -> None:
        if worker in self.scheduler.workers:
            self.ready.add(worker)

    def _revoke(self, key: Key, worker: str | None = None) -> None:
        self.for_client.pop(key, None)
        for w in self.marks.revoke(key, worker):
            self._send(w, {"op": REVOKE, "key": key})

    def _send(self, worker: str, msg: dict[str, Any]) -> None:
        stream = self.scheduler.stream_comms.get(worker)
        if stream is not None:
            msg["stimulus_id"] = f"{msg['op']}-{time()}"
            stream.send(msg)

    def _count_early(self, handler: Any) -> Any:
        def release_worker_data(key: Key, worker: str, stimulus_id: str, **kwargs: Any) -> None:
            if stimulus_id.startswith(EARLY):
                self.released_early += 1
                self.marks.drop(key, worker)
            handler(key=key, worker=worker, stimulus_id=stimulus_id, **kwargs)

        return release_worker_data

    def _revoke_wanted(self, handler: Any) -> Any:
        def client_desires_keys(keys: Any = (), **kwargs: Any) -> None:
            for k in keys or ():
                if k in self.marks.marked:
                    self._revoke(k)
            handler(keys=keys, **kwargs)

        return client_desires_keys

