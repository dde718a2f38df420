"""The runs of a store: ``dask_coro.runs()`` and ``dask_coro.forget_run()``
(no cluster needed)."""

from __future__ import annotations

from typing import Any

from .local import store_of_settings
from .store import RunInfo, Store


def _store(store: Any) -> Store:
    found = store_of_settings(store)
    if found is None:
        raise ValueError(
            "no store given: pass store= (a directory or an fsspec URL) or set coro.durability.store"
        )
    return found


def runs(store: str | None = None) -> list[RunInfo]:
    """The durable runs of ``store`` (default: ``coro.durability.store``),
    the oldest first: each one's root ``key``, ``state`` (``"running"``,
    ``"finished"`` or ``"failed"``), ``started`` and ``ended`` (seconds
    since the epoch), ``children`` stored and ``bytes`` used.

    A run killed with its cluster stays ``"running"`` until it is computed
    again (it resumes) or forgotten."""
    return _store(store).runs()


def forget_run(key: Any, store: str | None = None) -> bool:
    """Delete the run of root ``key`` from ``store`` (default:
    ``coro.durability.store``): its children and its result. Whether there
    was one. Forget a run only when nothing computes it: a run still going
    stores its children again as they finish."""
    return _store(store).forget(key)
