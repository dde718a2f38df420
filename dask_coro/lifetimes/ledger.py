"""The lifetimes ledger: which resources are tied to which keys, and which
releases are owed to which worker. Pure: events in, releases out.

A resource id is held by a set of keys. When the last of them is forgotten the
id's release is *owed*; a host-bound id (shared memory: its content is the
key's result) already when no worker holds the result any more (the key is
released or erred). ``assign`` hands owed releases to live workers: the one
that first tied the id if it is alive, else another worker on the same host
(resources such as shared memory belong to a host), else the release waits for
a worker on that host to join. A release handed out is *sent* until the worker
acknowledges it; if the worker leaves first, or the call fails, it is owed
again. So a release runs once in normal operation and at least once when
workers die, never while a key holds the id, with one exception: when the last
worker of a host leaves, it takes every release of that host that is owed or
sent, and those of host-bound ids even if keys still hold them (``host_emptied``).

The scheduler plugin (``_lifetimes_scheduler``) feeds this from scheduler
events; it keeps only ids, keys, hosts and worker addresses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the type checker only: this module does not import dask
    from dask.typing import Key


@dataclass(frozen=True)
class Origin:
    """Where a resource lives: its host, and the worker that tied it first.
    A host-bound resource (shared memory) is of no use once its host has no
    worker: no task can reach it."""

    host: str
    worker: str
    host_bound: bool = False


_UNBOUND = Origin("", "")


class Ledger:
    def __init__(self) -> None:
        self._holders: dict[str, set[Key]] = {}  # id -> keys tying it
        self._ids: dict[Key, set[str]] = {}  # key -> ids it ties
        self._origin: dict[str, Origin] = {}  # id -> where it lives (tied or owed)
        self._owed: set[str] = set()  # releases to hand out
        self._sent: dict[str, str] = {}  # id -> worker running its release
        # Indexes, so that a worker or host leaving costs O(its own ids):
        self._sent_to: dict[str, set[str]] = {}  # worker -> ids in _sent to it
        self._on_host: dict[str, set[str]] = {}  # host -> ids in _origin there
        # id -> the worker whose release call for it failed or hung last: once
        # its own worker is gone, the next hand-out asks another worker of the
        # host first (a worker that has just joined in a dead one's place may
        # not answer yet; sorted first, it was asked again and again and the
        # others never).
        self._failed_on: dict[str, str] = {}

    # -- events in -----------------------------------------------------------

    def tie(self, rid: str, key: Key, origin: Origin, *, key_alive: bool = True) -> None:
        """``key`` ties ``rid``. A key that is no longer alive ties nothing: if
        no live key holds ``rid`` either, its release is owed at once."""
        if rid not in self._origin:
            self._origin[rid] = origin
            self._on_host.setdefault(origin.host, set()).add(rid)
        if not key_alive:
            if not self._holders.get(rid) and rid not in self._sent:
                self._owed.add(rid)
            return
        # Tied again before its release was handed out: the resource is alive
        # and held, so the release is no longer owed. (Once sent it cannot be
        # recalled: resource ids must not be reused, see ``dask_coro.tie``.)
        self._owed.discard(rid)
        self._holders.setdefault(rid, set()).add(key)
        self._ids.setdefault(key, set()).add(rid)

    def forget(self, key: Key) -> None:
        """``key`` was forgotten by the scheduler."""
        for rid in self._ids.pop(key, ()):
            holders = self._holders[rid]
            holders.discard(key)
            if not holders:
                del self._holders[rid]
                self._owed.add(rid)

    def untie(self, rid: str, key: Key) -> None:
        """``key`` no longer ties ``rid`` (handed over to another key, or let
        go of): its release is owed if no other key holds it."""
        ids = self._ids.get(key)
        if ids is None or rid not in ids:
            return
        ids.discard(rid)
        if not ids:
            del self._ids[key]
        holders = self._holders[rid]
        holders.discard(key)
        if not holders:
            del self._holders[rid]
            self._owed.add(rid)

    def data_gone(self, key: Key) -> None:
        """``key``'s result is held by no worker any more (released, or
        erred): the host-bound ids it ties (shared memory, whose content is
        that result) are no longer held by it; the others wait for
        ``forget``. A recompute of the key makes new ones."""
        ids = self._ids.get(key)
        if not ids:
            return
        for rid in [r for r in ids if self._origin.get(r, _UNBOUND).host_bound]:
            ids.discard(rid)
            holders = self._holders[rid]
            holders.discard(key)
            if not holders:
                del self._holders[rid]
                self._owed.add(rid)
        if not ids:
            del self._ids[key]

    def forget_all(self) -> None:
        """Every key was forgotten at once (``Scheduler.restart``)."""
        for key in list(self._ids):
            self.forget(key)

    def worker_left(self, worker: str) -> None:
        """Releases sent to ``worker`` and not acknowledged are owed again."""
        for rid in self._sent_to.pop(worker, ()):
            del self._sent[rid]
            self._owed.add(rid)

    def acknowledged(self, worker: str, rids: Iterable[str]) -> None:
        """``worker`` ran these releases (or found nothing to do)."""
        for rid in rids:
            if self._sent.get(rid) == worker:
                self._unsend(rid)
                if rid not in self._holders and rid not in self._owed:
                    self._drop_origin(rid)

    def failed(self, worker: str, rids: Iterable[str]) -> None:
        """The call that carried these releases to ``worker`` failed; owe them
        again (unless they were handed to another worker meanwhile)."""
        for rid in rids:
            if self._sent.get(rid) == worker:
                self._unsend(rid)
                self._owed.add(rid)
                self._failed_on[rid] = worker

    def host_emptied(self, host: str) -> list[str]:
        """The last worker of ``host`` is leaving: the ids it must release now.
        They leave the ledger."""
        out = []
        for rid in list(self._on_host.get(host, ())):
            origin = self._origin[rid]
            held = bool(self._holders.get(rid))
            if held and not origin.host_bound:
                continue  # may still be reached; waits for its keys and a worker
            for key in self._holders.pop(rid, ()):
                ids = self._ids[key]
                ids.discard(rid)
                if not ids:
                    del self._ids[key]
            self._owed.discard(rid)
            if rid in self._sent:
                self._unsend(rid)
            self._drop_origin(rid)
            out.append(rid)
        return sorted(out)

    def _unsend(self, rid: str) -> None:
        to = self._sent.pop(rid)
        rids = self._sent_to[to]
        rids.discard(rid)
        if not rids:
            del self._sent_to[to]

    def _drop_origin(self, rid: str) -> None:
        self._failed_on.pop(rid, None)
        host = self._origin.pop(rid).host
        rids = self._on_host[host]
        rids.discard(rid)
        if not rids:
            del self._on_host[host]

    # -- releases out --------------------------------------------------------

    def assign(self, workers: Mapping[str, str]) -> dict[str, list[str]]:
        """Hand owed releases to workers, given live ``{address: host}``.
        Returns ``{worker: [ids]}``; those ids are *sent* until acknowledged
        or failed. Releases with no live worker on their host stay owed."""
        by_host: dict[str, list[str]] = {}
        for address in sorted(workers):
            by_host.setdefault(workers[address], []).append(address)
        out: dict[str, list[str]] = {}
        for rid in sorted(self._owed):
            origin = self._origin[rid]
            here = by_host.get(origin.host)
            if origin.worker in workers:
                to = origin.worker  # its own worker, while alive, whatever failed
            elif here:
                others = [w for w in here if w != self._failed_on.get(rid)]
                to = (others or here)[0]
            else:
                continue
            self._owed.discard(rid)
            if rid in self._sent:  # owed again while a release was out
                self._unsend(rid)
            self._sent[rid] = to
            self._sent_to.setdefault(to, set()).add(rid)
            out.setdefault(to, []).append(rid)
        return out

    # -- views ---------------------------------------------------------------

    def holders(self, rid: str) -> frozenset[Key]:
        return frozenset(self._holders.get(rid, ()))

    def ids_of(self, key: Key) -> frozenset[str]:
        return frozenset(self._ids.get(key, ()))

    def ties(self, key: Key) -> bool:
        """Whether ``key`` ties anything (cheap; asked for every forgotten key)."""
        return key in self._ids

    @property
    def owed(self) -> frozenset[str]:
        return frozenset(self._owed)

    @property
    def sent(self) -> Mapping[str, str]:
        return dict(self._sent)

    def waiting_hosts(self, workers: Mapping[str, str]) -> set[str]:
        """Hosts with owed releases and no live worker to run them."""
        hosts = set(workers.values())
        return {
            self._origin[rid].host
            for rid in self._owed
            if self._origin[rid].worker not in workers and self._origin[rid].host not in hosts
        }

    def __bool__(self) -> bool:
        return bool(self._holders or self._owed or self._sent)

    def __repr__(self) -> str:
        return (
            f"<Ledger: {len(self._holders)} tied, {len(self._owed)} owed, "
            f"{len(self._sent)} being released>"
        )
