"""Scheduler side of ``Promise``: every change dask_coro makes to scheduler state.

A promise is a task ``P`` parked in ``no-worker`` by a resource no worker has.
Resolving it with a target ``T`` turns ``P`` into ``Alias(P -> T)`` with ``T`` as
its only dependency, so ``P`` runs on ``T``'s worker without a copy, and after
data loss is recomputed through its new lineage. Re-pointing (the task ``P``
points at resolves it again) moves that one dependency edge. Nothing waits on a
worker while ``P`` is pending.

The plugin also turns hangs into errors: a promise with no target whose
creating task finished, and a promise whose target was forgotten before it
produced a value, fail with ``PromiseError``; resolving a forgotten promise,
or resolving one with something that depends on it (a cycle, which would wait
for ever), is refused at once.

Ordering. ``resolve_with`` sends a *mark* on its client's batched stream and
then asks ``check`` (an RPC, on another connection); ``check`` first waits for
the mark, so everything the client sent before (the promise's creation, its
earlier rewirings) has been handled (``Server.handle_stream`` awaits each
handler in order). A promise unknown then was forgotten, not in flight.

Cycles. A rewiring ``P -> T`` adds one dependency edge; it makes a cycle if
``P`` is upstream of ``T``. ``check`` walks from the scheduler keys ``T``'s
graph depends on (the client sends them), ``resolve`` from ``T`` itself once
its graph is here (two resolves racing on two streams). The walk searches
from both ends, up from ``T`` through dependencies and down from ``P``
through dependents (and, in ``check``, granted rewirings still in flight),
never through a task with a final value (it waits for nothing), extending the
side that reached fewer keys: its cost is about twice the smaller of the unfinished
graphs upstream of ``T`` and downstream of ``P``, and it stops after
``CYCLE_WALK_LIMIT`` keys (2 to 10 us each), reporting no cycle then (a
warning is logged).

distributed only logs exceptions raised in plugin hooks, so the hooks here
catch, log with context, and fail the promise themselves.
"""

from __future__ import annotations

import asyncio
import logging
from time import time
from typing import Any

from dask.typing import Key
from distributed.diagnostics.plugin import SchedulerPlugin

from .._exceptions import PromiseError
from .._internals.dask_private import Task
from .._internals.distributed.core import add_handlers
from .._internals.distributed.scheduler import alias_task, fail_task, forget_if_unused
from .parked import unresolved

logger = logging.getLogger("dask_coro")

#: Most tasks one cycle check visits (see the module docstring).
CYCLE_WALK_LIMIT = 20_000


def is_placeholder(run_spec: Any) -> bool:
    return isinstance(run_spec, Task) and run_spec.func is unresolved


class PromisePlugin(SchedulerPlugin):
    """Installed once per scheduler (``idempotent``); see the module docstring."""

    name = "dask-coro-promises"
    idempotent = True

    def __init__(self) -> None:
        self.targets: dict[Key, Key] = {}  # promise -> what it is rewired to now
        self.history: dict[Key, list[Key]] = {}  # promise -> every target rewired, in order
        # promise -> (resolver, target) granted by ``check``, its rewiring still
        # on the resolver's stream (lost if the resolver's worker dies first)
        self.pending: dict[Key, tuple[Key | None, Key]] = {}
        self.pointed_by: dict[Key, set[Key]] = {}  # target -> promises pointing at it
        self.created_by: dict[Key, set[Key]] = {}  # creating task -> its promises
        # resolve_with's mark -> (its client, set once the mark was handled);
        # dropped by the check that waits for it, or with its client
        self.marks: dict[str, tuple[str | None, asyncio.Event]] = {}
        self.done: dict[tuple[Key, Key], asyncio.Event] = {}  # (promise, target) handled
        # (promise, target) -> why the rewiring was refused, for ``applied``
        self.refused: dict[tuple[Key, Key], str] = {}
        # Former targets detached by a re-pointing: nothing else would ever
        # forget them once released (distributed forgets a task when its
        # dependents are forgotten or its clients release it).
        self.orphans: set[Key] = set()
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        add_handlers(
            scheduler,
            rpc={
                "dask_coro_promise_check": self.check,
                "dask_coro_promise_applied": self.applied,
                "dask_coro_promise_sent": self.sent,
            },
            stream={"dask-coro-promise-resolve": self.resolve, "dask-coro-promise-mark": self.mark},
        )

    # -- hooks ---------------------------------------------------------------

    def keeps(self, key: Key, copy: bool) -> bool:
        """A promise or what one points at stays until the scheduler lets go
        of it, its copies too (``PromiseExtension.keeper``: worker release asks)."""
        return key in self.targets or key in self.pointed_by

    def update_graph(self, scheduler: Any, *, tasks: list[Key] = (), **kwargs: Any) -> None:  # type: ignore[assignment]
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is not None and is_placeholder(ts.run_spec):
                creator = ts.run_spec.args[1]
                if creator is None:
                    continue
                cts = scheduler.tasks.get(creator)
                if cts is None or cts.state in ("memory", "erred"):
                    # The creator's completion (on its worker's stream) came
                    # before this graph (on the worker client's): it is done.
                    self._fail_later(key, _never_resolved(key, creator))
                else:
                    self.created_by.setdefault(creator, set()).add(key)

    def transition(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if key in self.orphans:
            if finish == "released":
                self.scheduler.loop.add_callback(self._forget_orphan, key)
            elif finish == "forgotten":
                self.orphans.discard(key)
        if finish not in ("memory", "erred", "forgotten"):
            return
        try:
            for p in self.created_by.pop(key, ()):
                if p not in self.targets and p not in self.pending:
                    self._fail_later(p, _never_resolved(p, key))
            if finish == "forgotten":
                for p in self.pointed_by.pop(key, ()):
                    if self.targets.get(p) == key:
                        self._fail_later(
                            p,
                            f"promise {p!r} lost its target {key!r} before it "
                            "produced a value (was it cancelled?)",
                        )
                self.targets.pop(key, None)
                self.history.pop(key, None)
                self.pending.pop(key, None)
                if self.refused:  # a refusal its resolver never came for
                    for pair in [pair for pair in self.refused if pair[0] == key]:
                        del self.refused[pair]
        except Exception:
            logger.exception("dask_coro promise bookkeeping failed on %r", key)

    def remove_client(self, scheduler: Any, client: str) -> None:
        # A mark whose check never came (its process died between the two).
        for token in [t for t, (c, _) in self.marks.items() if c == client]:
            del self.marks[token]

    # -- resolving -----------------------------------------------------------

    def mark(self, token: str, client: str | None = None, **kwargs: Any) -> None:
        """Stream handler: ``resolve_with``'s mark, after everything its
        client sent before (see the module docstring)."""
        _, arrived = self.marks.setdefault(token, (client, asyncio.Event()))
        arrived.set()

    async def check(
        self,
        promise: Key,
        target: Key,
        resolver: Key | None = None,
        mark: str | None = None,
        upstream: list[Key] | None = None,
        timeout: float = 60,
    ) -> dict[str, Any]:
        """RPC: may ``resolver`` (a task key, or None for a client) point
        ``promise`` at ``target``? ``upstream``: the scheduler keys the
        target's graph depends on (the cycle check starts there). If so the
        grant is kept as pending until the rewiring, which follows on the
        resolver's batched stream, arrives; meanwhile other resolvers' checks
        see ``target`` as the promise's target (``_verdict``). Returns
        ``{"status": "OK"}`` (with ``"repoint": True`` when the resolver is the
        current target), ``{"status": "OK", "noop": True}`` for a rerun of a
        task that already pointed it onwards, or an error."""
        if mark is not None and not await self._arrived(mark, timeout):
            return _error(f"resolving promise {promise!r}: the client's stream did not deliver in {timeout} s")
        verdict = self._verdict(promise, resolver)
        if verdict["status"] == "OK" and not verdict.get("noop"):
            if target == promise:
                return _error(f"promise {promise!r} cannot be resolved with itself")
            cycle = self._path_to(promise, [target, *(upstream or ())], pending=True)
            if cycle:
                return _error(_cycle_message(promise, target, cycle))
            self.pending[promise] = (resolver, target)
        return verdict

    async def _arrived(self, mark: str, timeout: float) -> bool:
        """Wait for ``mark`` on its client's stream, which follows the
        client's earlier messages there; it arrives within the stream's
        batching interval unless the client is gone (then nobody waits for
        the answer). False if it did not within ``timeout``."""
        _, arrived = self.marks.setdefault(mark, (None, asyncio.Event()))
        try:
            await asyncio.wait_for(arrived.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            self.marks.pop(mark, None)
        return True

    async def sent(self, mark: str, timeout: float = 60) -> dict[str, Any]:
        """RPC: once everything the client sent before ``mark`` on its stream
        has been handled (a promise created in a task: its parked task is on
        the scheduler before the task can finish, whose completion travels on
        another connection, and before its result can reach anyone)."""
        if not await self._arrived(mark, timeout):
            return _error(f"a promise's creation: the client's stream did not deliver in {timeout} s")
        return {"status": "OK"}

    def _path_to(self, promise: Key, start: list[Key], pending: bool) -> list[Key] | None:
        """A dependency path from one of ``start`` to ``promise``, if any: the
        walk of the module docstring (with granted rewirings in flight as
        edges when ``pending``). It searches from both ends, upwards from
        ``start`` (dependencies) and downwards from ``promise`` (dependents),
        always extending the side that reached fewer keys so far, so a
        promise with few dependents is checked cheaply against a target with a
        large unfinished graph upstream, and the other way round."""
        tasks = self.scheduler.tasks
        grants: dict[Key, list[Key]] = {}  # target -> promises granted to it
        if pending:
            for q, (_, t) in self.pending.items():
                grants.setdefault(t, []).append(q)
        up: dict[Key, Key | None] = {}  # reached from start -> the key before it
        down: dict[Key, Key | None] = {promise: None}  # reached from promise -> the key after it
        for k in start:
            if k in down:
                return [k]
            up.setdefault(k, None)
        up_todo, down_todo = list(up), [promise]

        def unfinished(k: Key) -> Any:
            ts = tasks.get(k)
            # Not on the scheduler (yet), or final: it waits for nothing.
            return None if ts is None or ts.state in ("memory", "erred") else ts

        while up_todo and down_todo:
            if len(up) + len(down) > CYCLE_WALK_LIMIT:
                logger.warning(
                    "dask_coro: resolving promise %r: more than %d unfinished tasks "
                    "between it and its target; not checked for a dependency cycle",
                    promise, CYCLE_WALK_LIMIT,
                )
                return None
            if len(up) <= len(down):
                k = up_todo.pop()
                ts = unfinished(k)
                if ts is None:
                    continue
                nexts = [dts.key for dts in ts.dependencies]
                grant = self.pending.get(k) if pending else None
                if grant is not None:
                    nexts.append(grant[1])
                for d in nexts:
                    if d not in up:
                        up[d] = k
                        if d in down:
                            return _joined(d, up, down)
                        up_todo.append(d)
            else:
                k = down_todo.pop()
                ts = unfinished(k)
                if ts is None:
                    continue
                nexts = [dts.key for dts in ts.dependents if unfinished(dts.key) is not None]
                nexts.extend(grants.get(k, ()))
                for d in nexts:
                    if d not in down:
                        down[d] = k
                        if d in up:
                            return _joined(d, up, down)
                        down_todo.append(d)
        return None

    def _verdict(self, promise: Key, resolver: Key | None) -> dict[str, Any]:
        ts = self.scheduler.tasks.get(promise)
        if ts is None:
            return _error(
                f"promise {promise!r} is not known to the scheduler: it was cancelled "
                "or released (forgotten), or was never created on this cluster"
            )
        history = self.history.get(promise, ())
        if resolver is not None and resolver in history[:-1]:
            # It pointed the promise onwards, and that took effect: a rerun.
            return {"status": "OK", "noop": True}
        if ts.state in ("memory", "erred"):
            return _error(f"promise {promise!r} already has a final value; it cannot be resolved again")
        current = self.targets.get(promise)
        pending = self.pending.get(promise)
        if pending is not None and (resolver is None or pending[0] != resolver):
            # A grant is on its way: it counts as the target. Only a grant of
            # the same task is superseded (it re-points again, or re-runs after
            # its worker died before the rewiring reached us); a client never
            # re-points.
            current = pending[1]
        if current is not None and resolver != current:
            who = "a client" if resolver is None else f"task {resolver!r}"
            return _error(
                f"{who} may not resolve promise {promise!r}: it points at "
                f"{current!r}, and only that task may point it elsewhere"
            )
        if current is not None:
            return {"status": "OK", "repoint": True}
        return {"status": "OK"}

    async def applied(self, promise: Key, target: Key, timeout: float = 60) -> dict[str, Any]:
        """RPC: wait until the rewiring of ``promise`` to ``target`` sent on a
        batched stream has been handled. A task that re-points the promise it
        is the target of waits for this before it returns: its completion
        travels on the worker's stream and must not overtake the rewiring.
        An error if the rewiring was refused there (a cycle)."""
        refused = self.refused.pop((promise, target), None)
        if refused is not None:
            return _error(refused)
        if target in self.history.get(promise, ()):
            return {"status": "OK"}
        done = self.done.setdefault((promise, target), asyncio.Event())
        try:
            await asyncio.wait_for(done.wait(), timeout)
        except asyncio.TimeoutError:
            return _error(f"promise {promise!r} was not re-pointed to {target!r} in time")
        finally:
            self.done.pop((promise, target), None)
        refused = self.refused.pop((promise, target), None)
        if refused is not None:
            return _error(refused)
        return {"status": "OK"}

    def resolve(self, promise: Key, target: Key, resolver: Key | None = None, **kwargs: Any) -> None:
        """Stream handler: rewire ``promise`` to ``target``, as ``check``
        granted. It comes on the resolver's batched stream right after the
        target's graph, so the scheduler knows the target already
        (``handle_stream`` awaits ``update_graph`` before the next message)."""
        try:
            if self.pending.get(promise) != (resolver, target):
                return  # superseded, or the promise was forgotten meanwhile
            del self.pending[promise]
            s = self.scheduler
            ts, tt = s.tasks.get(promise), s.tasks.get(target)
            if ts is None:
                return
            if tt is None:
                self._fail(promise, f"promise {promise!r}: its target {target!r} is not known to the scheduler", force=True)
                return
            cycle = self._path_to(promise, [target], pending=False)
            if cycle:
                # A resolve racing on another stream closed the loop since
                # ``check``: refuse this edge, fail rather than wait for ever.
                message = _cycle_message(promise, target, cycle)
                if resolver is not None and self.targets.get(promise) == resolver:
                    # A re-pointing: its resolver waits in ``applied`` and
                    # raises, which fails the promise that points at it.
                    self.refused[(promise, target)] = message
                else:
                    self._fail(promise, message, force=True)
                return
            stimulus_id = f"dask-coro-promise-resolve-{time()}"
            detached = ts.dependencies - {tt}
            error = alias_task(s, ts, tt, stimulus_id)
            if error:
                self._fail(promise, f"promise {promise!r}: {error}", force=True)
                return
            for dts in detached:
                self.orphans.add(dts.key)
                if dts.state == "released":
                    self._forget_orphan(dts.key)
            previous = self.targets.get(promise)
            self.history.setdefault(promise, []).append(target)
            self.targets[promise] = target
            self.pointed_by.setdefault(target, set()).add(promise)
            if previous is not None and previous in self.pointed_by:
                self.pointed_by[previous].discard(promise)
        except Exception:
            logger.exception("dask_coro: resolving promise %r with %r failed", promise, target)
        finally:
            done = self.done.get((promise, target))
            if done is not None:
                done.set()

    def _forget_orphan(self, key: Key) -> None:
        s = self.scheduler
        if key not in s.tasks or forget_if_unused(
            s, key, f"dask-coro-promise-orphan-{time()}"
        ):
            self.orphans.discard(key)

    def _fail_later(self, promise: Key, message: str) -> None:
        # Not from inside a transition hook: transitions are not re-entrant.
        self.scheduler.loop.add_callback(self._fail, promise, message)

    def _fail(self, promise: Key, message: str, force: bool = False) -> None:
        s = self.scheduler
        ts = s.tasks.get(promise)
        if ts is None or ts.state != "no-worker" or (promise in self.targets and not force):
            return
        try:
            raise PromiseError(message)  # raised, so that it has a traceback
        except PromiseError as e:
            fail_task(s, promise, e, f"dask-coro-promise-failed-{time()}")


def _joined(meet: Key, up: dict[Key, Key | None], down: dict[Key, Key | None]) -> list[Key]:
    """The path through ``meet``: from a start key up to it, then down to the
    promise (``_path_to``)."""
    path = [meet]
    while (prev := up[path[-1]]) is not None:
        path.append(prev)
    path.reverse()
    while (nxt := down[path[-1]]) is not None:
        path.append(nxt)
    return path


def _cycle_message(promise: Key, target: Key, path: list[Key]) -> str:
    shown = [repr(k) for k in path]
    if len(shown) > 6:
        shown = [*shown[:3], "...", *shown[-2:]]
    return (
        f"promise {promise!r} cannot be resolved with {target!r}: it depends on "
        f"the promise ({' -> '.join(shown)}), a dependency cycle that would wait "
        "for ever"
    )


def _never_resolved(promise: Key, creator: Key) -> str:
    return (
        f"promise {promise!r} was never resolved: the task {creator!r} that "
        "created it finished without calling resolve_with"
    )


def _error(message: str) -> dict[str, Any]:
    return {"status": "error", "message": message}
