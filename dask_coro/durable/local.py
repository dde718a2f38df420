"""What a process keeps of the store: one ``Store`` per setting, and the
threads that read and write it (no distributed)."""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Executor, Future
from typing import Any

from .. import _config
from .store import Store

#: The annotation that gives each child of a durable run its root's key.
RUN = "dask_coro_durable_run"



class Threads(Executor):
    """Up to ``n`` threads, started as work comes and gone once there is
    none for ``linger`` seconds: a process that stores nothing keeps no
    thread for it."""

    def __init__(self, n: int, name: str, linger: float = 0.2):
        self.n, self.name, self.linger = n, name, linger
        self.queue: collections.deque[tuple[Future[Any], Any, tuple[Any, ...]]] = collections.deque()
        self.cond = threading.Condition()
        self.threads = 0
        self.idle = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        call = (lambda: fn(*args, **kwargs)) if kwargs else fn
        with self.cond:
            self.queue.append((fut, call, () if kwargs else args))
            if self.idle:
                self.cond.notify()
            elif self.threads < self.n:
                self.threads += 1
                threading.Thread(target=self._work, name=f"{self.name}-{self.threads}", daemon=True).start()
        return fut

    def _work(self) -> None:
        while True:
            with self.cond:
                if not self.queue:
                    self.idle += 1
                    self.cond.wait(self.linger)
                    self.idle -= 1
                    if not self.queue:
                        self.threads -= 1
                        return
                fut, fn, args = self.queue.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:
                fut.set_exception(e)


#: Writes of children's results, off the event loop and off the bodies' threads.
WRITES = Threads(2, "dask-coro-store-write")
#: Reads of the store (a resumed run's children), apart from the writes.
READS = Threads(2, "dask-coro-store-read")

_STORES: dict[tuple[str, Any, str], Store] = {}
_LOCK = threading.Lock()


def store_at(location: Any, secret: Any = None, options: Any = None) -> Store:
    """The ``Store`` at ``location`` (one per process), its key read."""
    name = (str(location), secret, repr(options))
    with _LOCK:
        store = _STORES.get(name)
        if store is None:
            store = Store(location, secret, options)
            store.mac_key  # noqa: B018  (its key: made, or checked, now)
            _STORES[name] = store
        return store


def stores() -> list[Store]:
    """The stores this process opened."""
    with _LOCK:
        return list(_STORES.values())


def store_of_settings(store: Any = None) -> Store | None:
    """The store ``store`` names, else ``coro.durability.store``'s (None if
    it is null), with ``coro.durability.store-key`` and
    ``coro.durability.store-options``."""
    location = store if store is not None else _config.get("coro.durability.store")
    if location is None:
        return None
    return store_at(
        location, _config.get("coro.durability.store-key"), _config.get("coro.durability.store-options")
    )
