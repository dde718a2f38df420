"""What a process keeps of the store: one ``Store`` per setting, and the
threads that read and write it (no distributed)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import _config
from .store import Store

#: The annotation that gives each child of a durable run its root's key.
RUN = "dask_coro_durable_run"

#: Writes of children's results, off the event loop and off the bodies' threads.
WRITES = ThreadPoolExecutor(2, thread_name_prefix="dask-coro-store-write")
#: Reads of the store (a resumed run's children), apart from the writes.
READS = ThreadPoolExecutor(2, thread_name_prefix="dask-coro-store-read")

_STORES: dict[tuple[str, Any], Store] = {}
_LOCK = threading.Lock()


def store_at(location: Any, secret: Any = None) -> Store:
    """The ``Store`` at ``location`` (one per process), its key read."""
    with _LOCK:
        store = _STORES.get((str(location), secret))
        if store is None:
            store = Store(location, secret)
            store.mac_key  # noqa: B018  (its key: made, or checked, now)
            _STORES[(str(location), secret)] = store
        return store


def store_of_settings(store: Any = None) -> Store | None:
    """The store ``store`` names, else ``coro.durability.store``'s (None if
    it is null), with ``coro.durability.store-key``."""
    location = store if store is not None else _config.get("coro.durability.store")
    if location is None:
        return None
    return store_at(location, _config.get("coro.durability.store-key"))
