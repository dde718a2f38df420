"""The release registry: release callables recorded on the host they were
tied on.

A release callable stays on its host: ``tie`` writes it, pickled, to a
per-cluster folder under dask's temporary directory, named by a hash of the
resource id. When the scheduler asks a worker to release an id, the worker
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
import socket
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import dask
from distributed.comm.addressing import get_address_host_port
from distributed.core import rpc
from distributed.protocol.pickle import dumps, loads

logger = logging.getLogger("dask_coro")


def registry_root() -> str:
    base = dask.config.get("temporary-directory", None) or tempfile.gettempdir()
    user = str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return os.path.join(base, f"dask-coro-{user}", "ties")


def registry_dir(token: str) -> str:
    return os.path.join(registry_root(), token)


# A record: the scheduler's address on the first line, then the pickled
# (resource id, release). The address lets release_abandoned ask whether the
# cluster is still there without unpickling anything.


def write_record(path: str, scheduler: str, rid: str, release: Callable[[str], object]) -> bool:
    data = scheduler.encode() + b"\n" + dumps((rid, release))
    tmp = f"{path}.{os.getpid()}.{threading.get_ident():x}.tmp"
    for attempt in range(3):
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            break
        # The folder was removed as it emptied (``run_record``): before the
        # open, or inside makedirs, between its mkdir (EEXIST) and its
        # check that the folder is there (FileExistsError).
        except (FileNotFoundError, FileExistsError):
            if attempt == 2:
                raise
    new = not os.path.exists(path)
    os.replace(tmp, path)  # atomic: a reader sees the old or the new file
    return new


def run_record(path: str, rid: str | None, where: str) -> str | None:
    """Run the release recorded at ``path`` and remove it; answers its id,
    or None if there was nothing to run."""
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
        remove_record(path)
    return rid


def remove_record(path: str) -> None:
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
            rid = run_record(path, None, "this host")
            if rid is not None:
                released.append(rid)
        for name in names:  # writes the crash cut short
            remove_record(os.path.join(folder, name))
    return released


def release_cluster(token: str, timeout: float = 1.0) -> list[str]:
    """Run the releases recorded on this host for the cluster ``token`` if
    its scheduler is gone (as ``release_abandoned`` tells); the ids run."""
    folder = registry_dir(token)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    records = [os.path.join(folder, n) for n in names if not n.endswith(".tmp")]
    if not records:
        return []
    try:
        with open(records[0], "rb") as f:
            address = f.readline(1000).decode(errors="replace").strip()
    except FileNotFoundError:
        return []
    if "://" not in address or not _is_gone(address, token, timeout):
        return []
    released = []
    for path in records:
        rid = run_record(path, None, "this host")
        if rid is not None:
            released.append(rid)
    return released


def _is_gone(address: str, token: str, timeout: float) -> bool:
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


def file_name(rid: str) -> str:
    return hashlib.blake2b(rid.encode(), digest_size=16).hexdigest()
