"""``tie``: a task ties a resource to task keys; the worker end of it.

``tie`` records the release callable on this host (``registry``), installs
the scheduler plugin on first use, and tells the scheduler which key holds
the id. ``hold_segments`` is what a coroutine does with the shared-memory
segments its children returned, before it lets the children go.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

from dask.core import validate_key
from dask.typing import Key
from distributed import get_worker
from distributed.protocol.pickle import dumps
from distributed.utils import sync

from .._context import current_key, on_event_loop
from .._exceptions import DaskCoroError, NotInTaskError
from .._internals.distributed.worker import worker_plugin
from .._internals.distributed.worker_state_machine import worker_knows
from .scheduler import LifetimesPlugin
from .worker import NAME, LifetimesWorkerPlugin


def tie(
    resource_id: str,
    release: Callable[[str], object],
    *,
    key: Key | None = None,
    host_bound: bool = False,
) -> None:
    """Tie a resource to a task key; ``release(resource_id)`` runs once the
    last key tied to it is forgotten by the scheduler.

    Call it inside a task on a distributed worker: ``key`` defaults to the
    running task's key (``current_key()``). Tying one id from several keys
    counts references: the release waits for all of them. It runs on a
    worker, never on the scheduler: the worker that tied the id first, or
    another worker on the same host if that one is gone. It runs exactly once
    in normal operation and at least once when workers die, so it must be
    idempotent. An exception it raises is logged on that worker.

    The id names one resource for the whole cluster: do not reuse an id for a
    new resource (use a uuid). Every tie of an id should pass the same
    ``release``; the latest one is kept.

    Tying to a key the scheduler has already forgotten releases the resource
    at once (when no other key holds it) and warns.

    When the last worker of a host closes, it runs the releases of that host
    whose keys are forgotten. With ``host_bound=True`` (a resource only tasks
    on its host can reach, such as shared memory or a local file) it also
    releases those whose keys are still held, since no task can reach them any
    more; a resource that is not host-bound then waits for its keys to be
    forgotten and a worker of its host to join.

    This blocks for one round trip to the scheduler. From an ``async def``
    function running on the worker's event loop, call it in a thread:
    ``await asyncio.to_thread(tie, ...)``.

    Raises
    ------
    TypeError
        For an id that is not a non-empty string, a ``release`` that is not
        callable, or a key that is not a valid dask key.
    NotInTaskError
        Outside a distributed worker, or with no ``key`` outside a task.
    DaskCoroError
        On the worker's event loop.
    """
    if not isinstance(resource_id, str) or not resource_id:
        raise TypeError(f"tie() needs a non-empty string resource id, got {resource_id!r}")
    if not callable(release):
        raise TypeError(
            f"tie() needs a callable release(resource_id), got {type(release).__name__}: "
            f"{release!r}"
        )
    worker = _worker("tie()")
    if key is None:
        key = current_key()
    else:
        validate_key(key)
    if not _tie(worker, resource_id, release, key, host_bound):
        warnings.warn(
            f"resource {resource_id!r} was tied to key {key!r}, which the scheduler "
            "has already forgotten; it is released now",
            RuntimeWarning,
            stacklevel=2,
        )


def tie_quietly(resource_id: str, release: Callable[[str], object], key: Key) -> bool:
    """``tie`` for host-bound resources dask_coro makes on a worker; answers
    whether the key was alive (if not, the release is already on its way)."""
    return _tie(_worker("tie()"), resource_id, release, key, host_bound=True)


def _tie(
    worker: Any, rid: str, release: Callable[[str], object], key: Key, host_bound: bool
) -> bool:
    plugin = ensure_installed(worker)
    new = plugin.record(rid, release)
    try:
        answer = _sync(
            worker,
            worker.scheduler.dask_coro_tie,
            rids=[rid],
            key=key,
            worker=worker.address,
            host_bound=host_bound,
        )
    except BaseException:
        if new:  # nobody will ask for it
            plugin.forget_record(rid)
        raise
    if worker_knows(worker, key):
        plugin.sent_ties.setdefault(key, set()).add(rid)
    return bool(answer["alive"])


async def hold_segments(worker: Any, key: Key, value: Any) -> None:
    """Tie the shared-memory segments ``value`` holds to ``key``, and wait for
    the scheduler to have them: a coroutine does this with its children's
    results before it releases the children, since its body now holds them."""
    shm = sys.modules.get("dask_coro.lifetimes.shm")
    if shm is None or not shm.any_attached():
        return
    await hold_names(worker, key, shm.segments_in(value))


async def hold_names(worker: Any, key: Key, names: set[str]) -> None:
    """``hold_segments`` of the segments named ``names``."""
    plugin = worker_plugin(worker, NAME)
    sent = plugin.sent_ties.setdefault(key, set()) if plugin is not None else set()
    rids = names - sent
    if rids:
        await worker.scheduler.dask_coro_tie(
            rids=sorted(rids), key=key, worker=worker.address, host_bound=True
        )
        sent.update(rids)


async def tie_names(worker: Any, key: Key, names: list[str]) -> bool:
    """On the worker's loop: tie the segments ``names`` (``shm.reserve``)
    to ``key``; False if the key is forgotten (their releases then run)."""
    answer = await worker.scheduler.dask_coro_tie(
        rids=names, key=key, worker=worker.address, host_bound=True
    )
    return bool(answer["alive"])


async def tie_spares(worker: Any, names: list[str]) -> bool:
    """On the worker's loop: tie the segment names ``names`` to this worker
    itself (``shm.Spares``): released once it leaves, by another worker of
    its host; False if it is not on the scheduler's list."""
    answer = await worker.scheduler.dask_coro_tie(
        rids=names, key=None, worker=worker.address, host_bound=True, spare=True
    )
    return bool(answer["alive"])


def _worker(what: str) -> Any:
    try:
        return get_worker()
    except ValueError:
        raise NotInTaskError(
            f"{what} ties a resource to a key of a distributed cluster; call it "
            "inside a task running on a distributed worker"
        ) from None


def _sync(on: Any, func: Callable[..., Any], **kwargs: Any) -> Any:
    if on_event_loop():
        raise DaskCoroError(
            "tie() waits for the scheduler and cannot run on the worker's event "
            "loop; from async code call it in a thread: "
            "await asyncio.to_thread(dask_coro.tie, ...)"
        )
    return sync(on.loop, func, **kwargs)


def ensure_installed(worker: Any) -> LifetimesWorkerPlugin:
    """This worker's plugin, installing the scheduler plugin on first use
    (one round trip; ``register_scheduler_plugin`` is idempotent)."""
    plugin = worker_plugin(worker, NAME)
    if isinstance(plugin, LifetimesWorkerPlugin) and plugin.ready():
        return plugin

    async def install() -> None:
        await worker.scheduler.register_scheduler_plugin(
            plugin=dumps(LifetimesPlugin()), name=LifetimesPlugin.name, idempotent=True
        )
        answer = await worker.scheduler.dask_coro_lifetimes_ready()
        plugin = worker_plugin(worker, NAME)
        if not isinstance(plugin, LifetimesWorkerPlugin) or not plugin.ready():
            # The scheduler's broadcast missed us (it ignores errors): add it here.
            await worker.plugin_add(LifetimesWorkerPlugin(token=answer["token"]), name=NAME)

    _sync(worker, install)
    out: LifetimesWorkerPlugin = worker_plugin(worker, NAME)
    return out
