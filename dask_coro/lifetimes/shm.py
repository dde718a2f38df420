"""NumPy arrays in POSIX shared memory whose lifetime follows task keys.

Inside a task on a distributed worker, ``empty``, ``zeros`` and ``from_array``
create a segment, tie it to the running task's key (``dask_coro.tie``) and
return a ``ShmArray`` that views it. The array pickles as a small handle
(segment name, shape, dtype, strides, offset); unpickled in another process on
the same host it maps the same memory, without a copy, and writes are seen by
every process. A task whose result holds such an array (itself, a view of it,
or inside a list, tuple or dict) keeps the segment alive as well. The segment
is unlinked when the last key holding it is forgotten; processes that still map
it keep their mapping until they drop their arrays. (A stream's item made from
a ``Pool`` is given back to its producer instead, under a new name: reused only
once no process maps it.)

Outside a distributed worker (a local scheduler, plain Python) the segment
lives as long as the arrays created in this process, and is unlinked when the
last of them is garbage collected or the process exits.

Across hosts: a worker sending a shared array to a worker of another host
(distributed's ``get_data``, whose ``who`` names the host asking) sends the
segment's bytes. The first worker of that host to receive them writes them
into a segment of that host (``<name>-c``, published whole with a hard link,
so another worker of the host never maps a half-written copy), and every
worker of the host maps that one copy. Its release is recorded on its host and
it is tied to the key it arrived as, so it goes with that key (host-bound, as
the original). A client on another host gets a plain array.

Segments are named ``dask-coro-<hex>``; ``segments()`` lists those on this
host, so a leak can be found (``ls /dev/shm/dask-coro-*`` on Linux).

NumPy is needed: the ``shm`` extra (``pip install ".[shm]"`` from a clone).
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import os
import sys
import threading
import time
import uuid
import weakref
from typing import Any, Literal

import numpy as np

from .._exceptions import DaskCoroError
from .handles import recipient_host, shm_as_handles

if sys.platform.startswith("linux"):
    import fcntl
else:  # no segments given back (``Pool``), so no locks to take
    fcntl = None  # type: ignore[assignment]

__all__ = ["PREFIX", "ShmArray", "empty", "from_array", "segments", "zeros"]

#: Every segment's name starts with this.
PREFIX = "dask-coro-"

_lock = threading.Lock()
#: Segments mapped in this process, by name.
_mapped: weakref.WeakValueDictionary[str, _Segment] = weakref.WeakValueDictionary()
#: Mapped segments whose lifetime the cluster manages (they may be in results).
_managed: weakref.WeakSet[_Segment] = weakref.WeakSet()
#: Names reserved in this process (``reserve``), their releases recorded and
#: tied, not made yet: a release run meanwhile takes the name out.
_reserved: set[str] = set()
#: Segments made ahead under reserved names (``prepare``), not used yet.
_prepared: dict[str, _Segment] = {}
#: Segments made from a ``Pool``'s names, by name: a release of one run in
#: this process gives it back to its pool (``_unlink``).
_made_by: dict[str, Pool] = {}
#: Segments given back to a pool under one of its names, by name: their size.
_returned: dict[str, int] = {}
#: Segments copied into again instead of made anew (``copy_into``), and
#: given back but still mapped somewhere then.
reused = [0]
busy = [0]
#: Items handed over in the segment their array was made in (``hand_over``).
handed = [0]


def _posix() -> Any:
    try:
        import _posixshmem
    except ImportError:  # Windows
        raise DaskCoroError("POSIX shared memory is not available on this platform") from None
    return _posixshmem


def _unlink(name: str) -> None:
    """Release of a segment: unlink its name (and a sending marker a worker
    that died mid-send left for it: ``sending_to``). Idempotent. A name
    reserved in this process and not made yet never will be (``copy_into``).
    A segment made from a pool that is still open in this process is given
    back to it instead (``Pool``): renamed to one of its names not made yet,
    so its name is gone as by an unlink, its pages are not."""
    with _lock:  # as one with ``prepare`` and ``copy_into``
        _reserved.discard(name)
        _prepared.pop(name, None)
        _returned.pop(name, None)
        pool = _made_by.pop(name, None)
        spares.drop(name)  # a spare's own release: its worker left, or the cluster closes
        if pool is not None and name in pool.armed:
            pool.retire(name)  # an array of the producer's may live in it: never a spare
        if pool is None or not pool.give_back(name):
            # Else kept for a later stream of this process (``Spares``).
            mapping = pool.maps.pop(name, None) if pool is not None else None
            if mapping is None or not spares.keep(name, mapping):
                if mapping is not None:
                    os.close(mapping[1])
                del mapping
                try:
                    _posix().shm_unlink("/" + name)
                except FileNotFoundError:
                    pass
    try:
        entries = os.listdir(_SHM_DIR)
    except FileNotFoundError:
        return
    # ``_marker``, and one half made (``_marker_file``): one listing, not a
    # glob per pattern (a release runs per item of a stream).
    tail = "." + name
    for entry in entries:
        if entry.startswith("dask-coro.to-") and (entry.endswith(tail) or tail + "." in entry):
            try:
                os.unlink(os.path.join(_SHM_DIR, entry))
            except FileNotFoundError:
                pass


class _Segment:
    """One mapping of a named segment in this process. The arrays viewing it
    keep it (and so the mapping) alive."""

    __slots__ = ("__weakref__", "address", "managed", "mm", "name", "origin", "size")

    def __init__(self, name: str, mm: mmap.mmap, managed: bool, origin: str | None = None) -> None:
        self.name = name
        self.origin = origin or name  # the segment this one copies (itself if none)
        self.mm = mm
        self.size = len(mm)
        self.managed = managed
        self.address = np.frombuffer(mm, dtype=np.uint8).__array_interface__["data"][0]

    def holds(self, a: np.ndarray) -> bool:
        start = a.__array_interface__["data"][0]
        return self.address <= start < self.address + self.size or (
            a.size == 0 and start == self.address + self.size
        )

    def array(self, shape: Any, dtype: Any, strides: Any, offset: int) -> ShmArray:
        base = np.ndarray(shape, dtype, buffer=self.mm, offset=offset, strides=strides)
        out = base.view(ShmArray)
        out._segment = self
        return out


def _create(nbytes: int) -> _Segment:
    key: Any = None
    managed = False
    name = new_name()
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        worker = None
    if worker is not None:
        from .._context import current_key
        from .tie import tie_quietly  # imports distributed: only on a worker

        key = current_key()
        # Tied before it exists: a worker dying between the two leaves a
        # release with nothing to unlink, never a segment nobody releases.
        managed = tie_quietly(name, _unlink, key)
    mm = _open_new(name, nbytes)
    segment = _Segment(name, mm, managed=managed)
    with _lock:
        _mapped[name] = segment
        if managed:
            _managed.add(segment)
    if not managed:
        # Local lifetime (no cluster, or a key already forgotten): unlink when
        # this process drops its last array over it, or exits.
        weakref.finalize(segment, _unlink, name)
    return segment


def new_name() -> str:
    """A new segment name (short: macOS allows 31 characters)."""
    return PREFIX + uuid.uuid4().hex[:16]


def reserve(worker: Any, n: int) -> list[str]:
    """Names for ``n`` segments to make later (``copy_into``), their releases
    recorded on this host (in a task's thread: the first call installs the
    plugins). Tie them (``tie.tie_names``) before making them: a worker dying
    at any point then leaves a release the cluster runs, never a segment
    nobody releases."""
    from .tie import ensure_installed

    plugin = ensure_installed(worker)
    names = [new_name() for _ in range(n)]
    with _lock:
        _reserved.update(names)
    for name in names:
        plugin.record(name, _unlink)
    return names


def _mapping(fd: int) -> None:
    """Mark the segment open at ``fd`` as mapped by this process while the
    mapping made from ``fd`` lives (a shared ``flock``: the mapping keeps a
    duplicate of ``fd``, and the lock with it). A pool copies a later item
    into a segment given back to it only if no process holds one (``Pool``)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_SH)


def _open_new(name: str, nbytes: int) -> mmap.mmap:
    fd = _posix().shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, max(nbytes, 1))  # zero-filled; mmap refuses length 0
        _mapping(fd)
        return mmap.mmap(fd, max(nbytes, 1))
    except BaseException:
        _unlink(name)
        raise
    finally:
        os.close(fd)


def prepare(name: str, nbytes: int) -> None:
    """Make the segment of the reserved ``name`` now, its pages allocated
    (a new page costs more to fault in than to copy into): ``copy_into``
    then only copies. Nothing if its release ran meanwhile."""
    size = max(nbytes, 1)
    with _lock:  # not released while it is made: a release takes the lock
        if name not in _reserved:
            return
        _reserved.discard(name)
        fd = _posix().shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, size)
        _mapping(fd)
        mm = mmap.mmap(fd, size, flags=_POPULATE)
    finally:
        os.close(fd)
    with _lock:
        if not os.path.exists(os.path.join(_SHM_DIR, name)) and os.path.isdir(_SHM_DIR):
            return  # released meanwhile
        segment = _prepared[name] = _mapped[name] = _Segment(name, mm, managed=True)
        _managed.add(segment)


_POPULATE = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class Pool:
    """The segment names of one stream's producer in its process, tied to
    its key (``reserve``, then ``tie.tie_names``): those not used yet, and
    segments of its items given back.

    A release of a segment made from the pool (``copy_into``), run in this
    process while the pool is open, renames it to one of the pool's names
    not made yet instead of unlinking it (``_unlink``): the item's name is
    gone as after an unlink (a handle to it no longer maps), the segment is
    tied to the producer's key again, and its pages stay allocated. The
    producer copies a later item of the same size into it only once no
    process maps it (an exclusive ``flock``: each mapping holds a shared one,
    ``_mapping``) and no array of this process views it (the producer keeps
    its own mapping, ``maps``: it is not mapped again); else it is unlinked
    then, and a new one made under its name. Whoever still maps a released
    segment keeps reading what it held. Making a segment costs far more than
    copying into one (the host zeroes, maps and frees its pages)."""

    #: At most this many mappings kept (``maps``: each holds a descriptor):
    #: a producer far ahead of its consumer (``buffer=None``) maps more.
    KEEP = 32
    #: After an emit, segments given back and spares are offered to the
    #: allocator up to this many armed (a segment given back is offered as
    #: it comes back, ``give_back``).
    ARMED = 8

    def __init__(self) -> None:
        self.names: list[str] = []  # tied, for items to come
        self.returned: list[str] = []  # given back, under names of ``names``
        self.open = True
        self.recycling = False  # a segment was given back
        #: This process's mapping of each segment made from the pool, and a
        #: descriptor of it (its shared lock's, ``_mapping``): a segment given
        #: back is copied into again without being mapped again.
        self.maps: dict[str, tuple[mmap.mmap, int]] = {}
        #: Segments given back offered to the allocator (``arm``), by name:
        #: their address. Not in ``returned`` while there.
        self.armed: dict[str, int] = {}
        #: The size of the arrays offered (0: none yet): a segment given back
        #: of that size is offered at once.
        self.size = 0

    def add(self, names: list[str]) -> None:
        with _lock:
            self.names.extend(names)

    def __len__(self) -> int:
        return len(self.names) + len(self.returned)

    def unmade(self) -> int:
        """Our names not made yet: what segments can be given back under."""
        with _lock:
            return sum(1 for name in self.names if name in _reserved)

    def take(self, n: int) -> list[str]:
        """``n`` names for the next items: segments given back first, then
        those made ahead (``prepare``), then names not made yet (kept the
        longest for segments to be given back under)."""
        with _lock:
            out = self.returned[:n]
            del self.returned[:n]
            k = n - len(out)
            if k:
                self.names.sort(key=lambda name: name in _reserved)  # stable: made ones first
                out += self.names[:k]
                del self.names[:k]
            return out

    def give_back(self, name: str) -> bool:
        """Under ``_lock``, in ``_unlink``: rename segment ``name`` to one of
        our names not made yet (one still reserved: its release has not run);
        False if we cannot (closed, no such name, not on a file system)."""
        if not self.open or fcntl is None or not os.path.isdir(_SHM_DIR):
            return False
        target = next((n for n in self.names if n in _reserved), None)
        if target is None:
            return False
        path = os.path.join(_SHM_DIR, name)
        try:
            size = os.stat(path).st_size
            os.rename(path, os.path.join(_SHM_DIR, target))
        except FileNotFoundError:
            return False
        self.names.remove(target)
        entry = self.maps.pop(name, None)
        if entry is not None:
            self.maps[target] = entry
        _reserved.discard(target)
        _returned[target] = size
        _made_by[target] = self
        self.returned.append(target)
        self.recycling = True
        if self.size:
            self._arm(target, self.size)  # for the body's next array already
        return True

    def forget(self, name: str) -> None:
        """Under ``_lock``: our mapping of ``name`` is not ours to copy into
        any more (it stays while arrays view it)."""
        entry = self.maps.pop(name, None)
        if entry is not None:
            os.close(entry[1])

    def arm(self, nbytes: int) -> None:
        """On the producer's lane, after an emit: every segment given back of
        ``nbytes`` that nothing maps (``_reuse``) offered to the allocator,
        for the body's next arrays of that size (``Arrays made in a
        segment``); short of ``ARMED``, spares of that size too (``Spares``:
        a stream's first items find some)."""
        if allocator() is None:
            return
        if _orphans:
            with _lock:
                _collect()
        if not (self.returned or spares.held) or len(self.armed) >= self.ARMED:
            return
        with _lock:
            self.size = nbytes
            for name in list(self.returned):
                if len(self.armed) >= self.ARMED or not self._arm(name, nbytes):
                    return
            for target in [name for name in self.names if name in _reserved]:
                if len(self.armed) >= self.ARMED or len(self.maps) >= self.KEEP or not spares.held:
                    break
                got = spares.take(target, nbytes)  # renamed to our name
                if got is None:
                    break
                entry = got[1]
                del got  # its segment: ``_reuse`` counts who maps it
                self.names.remove(target)
                _reserved.discard(target)
                _returned[target] = nbytes
                _made_by[target] = self
                self.maps[target] = entry
                self.returned.append(target)
                del entry
                if not self._arm(target, nbytes):
                    return

    def _arm(self, name: str, nbytes: int) -> bool:
        """Under ``_lock``: ``arm`` segment ``name`` if it can be; False if
        the allocator has no slot left."""
        alloc = allocator()
        if alloc is None or not self.open:
            return False
        entry = self.maps.get(name)
        segment = _reuse(name, entry, nbytes) if entry is not None and len(entry[0]) == nbytes else None
        if segment is None:
            return True
        address = segment.address
        del entry, segment
        if not alloc.arm(address, nbytes):
            return False
        self.returned.remove(name)
        self.armed[name] = address
        return True

    def made_here(self, a: Any) -> str | None:
        """The name of the armed segment array ``a`` was made in, whole (its
        own data, contiguous), if any (``hand_over``)."""
        if not self.armed or type(a) is not np.ndarray or not a.flags.owndata:
            return None
        if not (a.flags.c_contiguous or a.flags.f_contiguous):
            return None
        address = a.__array_interface__["data"][0]
        alloc = allocator()
        with _lock:  # a segment given back is armed on the worker's loop
            for name, at in self.armed.items():
                if at == address:
                    entry = self.maps.get(name)
                    if entry is not None and len(entry[0]) == a.nbytes and alloc.state(at) == alloc.USED:
                        return name
                    return None
        return None

    def disarm(self) -> None:
        """At an emit: the armed segments the body made no array in go back
        to ``returned`` (those it did stay armed until their array is freed
        or handed over)."""
        alloc = allocator()
        if alloc is None or not self.armed:
            return
        with _lock:
            for name, address in list(self.armed.items()):
                if alloc.disarm(address) == alloc.FREE:
                    del self.armed[name]
                    self.returned.append(name)

    def retire(self, name: str) -> None:
        """Under ``_lock``: armed segment ``name`` is not ours any more (its
        release runs, or the pool closes). Empty, it is as any segment given
        back (its release gives it back, or keeps it as a spare). An array of
        the body's that lives in it keeps our mapping of it until it is freed
        (``_orphans``): that segment is never given back nor kept."""
        address = self.armed.pop(name)
        alloc = allocator()
        if alloc is not None and alloc.retire(address) == alloc.USED:
            entry = self.maps.pop(name, None)
            if entry is not None:
                _orphans[address] = entry[0]
                os.close(entry[1])

    def close(self) -> None:
        """The producer ended: its segments are released as any other from
        now on (those given back with its key), or kept as spares of this
        process (``Spares``): the pool keeps its mappings of them for that
        until their release."""
        with _lock:
            for name in list(self.armed):
                self.retire(name)
            self.open = False
            self.names.clear()
            self.returned.clear()
            if spares.limit <= 0:
                for name in list(self.maps):
                    self.forget(name)


class Spares:
    """Segments of this worker process's streams kept for its later
    streams, as a preallocated store is: making a segment costs several
    times copying into one (its pages zeroed and mapped; more again on a
    host whose freed memory went back to its hypervisor).

    A segment made from a ``Pool`` whose release runs in this process once
    its pool cannot take it back (its producer ended, or has no name left
    to give it back under) is renamed to one of ``free``, names tied to this
    worker (``tie.tie_spares``: released by another worker of the host if
    this one dies, or by the last one leaving), instead of being unlinked,
    while ``bytes`` stays within ``limit`` (``coro.stream.segment-pool``).
    A producer's segment to make is then a spare of its size renamed to its
    name, if no process maps it (``_reuse``). A spare unused for ``idle``
    seconds (``coro.stream.segment-pool-idle``) is unlinked."""

    #: Names tied to the worker for spares (one round trip, once).
    SLOTS = 32

    def __init__(self) -> None:
        self.free: list[str] = []
        #: Spares by name: this process's mapping and the descriptor holding
        #: its shared lock (as ``Pool.maps``), and when each was kept.
        self.held: dict[str, tuple[mmap.mmap, int]] = {}
        self.kept_at: dict[str, float] = {}
        self.bytes = 0
        self.limit = 0
        self.idle = 10.0
        self.asked = False
        self.timer: threading.Timer | None = None
        #: Segments made from a spare, and spares unlinked as idle.
        self.taken = 0
        self.expired = 0

    def start(self, worker: Any, loop: Any) -> None:
        """In a task's thread on ``worker`` (its asyncio ``loop``): read the
        settings, and tie names for spares once, if the pool is on."""
        if self.asked or fcntl is None or not os.path.isdir(_SHM_DIR):
            return
        from .._config import get_size, get_timedelta

        self.asked = True
        self.limit = get_size("coro.stream.segment-pool") or 0
        self.idle = get_timedelta("coro.stream.segment-pool-idle")
        if self.limit <= 0:
            return
        import asyncio

        from .tie import ensure_installed, tie_spares

        plugin = ensure_installed(worker)
        names = [new_name() for _ in range(self.SLOTS)]
        for name in names:
            plugin.record(name, _unlink)

        def tied(fut: Any) -> None:
            if not fut.cancelled() and fut.exception() is None and fut.result():
                with _lock:
                    self.free.extend(names)
            else:  # no spares: nothing will ask for these
                for name in names:
                    plugin.forget_record(name)

        asyncio.run_coroutine_threadsafe(tie_spares(worker, names), loop).add_done_callback(tied)

    def keep(self, name: str, entry: tuple[mmap.mmap, int]) -> bool:
        """Under ``_lock``, in ``_unlink``: segment ``name`` (this process's
        mapping ``entry`` of it) renamed to a spare; False if none is free
        or it does not fit in ``limit``."""
        size = len(entry[0])
        if not self.free or self.bytes + size > self.limit:
            return False
        slot = self.free.pop()
        try:
            os.rename(os.path.join(_SHM_DIR, name), os.path.join(_SHM_DIR, slot))
        except FileNotFoundError:
            self.free.append(slot)
            return False
        self.held[slot] = entry
        self.kept_at[slot] = time.monotonic()
        self.bytes += size
        if self.timer is None:
            self._arm(self.idle)
        return True

    def take(self, name: str, nbytes: int) -> tuple[_Segment, tuple[mmap.mmap, int]] | None:
        """Under ``_lock``: a spare of ``nbytes`` no process maps, renamed
        to the reserved ``name``; its segment and our mapping of it."""
        for slot in [s for s, e in self.held.items() if len(e[0]) == max(nbytes, 1)]:
            segment = _reuse(name, self.held[slot], nbytes)
            if segment is None:
                continue
            try:
                os.rename(os.path.join(_SHM_DIR, slot), os.path.join(_SHM_DIR, name))
            except FileNotFoundError:  # pragma: no cover - released under our lock
                continue
            self.bytes -= len(segment.mm)
            del self.kept_at[slot]
            self.free.append(slot)
            self.taken += 1
            return segment, self.held.pop(slot)
        return None

    def drop(self, name: str) -> None:
        """Under ``_lock``: ``name`` is not a spare any more (its release
        runs, or it is idle: the caller unlinks it)."""
        if name in self.free:
            self.free.remove(name)
        entry = self.held.pop(name, None)
        if entry is not None:
            self.bytes -= len(entry[0])
            del self.kept_at[name]
            os.close(entry[1])

    def _arm(self, delay: float) -> None:
        self.timer = threading.Timer(delay, self._expire)
        self.timer.daemon = True
        self.timer.start()

    def _expire(self) -> None:
        """On the timer's thread: unlink the spares unused for ``idle``."""
        now = time.monotonic()
        with _lock:
            self.timer = None
            for slot, at in list(self.kept_at.items()):
                if now - at >= self.idle:
                    self.drop(slot)
                    self.free.append(slot)
                    self.expired += 1
                    try:
                        _posix().shm_unlink("/" + slot)
                    except FileNotFoundError:
                        pass
            if self.kept_at:
                self._arm(max(0.0, min(self.kept_at.values()) + self.idle - now))


#: This process's spares.
spares = Spares()


def _reuse(name: str, entry: tuple[mmap.mmap, int], nbytes: int) -> _Segment | None:
    """Under ``_lock``: our mapping ``entry`` of segment ``name``, given back
    to its pool, if it holds ``nbytes`` and nothing maps it but the pool: no
    array over it in this process (the mapping referred to by the pool's
    entry and this call only), and no other process's lock on it."""
    mm = entry[0]
    if len(mm) != max(nbytes, 1) or sys.getrefcount(mm) > 3:  # entry, mm, getrefcount's argument
        return None
    alloc = allocator()
    if alloc is not None and alloc.state(_address(mm)) == alloc.HANDED:
        return None  # the array made in it, handed over, is not freed yet
    assert fcntl is not None  # given back on Linux only
    try:
        fcntl.flock(entry[1], fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    fcntl.flock(entry[1], fcntl.LOCK_SH)
    return _Segment(name, mm, managed=True)


def _reopen(name: str, nbytes: int) -> tuple[_Segment, int] | None:
    """Under ``_lock``: segment ``name`` given back to a pool (not mapped by
    it), mapped here again, if it holds ``nbytes`` and no process maps it;
    and the descriptor holding our shared lock on it."""
    fd = _posix().shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_size != max(nbytes, 1):
            raise BlockingIOError
        mm = mmap.mmap(fd, max(nbytes, 1), flags=_POPULATE)
        _mapping(fd)  # ours only now: exclusive until here
    except BlockingIOError:  # mapped somewhere still, or of another size
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return _Segment(name, mm, managed=True), fd


def _open_kept(name: str, nbytes: int) -> tuple[mmap.mmap, int]:
    """``_open_new``, keeping a descriptor (its shared lock's) for a pool."""
    fd = _posix().shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, max(nbytes, 1))
        _mapping(fd)
        return mmap.mmap(fd, max(nbytes, 1)), fd
    except BaseException:
        os.close(fd)
        _posix().shm_unlink("/" + name)
        raise


#: Bytes copied at a time by ``_copy_hashed``: a chunk is hashed while it is
#: still in the core's cache (an L2's size or less).
HASH_CHUNK = 1 << 18


def _copy_hashed(out: np.ndarray, a: np.ndarray, hasher: Any) -> bool:
    """``out[...] = a``, ``hasher`` fed the bytes as they land, in memory
    order, a chunk at a time: one pass over them, not a copy and then a
    hash that reads them all again. False (nothing copied) unless both are
    contiguous in the same order."""
    order: Literal["C", "F"]
    if a.flags.c_contiguous and out.flags.c_contiguous:
        order = "C"
    elif a.flags.f_contiguous and out.flags.f_contiguous:
        order = "F"
    else:
        return False
    src = a.ravel(order=order).view(np.uint8)  # no copy: contiguous
    dst = out.view(np.ndarray).ravel(order=order).view(np.uint8)
    for at in range(0, src.size, HASH_CHUNK):
        chunk = dst[at : at + HASH_CHUNK]
        chunk[...] = src[at : at + HASH_CHUNK]
        hasher.update(chunk)
    return True


def copy_into(name: str, a: np.ndarray, pool: Pool | None = None, hasher: Any = None) -> ShmArray | None:
    """A copy of ``a`` (its shape, dtype and C or Fortran order) in a new
    segment under the reserved ``name``, whose release the caller recorded
    and tied before (``reserve``): the segment is managed by the
    cluster. None if that release ran meanwhile (its key was forgotten).
    With the ``pool`` ``name`` came from, a segment given back to it under
    that name is copied into if it can be (``Pool``), and a release of the
    new segment gives it back. A ``hasher`` (``xxhash.xxh3_128()``, say) is
    fed the copy's bytes in memory order as they are copied, if ``a`` is
    contiguous; else it is left as it was."""
    order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    with _lock:  # not released while it is made: a release takes the lock
        segment = _prepared.pop(name, None)
        kept: tuple[mmap.mmap, int] | None = None
        if name in _returned:
            del _returned[name]
            entry = pool.maps.pop(name, None) if pool is not None else None
            if entry is not None:
                segment = _reuse(name, entry, a.nbytes)
                if segment is None:
                    os.close(entry[1])
                else:
                    kept = entry
                del entry
            else:
                try:
                    got = _reopen(name, a.nbytes)
                except FileNotFoundError:  # released by another process of the host (``release_abandoned``)
                    return None
                if got is not None:
                    segment, fd = got
                    if pool is not None and len(pool.maps) < pool.KEEP:
                        kept = (segment.mm, fd)
                    else:  # the mapping's own duplicate keeps the lock
                        os.close(fd)
            if segment is None:
                busy[0] += 1
                # Still mapped somewhere, or of another size: unlinked (its
                # mappings keep what they read), and made anew.
                _made_by.pop(name, None)
                try:
                    _posix().shm_unlink("/" + name)
                except FileNotFoundError:  # pragma: no cover - released under our lock
                    return None
                _reserved.add(name)
            else:
                reused[0] += 1
                _mapped[name] = segment
                _managed.add(segment)
        elif segment is not None and segment.size != max(a.nbytes, 1):
            # Made ahead for another size: made again (a copy taken of the
            # item's size, not the prediction's).
            _mapped.pop(name, None)
            segment = None
            try:
                _posix().shm_unlink("/" + name)
            except FileNotFoundError:
                return None
            _reserved.add(name)
        if segment is None:
            if name not in _reserved:
                return None
            _reserved.discard(name)
            spare = spares.take(name, a.nbytes) if spares.held else None
            if spare is not None:
                segment, kept = spare
                if pool is None or len(pool.maps) >= pool.KEEP:
                    os.close(kept[1])  # the mapping's own duplicate keeps the lock
                    kept = None
                del spare
            elif pool is not None and fcntl is not None and len(pool.maps) < pool.KEEP:
                kept = _open_kept(name, a.nbytes)
                segment = _Segment(name, kept[0], managed=True)
            else:
                segment = _Segment(name, _open_new(name, a.nbytes), managed=True)
            _mapped[name] = segment
            _managed.add(segment)
        if pool is not None:
            _made_by[name] = pool
            if kept is not None:
                pool.maps[name] = kept
    out = segment.array(a.shape, a.dtype, _strides(a.shape, a.dtype.itemsize, order), 0)
    if hasher is None or not _copy_hashed(out, a, hasher):
        out[...] = a
    return out


# -- arrays made in a segment --------------------------------------------------
#
# A stream producer's body makes its next item's array (``np.full``, say) in a
# segment given back to its pool: NumPy's data allocator (NEP 49,
# ``_npalloc.c``, installed in the producer body's context only) serves
# arrays of exactly an armed segment's size from it (``Pool.arm``). If nothing
# but the item holds such an array when it is emitted (``yield
# emit(make())``: no name in the body, no view of it), the emit hands the
# segment itself over (``hand_over``) instead of copying the array into one:
# no one can write it any more, so the item is what was emitted, as with a
# copy. Else (the body keeps it) it is copied as any other. The segment
# stays mapped in the producer, its pages with it: the next array made in it
# faults none. Without the compiled allocator every item is copied.

_npalloc: Any
try:
    from . import _npalloc
except ImportError:  # not built: items are copied
    _npalloc = None

#: Mappings of retired segments an array of the body's still lives in, by
#: its address: closed once the array is freed (``_collect``, at a later
#: emit of a stream of the process).
_orphans: dict[int, mmap.mmap] = {}


@functools.cache
def allocator() -> Any:
    """``_npalloc`` if it serves here: built, on Linux, and NumPy names it as
    the handler once installed (NEP 49, NumPy 1.22 on); else None."""
    return _check_allocator()


def _numpy_api() -> Any:
    import importlib

    try:
        return importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:  # NumPy 1
        return importlib.import_module("numpy.core._multiarray_umath")


def _check_allocator() -> Any:
    if _npalloc is None or fcntl is None or not os.path.isdir(_SHM_DIR):
        return None
    import contextvars

    umath = _numpy_api()
    if not hasattr(umath, "get_handler_name") or not hasattr(umath, "_ARRAY_API"):
        return None

    def installed() -> bool:
        _npalloc.install(umath._ARRAY_API)
        return bool(umath.get_handler_name() == "dask_coro_shm")

    try:
        return _npalloc if contextvars.copy_context().run(installed) else None
    except Exception:  # pragma: no cover - a NumPy whose API table differs
        return None


def install_allocator() -> None:
    """In a stream producer's body's context: NumPy's arrays made there come
    from its pool's armed segments when they fit one exactly."""
    if allocator() is not None:
        _npalloc.install(_numpy_api()._ARRAY_API)


def _address(mm: mmap.mmap) -> int:
    return int(np.frombuffer(mm, dtype=np.uint8).__array_interface__["data"][0])


def _collect() -> None:
    """Under ``_lock``: the mappings of retired segments whose array was
    freed, closed."""
    alloc = allocator()
    for address, mm in list(_orphans.items()):
        if alloc.state(address) == alloc.EMPTY:
            try:
                mm.close()
            except BufferError:  # pragma: no cover - viewed still: next time
                continue
            del _orphans[address]


def hand_over(name: str, a: np.ndarray, pool: Pool) -> ShmArray:
    """The item's array for ``a``, made in the armed segment ``name`` of
    ``pool`` (``Pool.made_here``) and held by nothing but the item: that
    segment, without a copy."""
    alloc = allocator()
    order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    with _lock:
        address = pool.armed.pop(name)
        if alloc.hand(address) != alloc.USED:  # pragma: no cover - checked by ``made_here``, on this thread
            raise RuntimeError(f"segment {name!r} holds no array to hand over")
        mm = pool.maps[name][0]
        _returned.pop(name, None)
        _made_by[name] = pool
        segment = _Segment(name, mm, managed=True)
        _mapped[name] = segment
        _managed.add(segment)
        reused[0] += 1
        handed[0] += 1
    return segment.array(a.shape, a.dtype, _strides(a.shape, a.dtype.itemsize, order), 0)


class _Handle:
    """A shared array on its way through the scheduler, unmapped."""

    __slots__ = ("args",)

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args

    def __reduce__(self) -> Any:
        return (_attach, self.args)

    def __repr__(self) -> str:
        return f"<shared array handle {self.args[0]}>"


def _attach(
    name: str, managed: bool, shape: Any, dtype: Any, strides: Any, offset: int
) -> ShmArray | _Handle:
    """Unpickle a handle: map the named segment once per process."""
    if shm_as_handles.get():
        return _Handle((name, managed, shape, dtype, strides, offset))
    try:
        segment = _map(name, managed)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shared-memory segment {name!r} does not exist on this host: it "
            "was released (every key holding it was forgotten, or the process "
            "that made it outside a cluster dropped it), or it was made on "
            "another host and reached this one other than from a worker "
            "(a worker sends its bytes to another host's workers)"
        ) from None
    return segment.array(shape, dtype, strides, offset)


def _map(name: str, managed: bool, origin: str | None = None) -> _Segment:
    """This process's mapping of the named segment; FileNotFoundError if it
    does not exist on this host."""
    with _lock:
        segment = _mapped.get(name)
        if segment is not None:
            return segment
        fd = _posix().shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            _mapping(fd)
            mm = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        segment = _Segment(name, mm, managed=managed, origin=origin)
        _mapped[name] = segment
        if managed:
            _managed.add(segment)
        return segment


# -- across hosts ------------------------------------------------------------

#: Bytes of shared arrays this process sent to other hosts, and copies it made.
sent_to_other_hosts = [0]
copies_made = [0]

_SHM_DIR = "/dev/shm"  # where POSIX shared memory has names as files (Linux)


def copy_name(origin: str) -> str:
    """The name of a host's copy of segment ``origin``."""
    return origin + "-c"


def _as_copy(x: ShmArray) -> tuple[dict[str, Any], list[Any]]:
    import pickle

    segment = x._segment
    assert segment is not None
    offset = x.__array_interface__["data"][0] - segment.address
    meta = (segment.origin, x.shape, x.dtype, x.strides, offset)
    sent_to_other_hosts[0] += segment.size
    return {"copy": True}, [pickle.dumps(meta), memoryview(segment.mm)]


def segments_held(value: Any) -> list[_Segment]:
    """The managed segments ``value`` holds (as ``segments_in``)."""
    with _lock:
        return [s for name in segments_in(value) if (s := _mapped.get(name)) is not None]


#: After sending a host the bytes, the other workers of this host answer
#: ``busy`` to that host this long: enough for the worker that got them to
#: map them and tell the scheduler, so the next worker of that host asking
#: fetches from it. On a loaded host that took over 2 s (seen in CI: the
#: bytes crossed twice); what a longer wait costs is only the case where the
#: worker that got the bytes died meanwhile: the next one waits this long.
SENT_GRACE = 10.0


class sending_to:
    """A worker sending keys' values that hold segments (``held``: pairs of
    a key and a segment its value holds) to a worker of ``host``. While it
    does, and for ``SENT_GRACE`` seconds after, any worker of this host asked
    for the same key by another worker of that host answers ``busy``
    (distributed's answer: the asking worker asks the scheduler who else
    holds the key and tries again, then from its own host's worker that got
    the bytes). So the bytes cross to a host once, not once per worker of it
    asking at about the same time. A marker in this host's /dev/shm says it
    for every worker process of the host: the sender's pid while it sends,
    "sent" after; one whose sender died is taken over. Per key and segment,
    not per segment: another key holding the same segment is held by no
    worker of that host yet, so a ``busy`` would only send its asker back
    here until the grace ran out (10 s a key, seen on two hosts)."""

    def __init__(self, held: list[tuple[Any, _Segment]], host: str):
        # Sorted: two senders claim shared markers in the same order.
        self.paths = sorted({_marker(s.origin, host, key) for key, s in held})
        self.claimed: list[str] = []

    def claim(self) -> bool:
        """Mark the sending; False if the host is sent these now, or was just."""
        if not os.path.isdir(_SHM_DIR):
            return True
        for path in self.paths:
            if not _create_marker(path):
                self.done(sent=False)
                return False
            self.claimed.append(path)
        return True

    def done(self, sent: bool) -> None:
        for path in self.claimed:
            try:
                if sent:
                    # Replaced whole, never truncated then written: a marker
                    # read empty would look like a dead sender's.
                    os.replace(_marker_file(path, "sent"), path)
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass
        self.claimed = []


def _marker(origin: str, host: str, key: Any = None) -> str:
    # Not "dask-coro-...": segments() lists segments only. The key by a
    # digest of its name (a key may be long, or a tuple); after the
    # segment's name, so a release finds it by that name (``release``).
    name = f"dask-coro.to-{host}.{origin}"
    if key is not None:
        name += "." + hashlib.blake2b(str(key).encode(), digest_size=8).hexdigest()
    return os.path.join(_SHM_DIR, name)


def _marker_file(path: str, text: str) -> str:
    """A new file beside ``path`` holding ``text``, to be put in its place
    whole: a marker is never seen half written."""
    tmp = f"{path}.{uuid.uuid4().hex[:8]}"
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return tmp


def _create_marker(path: str) -> bool:
    tmp = _marker_file(path, str(os.getpid()))
    try:
        for _ in range(2):
            try:
                os.link(tmp, path)  # atomic, and fails if a marker is there
            except FileExistsError:
                if _marker_holds(path):
                    return False
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                continue
            return True
        return False
    finally:
        os.unlink(tmp)


def _marker_holds(path: str) -> bool:
    """A sender alive, or a send finished less than SENT_GRACE ago."""
    try:
        with open(path) as f:
            text = f.read()
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return False
    if text == "sent":
        return age < SENT_GRACE
    try:
        os.kill(int(text), 0)
    except (ProcessLookupError, ValueError):
        return False  # its sender died mid-way
    except PermissionError:
        pass
    return True


def _from_copy(meta: Any, data: Any) -> Any:
    """A shared array's bytes arrived from another host: map this host's
    copy (making it if no worker here has yet), or, outside a worker, a
    plain array."""
    origin, shape, dtype, strides, offset = meta
    segment = _host_copy(origin, data)
    if segment is None:
        return np.array(np.ndarray(shape, dtype, buffer=data, offset=offset, strides=strides))
    return segment.array(shape, dtype, strides, offset)


def _host_copy(origin: str, data: Any) -> _Segment | None:
    for name in (origin, copy_name(origin)):  # here already (the origin's own host)
        try:
            return _map(name, managed=True, origin=origin)
        except FileNotFoundError:
            pass
    from .._internals.distributed.worker import worker_of_this_process, worker_plugin
    from .worker import NAME

    worker = worker_of_this_process()
    plugin = worker_plugin(worker, NAME) if worker is not None else None
    if plugin is None or not plugin.ready() or not os.path.isdir(_SHM_DIR):
        return None  # no host registry to record the release in: a private copy
    name = copy_name(origin)
    posix = _posix()
    size = max(len(data), 1)
    tmp = f"{name}.{uuid.uuid4().hex[:8]}"
    fd = posix.shm_open("/" + tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, size)
        _mapping(fd)
        mm = mmap.mmap(fd, size)
        mm[: len(data)] = data
        # Recorded before it exists under its name: a worker dying now leaves
        # a release with nothing to unlink, never a segment nobody releases.
        plugin.record(name, _unlink)
        try:
            os.link(os.path.join(_SHM_DIR, tmp), os.path.join(_SHM_DIR, name))
        except FileExistsError:  # another worker of this host made it first
            mm.close()
            return _map(name, managed=True, origin=origin)
    finally:
        os.close(fd)
        _unlink(tmp)
    copies_made[0] += 1
    with _lock:
        segment = _mapped.get(name)
        if segment is None:
            segment = _mapped[name] = _Segment(name, mm, managed=True, origin=origin)
            _managed.add(segment)
    return segment


class ShmArray(np.ndarray):
    """A NumPy array over a shared-memory segment; pickles as a handle.

    Views (slices, transposes, reshapes without a copy) stay ``ShmArray`` and
    pickle as handles too. Anything that allocates new memory (``copy()``,
    arithmetic) is not in the segment and behaves as a plain array.
    ``np.asarray(a)`` gives a plain ``ndarray`` view, which pickles by copying.
    """

    _segment: _Segment | None = None

    def __array_finalize__(self, obj: Any) -> None:
        segment = getattr(obj, "_segment", None)
        self._segment = segment if segment is not None and segment.holds(self) else None

    def __array_wrap__(self, array: Any, context: Any = None, return_scalar: bool = False) -> Any:
        out = super().__array_wrap__(array, context, return_scalar)
        if isinstance(out, ShmArray) and out._segment is None:
            return out.view(np.ndarray)
        return out

    @property
    def segment_name(self) -> str | None:
        """The segment's name, or None if this array's memory is not shared."""
        return None if self._segment is None else self._segment.name

    def __reduce__(self) -> Any:
        segment = self._segment
        if segment is None:
            return self.view(np.ndarray).__reduce__()
        offset = self.__array_interface__["data"][0] - segment.address
        return (
            _attach,
            (segment.name, segment.managed, self.shape, self.dtype, self.strides, offset),
        )

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__reduce__()


def empty(shape: Any, dtype: Any = float, *, order: str = "C") -> ShmArray:
    """A new array in shared memory (zero-filled, as the OS gives new pages)."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise TypeError(f"dtype {dtype} holds Python objects, which cannot live in shared memory")
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', got {order!r}")
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
        raise ValueError(f"shape must be non-negative integers, got {shape!r}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    segment = _create(nbytes)
    strides = _strides(shape, dtype.itemsize, order)
    return segment.array(shape, dtype, strides, 0)


zeros = empty


def from_array(a: Any) -> ShmArray:
    """A copy of ``a`` in shared memory."""
    a = np.asarray(a)
    out = empty(a.shape, a.dtype)
    out[...] = a
    return out


def _strides(shape: tuple[int, ...], itemsize: int, order: str) -> tuple[int, ...]:
    strides = []
    step = itemsize
    dims = reversed(shape) if order == "C" else shape
    for n in dims:
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides)) if order == "C" else tuple(strides)


def segments() -> list[str]:
    """Names of dask_coro segments that exist on this host (Linux: ``/dev/shm``)."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(PREFIX))
    except FileNotFoundError:
        raise DaskCoroError("listing segments needs /dev/shm (Linux)") from None


# -- the worker plugin's view ------------------------------------------------


def any_attached() -> bool:
    """Whether this process maps a segment the cluster manages."""
    return len(_managed) > 0


def segments_in(value: Any) -> set[str]:
    """Names of managed segments ``value`` holds: itself, or inside lists,
    tuples and dicts, however deep."""
    found: set[str] = set()
    stack = [value]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if isinstance(v, ShmArray):
            if v._segment is not None and v._segment.managed:
                found.add(v._segment.name)
        elif isinstance(v, (list, tuple, dict)):
            if id(v) in seen:
                continue
            seen.add(id(v))
            stack.extend(v.values() if isinstance(v, dict) else v)
    return found


# -- distributed integration -------------------------------------------------


def _register() -> None:
    try:
        from dask.sizeof import sizeof
        from distributed.protocol.serialize import dask_deserialize, dask_serialize
    except ImportError:
        return
    import pickle

    @dask_serialize.register(ShmArray)
    def _serialize(x: ShmArray) -> tuple[dict[str, Any], list[Any]]:
        # Registered so distributed does not take numpy's serializer (found
        # through the MRO), which would copy the data.
        if x._segment is None:
            plain = x.view(np.ndarray)
            header, frames = dask_serialize.dispatch(np.ndarray)(plain)
            return {"plain": header}, frames
        hosts = recipient_host.get()
        if hosts is not None and hosts[0] != hosts[1]:
            return _as_copy(x)
        return {}, [pickle.dumps(x)]

    @dask_deserialize.register(ShmArray)
    def _deserialize(header: dict[str, Any], frames: list[Any]) -> Any:
        if "plain" in header:
            return dask_deserialize.dispatch(np.ndarray)(header["plain"], frames)
        if "copy" in header:
            return _from_copy(pickle.loads(frames[0]), frames[1])
        return pickle.loads(frames[0])

    @sizeof.register(ShmArray)
    def _sizeof(x: ShmArray) -> int:
        # Shared pages belong to the host, not to each worker holding a
        # handle; counting them per worker would make distributed spill
        # handles and avoid moving work to where the data already is.
        return 200 if x._segment is not None else int(x.nbytes)


_register()
