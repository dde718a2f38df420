"""Worker side of lifetimes: ``tie``, the release registry, and the worker plugin.

A release callable stays on the host it was tied on: ``tie`` writes it, pickled,
to a per-cluster folder under dask's temporary directory, named by a hash of
the resource id. When the scheduler asks a worker to release an id, the worker
runs the callable it finds there and deletes the file. Because the folder is
per host rather than per worker process, another worker on the same host can
run the release of a worker that died; the file going away is what makes a
second run (after a worker died mid-release) find nothing to do. A record
starts with the scheduler's address, so ``release_abandoned`` can run the
records of a cluster that was killed without unpickling anything first.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Hashable
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .._config import get_timedelta
from .._context import current_key
from .._exceptions import DaskCoroError, NotInTaskError

logger = logging.getLogger("dask_coro")

Key = Hashable
NAME = "dask-coro-lifetimes"


def _closing_states() -> frozenset[Any]:
    from distributed.core import Status

    return frozenset({Status.closing, Status.closing_gracefully, Status.closed})


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
        from dask.core import validate_key

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
    if key in worker.state.tasks:  # popped when the key leaves this worker
        plugin.sent_ties.setdefault(key, set()).add(rid)
    return bool(answer["alive"])


async def hold_segments(worker: Any, key: Key, value: Any) -> None:
    """Tie the shared-memory segments ``value`` holds to ``key``, and wait for
    the scheduler to have them: a coroutine does this with its children's
    results before it releases the children, since its body now holds them."""
    shm = sys.modules.get("dask_coro.lifetimes.shm")
    if shm is None or not shm.any_attached():
        return
    plugin = worker.plugins.get(NAME)
    sent = plugin.sent_ties.setdefault(key, set()) if plugin is not None else set()
    rids = shm.segments_in(value) - sent
    if rids:
        await worker.scheduler.dask_coro_tie(
            rids=sorted(rids), key=key, worker=worker.address, host_bound=True
        )
        sent.update(rids)


def _worker(what: str) -> Any:
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:
        raise NotInTaskError(
            f"{what} ties a resource to a key of a distributed cluster; call it "
            "inside a task running on a distributed worker"
        ) from None


def _sync(on: Any, func: Callable[..., Any], **kwargs: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise DaskCoroError(
            "tie() waits for the scheduler and cannot run on the worker's event "
            "loop; from async code call it in a thread: "
            "await asyncio.to_thread(dask_coro.tie, ...)"
        )
    from distributed.utils import sync

    return sync(on.loop, func, **kwargs)


def ensure_installed(worker: Any) -> LifetimesWorkerPlugin:
    """This worker's plugin, installing the scheduler plugin on first use
    (one round trip; ``register_scheduler_plugin`` is idempotent)."""
    plugin = worker.plugins.get(NAME)
    if isinstance(plugin, LifetimesWorkerPlugin) and plugin.token is not None:
        return plugin

    async def install() -> None:
        from distributed.protocol.pickle import dumps

        from .scheduler import LifetimesPlugin

        await worker.scheduler.register_scheduler_plugin(
            plugin=dumps(LifetimesPlugin()), name=LifetimesPlugin.name, idempotent=True
        )
        answer = await worker.scheduler.dask_coro_lifetimes_ready()
        plugin = worker.plugins.get(NAME)
        if not isinstance(plugin, LifetimesWorkerPlugin) or plugin.token is None:
            # The scheduler's broadcast missed us (it ignores errors): add it here.
            await worker.plugin_add(LifetimesWorkerPlugin(token=answer["token"]), name=NAME)

    _sync(worker, install)
    return worker.plugins[NAME]


def registry_root() -> str:
    import dask

    base = dask.config.get("temporary-directory", None) or tempfile.gettempdir()
    user = str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return os.path.join(base, f"dask-coro-{user}", "ties")


def registry_dir(token: str) -> str:
    return os.path.join(registry_root(), token)


# A record: the scheduler's address on the first line, then the pickled
# (resource id, release). The address lets release_abandoned ask whether the
# cluster is still there without unpickling anything.


def _write_record(path: str, scheduler: str, rid: str, release: Callable[[str], object]) -> bool:
    from distributed.protocol.pickle import dumps

    data = scheduler.encode() + b"\n" + dumps((rid, release))
    tmp = f"{path}.{os.getpid()}.{threading.get_ident():x}.tmp"
    for attempt in range(3):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            break
        except FileNotFoundError:  # the folder was removed as it emptied
            if attempt == 2:
                raise
    new = not os.path.exists(path)
    os.replace(tmp, path)  # atomic: a reader sees the old or the new file
    return new


def _run_record(path: str, rid: str | None, where: str) -> str | None:
    """Run the release recorded at ``path`` and remove it; answers its id,
    or None if there was nothing to run."""
    from distributed.protocol.pickle import loads

    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        stored, release = loads(data.split(b"\n", 1)[1])
        if rid is not None and stored != rid:
            raise RuntimeError(f"record {path!r} holds {stored!r}, not {rid!r}")
        rid = stored
        release(stored)
    except Exception:
        logger.exception("release of resource %r failed on %s", rid, where)
    finally:
        _remove_record(path)
    return rid


def _remove_record(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        return
    try:
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass  # not empty


def release_abandoned(timeout: float = 5.0) -> list[str]:
    """Run the releases recorded on this host by clusters that are gone.

    A release waits for a worker of its host; if a whole cluster died (killed,
    not closed), its releases stay recorded on disk and its resources (shared
    memory included) stay allocated. This runs them, for every cluster whose
    scheduler refuses connections or answers with another identity, and leaves
    alone any cluster it cannot rule out (a timeout, TLS). Returns the ids
    released. Also: ``python -m dask_coro --release-abandoned``.
    """
    root = registry_root()
    try:
        tokens = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    released: list[str] = []
    for token in tokens:
        folder = os.path.join(root, token)
        try:  # a folder goes away as its last record does, maybe meanwhile
            names = sorted(os.listdir(folder))
            records = [os.path.join(folder, n) for n in names if not n.endswith(".tmp")]
            if not records:
                continue
            with open(records[0], "rb") as f:
                address = f.readline(1000).decode(errors="replace").strip()
        except FileNotFoundError:
            continue
        if "://" not in address:
            logger.info("%s holds no dask_coro release records; left alone", folder)
            continue
        if not _is_gone(address, token, timeout):
            continue
        logger.info("cluster %s at %s is gone: running its %d releases", token, address, len(records))
        for path in records:
            rid = _run_record(path, None, "this host")
            if rid is not None:
                released.append(rid)
        for name in names:  # writes the crash cut short
            _remove_record(os.path.join(folder, name))
    return released


def _is_gone(address: str, token: str, timeout: float) -> bool:
    import socket

    from distributed.comm.addressing import get_address_host_port
    from distributed.core import rpc

    try:
        host, port = get_address_host_port(address)
        socket.create_connection((host, port), timeout=timeout).close()
    except ConnectionRefusedError:
        return True  # nothing listens there any more
    except Exception as e:  # cannot tell: keep
        logger.info("cannot tell whether %s is gone (%r); keeping its releases", address, e)
        return False

    async def identity() -> Any:
        async with rpc(address, timeout=timeout) as scheduler:
            return await scheduler.identity()

    try:
        answer = asyncio.run(identity())
    except Exception as e:
        logger.info("cannot tell whether %s is gone (%r); keeping its releases", address, e)
        return False
    return answer.get("id") != token  # another scheduler on that port


def _file_name(rid: str) -> str:
    return hashlib.blake2b(rid.encode(), digest_size=16).hexdigest()


class LifetimesWorkerPlugin(WorkerPlugin):
    """Runs releases the scheduler hands out, and ties the ids a finished
    task's result holds (shared-memory arrays) to that task's key."""

    name = NAME

    def __init__(self, token: str | None = None) -> None:
        self.token = token  # the scheduler's id, names this cluster's registry
        self.worker: Any = None
        # ids this worker has told the scheduler a key ties (drops duplicates)
        self.sent_ties: dict[Key, set[str]] = {}

    def setup(self, worker: Any) -> None:
        self.worker = worker
        worker.handlers["dask_coro_release"] = self.release

    async def teardown(self, worker: Any) -> None:
        # The release handler stays: a closing worker is still on the
        # scheduler's list and may be handed a release until it has left (a
        # replacing plugin's setup takes the handler over).
        if worker.status not in _closing_states():
            return  # replaced by a new registration, not closing
        # Worker.close tears plugins down while the scheduler still reaches
        # us: if we are the last worker of this host, run its releases now.
        # Read outside the try: a bad setting is an error, not a slow scheduler.
        timeout = get_timedelta("coro.lifetimes.leave-timeout")
        try:
            rids = await asyncio.wait_for(
                worker.scheduler.dask_coro_lifetimes_leaving(worker=worker.address),
                timeout,
            )
        except Exception as e:  # scheduler gone or too slow: they wait for a worker
            logger.info("closing worker %s could not ask for releases: %r", worker.address, e)
            return
        if rids:
            await self.release(rids)

    # -- registry ------------------------------------------------------------

    def _path(self, rid: str) -> str:
        assert self.token is not None
        return os.path.join(registry_dir(self.token), _file_name(rid))

    def record(self, rid: str, release: Callable[[str], object]) -> bool:
        """Write ``release`` for ``rid`` on this host; answers whether it is new."""
        return _write_record(self._path(rid), self.worker.scheduler.address, rid, release)

    def forget_record(self, rid: str) -> None:
        _remove_record(self._path(rid))

    async def release(self, rids: list[str]) -> None:
        from distributed.utils import offload
        from distributed.worker import _worker_cvar

        # get_worker() works in a release, as in a task (Worker.execute sets
        # the same context variable; offload copies the context).
        token = _worker_cvar.set(self.worker)
        try:
            for rid in rids:
                await offload(self._release_one, rid)
        finally:
            _worker_cvar.reset(token)

    def _release_one(self, rid: str) -> None:
        # Nothing recorded: released already by a worker that died before
        # acknowledging, or tied on a host whose registry we cannot see.
        if _run_record(self._path(rid), rid, self.worker.address) is None:
            logger.debug("release of %r: nothing recorded on this host", rid)

    # -- results that hold resources -----------------------------------------

    def transition(self, key: Key, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "memory" and start in ("executing", "long-running"):
            shm = sys.modules.get("dask_coro.lifetimes.shm")
            if shm is None or not shm.any_attached():
                return
            data = self.worker.data
            value = data.fast.get(key) if hasattr(data, "fast") else data.get(key)
            rids = shm.segments_in(value) - self.sent_ties.get(key, set())
            if rids:
                self.sent_ties.setdefault(key, set()).update(rids)
                # Ordered before this task's task-finished message, which the
                # worker sends after its transition hooks ran
                # (WorkerState._transition -> _notify_plugins, then
                # Worker._handle_instructions).
                self.worker.batched_stream.send(
                    {"op": "dask-coro-tie", "rids": sorted(rids), "key": key}
                )
        elif finish in ("released", "forgotten"):
            self.sent_ties.pop(key, None)
