"""A promise before it is resolved: a task parked behind a resource no worker
has (pure; the client makes it, the scheduler plugin recognises it)."""

from __future__ import annotations

from typing import Any

from dask.typing import Key

from .._exceptions import PromiseError

#: The resource that parks an unresolved promise; no worker has it.
PARK_RESOURCE = "dask-coro-unresolved-promise"


def unresolved(key: Key, creator: Key | None) -> Any:
    """The run_spec of a parked promise. It runs only if a worker claims the
    parking resource, or under a local scheduler."""
    raise PromiseError(
        f"promise {key!r} was computed before it was resolved, outside a "
        "distributed cluster that parks it; a Promise needs a distributed Client"
    )
