"""Scheduler side of ``progress`` and ``tree``: records which coroutine
submitted which tasks (``TreeBook``).

The runner annotates every task a coroutine submits with
``dask_coro_parent=<its key>`` (the runtime's ``PARENT``, which
``TreeExtension.parent`` asks for; ``dask.annotate``, applied by
``Client._graph_to_futures`` to the whole submission); the scheduler hands
annotations to ``SchedulerPlugin.update_graph``. States and compute times come
from ``transition``. Calls run inline (no task) are counted by the workers,
which send what changed on their stream (``CALLS_OP``, ``handle_calls``).

Groups and streams, for the dashboard (``activity.Activity``): a worker
sends a group's children by state (``GROUP_OP``, ``handle_group``);
``StreamPlugin``, in this process, calls ``stream_progress`` and
``stream_ended``.
"""

from __future__ import annotations

import logging
import weakref
from time import time
from typing import Any

from dask.typing import Key
from distributed.diagnostics.plugin import SchedulerPlugin

from .. import _config
from .._internals.distributed.collections import drop_stale_queue_entries
from .._internals.distributed.core import add_handlers
from ..runtime.extensions import children_by_parent
from . import dashboard
from .activity import GROUP_OP, Activity
from .book import CALLS_OP, TreeBook

logger = logging.getLogger("dask_coro")

NAME = "dask-coro-tree"


class TreePlugin(SchedulerPlugin):
    """Installed by the first coroutine that runs on each worker (one round
    trip), by ``client.register_plugin(TreePlugin())`` or by
    ``dask scheduler --preload dask_coro``; installing it again is a no-op."""

    name = NAME
    idempotent = True

    def __init__(self) -> None:
        self.book = TreeBook()
        self.activity = Activity()
        self.scheduler: Any = None
        # Under distributed.scheduler.validate only: TaskStates that left
        # the queue other than to run, while something keeps them alive
        # (see ``_queued_again``), and how often the queue was cleaned.
        # (Made in start: the plugin is pickled to reach the scheduler.)
        self._left_queue: weakref.WeakValueDictionary[Key, Any] | None = None
        self.queue_cleanings = 0

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        if getattr(scheduler, "validate", False):
            self._left_queue = weakref.WeakValueDictionary()
        # Raises a ValueError naming the setting, failing the install and so
        # the coroutine task whose worker installs it (the runner, at first use).
        self.book.max_nodes = int(_config.get_checked("coro.tree.max-nodes"))
        add_handlers(
            scheduler,
            rpc={"dask_coro_tree": self.handle_tree, "dask_coro_progress": self.handle_progress},
            stream={CALLS_OP: self.handle_calls, GROUP_OP: self.handle_group},
        )
        try:
            dashboard.install(scheduler, self.name)
        except Exception:  # the tree works without its page
            logger.exception("dask_coro: could not add the Coroutines page to the scheduler's dashboard")

    # -- hooks ---------------------------------------------------------------

    def update_graph(
        self, scheduler: Any, *, annotations: dict[str, dict[Key, Any]] | None = None, **kwargs: Any
    ) -> None:
        if self._left_queue:
            self._queued_again(scheduler, kwargs.get("tasks") or ())
        now = time()
        for parent, keys in children_by_parent(annotations).items():
            if not self.book.follows(parent) and parent not in scheduler.tasks:
                # Its parent was forgotten (cancelled right after it started)
                # before this submission from its worker arrived: there is no
                # tree to join, and a root made of it would never be forgotten.
                continue
            replays = self.book.children(parent, keys, now)
            if replays:
                old, new = replays[0]
                logger.warning(
                    "coroutine %r re-ran and yielded something else than its first run at "
                    "%d place(s) (e.g. %r instead of %r): the body is not deterministic "
                    "(other calls, arguments or arguments dask cannot tokenize the same "
                    "way twice); those children are computed anew, the first run's are "
                    "not used. tree() shows them as replacing the first run's.",
                    parent, len(replays), new, old,
                )

    def transition(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if self._left_queue is not None and start == "queued" and finish != "processing":
            ts = self.scheduler.tasks.get(key)  # a forgotten one is put back for plugins
            if ts is not None:
                self._left_queue[key] = ts
        if start == "processing" and key in self.activity.parents:
            self.activity.parent_ended(key, finish, time())
        if not self.book.follows(key):
            return
        if finish == "forgotten":
            self.book.forget(key)
            return
        compute = None
        for ss in kwargs.get("startstops") or ():
            if ss.get("action") == "compute":
                compute = (ss["start"], ss["stop"])
        self.book.state(key, finish, time(), compute)

    def _queued_again(self, scheduler: Any, keys: Any) -> None:
        """Keys submitted again whose earlier TaskState left the queue
        without running and is still alive: clean the queue's heap of it.

        A coroutine re-run elsewhere submits its children again under the
        same keys (by design), and the first run's may have been queued and
        forgotten meanwhile. distributed's queue then finds the forgotten
        TaskState, equal to the new one by key (dask/distributed #7504), and
        ``stimulus_queue_slots_maybe_opened`` asserts on it under validation
        (without validation it moves the key's new task, rightly, and drops
        the stale entry). Only under validation, and only when such a
        TaskState is alive (a weak reference, which its last holder lets
        go of): O(queue) per submission that meets one."""
        left = self._left_queue
        assert left is not None
        for k in keys:
            old = left.get(k)
            if old is not None and scheduler.tasks.get(k) is not old:
                del left[k]
                if drop_stale_queue_entries(scheduler):
                    self.queue_cleanings += 1
                    logger.debug("dask_coro: queue entry of a forgotten task %r dropped", k)

    # -- handlers ------------------------------------------------------------

    def handle_calls(self, key: Key, calls: dict[str, list[int]], **kwargs: Any) -> None:
        """A worker's report of the calls the run of ``key`` ran inline."""
        if key not in self.scheduler.tasks:
            return  # forgotten meanwhile (a root's tree went with it)
        try:
            self.book.calls(key, calls, time())
        except Exception:  # a bad message must not close the worker's stream
            logger.exception("dask_coro: bad inline-call counts for %r: %r", key, calls)

    def handle_group(
        self, key: Key, group: int, counts: list[int], limit: int | None = None, closed: bool = False,
        **kwargs: Any,
    ) -> None:
        """A worker's report of group ``group`` of the coroutine ``key``:
        its children by state (``activity.GROUP_STATES``)."""
        ts = self.scheduler.tasks.get(key)
        if ts is None or ts.state != "processing":
            # Sent before its parent's end, which came first: over.
            if (key, group) not in self.activity.groups:
                return
            closed = True
        try:
            self.activity.group(key, group, counts, limit, closed, time())
        except Exception:  # a bad message must not close the worker's stream
            logger.exception("dask_coro: bad group counts for %r: %r", key, counts)

    def stream_progress(self, producer: Key, produced: int, taken: int, buffer: int | None = None) -> None:
        """Stream ``producer`` published ``produced`` items, its consumer took ``taken``."""
        self.activity.stream(producer, produced, taken, time(), buffer)

    def stream_ended(self, producer: Key, state: str | None) -> None:
        """Stream ``producer``'s task ended in ``state`` (None: it runs again)."""
        self.activity.stream_ended(producer, state, time())

    def _state(self, key: Key) -> str:
        ts = self.scheduler.tasks.get(key)
        return "forgotten" if ts is None else ts.state

    def handle_tree(self, key: Key) -> dict[str, Any]:
        root = self.book.root_of(key)
        state = self._state(key)
        nodes = self.book.subtree(key)
        counts = self.book.counts(root) if root is not None else None
        if not nodes and state != "forgotten":
            # A task that submitted nothing (its calls all ran inline, or it
            # has not yielded yet): a tree of one node. (Its compute times are
            # not recorded: only children's transitions are followed.)
            nodes = [(key, None, 0, state, time(), None, None)]
            counts = {"spawned": 0, "done": 0, "failed": 0, "depth": 0, "untracked": 0, "replayed": 0}
            root = key
        functions = (self.book.functions(root) if root is not None else None) or {}
        return {
            "key": key,
            "state": state,
            "nodes": nodes,
            "counts": counts,
            "root": root,
            "functions": functions,
        }

    def handle_progress(self, keys: list[Key]) -> list[dict[str, Any]]:
        return [
            {
                "key": key,
                "state": self._state(key),
                "counts": self.book.counts(key),
                "functions": self.book.functions(key) or {},
            }
            for key in keys
        ]
