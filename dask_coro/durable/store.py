"""The store of durable runs (no distributed, no event loop: plain files).

A store is a local directory (``os``, ``pathlib``) or any fsspec URL. Its
layout::

    key                          the HMAC key of a local store (0600), made with it
    runs/<run>/run.json          the run's root key, state, start and end (JSON)
    runs/<run>/result            the root's value, once the run finished (an entry)
    runs/<run>/children/<child>  each child's value or error (an entry)
    runs/<run>/batches/<batch>   an fsspec URL: children's entries written together (a batch)
    runs/<run>/groups/<group>    what a group delivered, in order, and its deadline (an entry)

``<run>`` and ``<child>`` are hashes of the root's key and the child's key.
A write is atomic: a temporary file, then ``os.replace`` (fsspec: ``mv``,
or one PUT on an object store), so a process killed mid-write leaves no
torn entry under an entry's name. A large entry goes to a local directory
without the page cache where the file system takes it (``direct``).

On an fsspec URL (``Store.batched``) a worker writes the small entries it
has for a run within a short window as one object, a batch: ``BATCH``, the
number of entries, each one's child name and length, then the entries one
after the other, each one whole and authenticated on its own. A batch is
read back whole (one listing of ``batches/``, the batches read together)
and kept by the process that read it, for the run's lookups: one request
per batch instead of one per child. A batch whose lengths do not add up to
its size (torn, corrupt) is never used: its entries are computed again. A
batch's name is its time, a random part and its number of entries (what
``runs`` counts without reading it).

An entry is ``MAGIC``, an HMAC-SHA256 of the rest, then the rest: a JSON
header (the key, the token of its call, value or error) and a pickle; or,
where the ``blake3`` package is installed (the ``durable`` extra),
``MAGIC_BLAKE3`` and a keyed BLAKE3 hash of the rest (a MAC as strong,
about four times cheaper: 0.14 s of CPU a gigabyte against 0.59). A reader
checks either kind; one without ``blake3`` cannot check the second, and
treats it as one that does not check. The pickle is loaded only once the
MAC and the header check: an entry written by anyone without the store's
key, or for another key or another call, is never unpickled; it is dropped
with a warning naming the key, and the key is computed again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import pickle
import secrets
import shutil
import stat
import struct
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..core.keys import slot_of
from . import direct

logger = logging.getLogger("dask_coro")

MAGIC = b"DCSTORE1"  # an entry whose MAC is an HMAC-SHA256
MAGIC_BLAKE3 = b"DCSTORE2"  # an entry whose MAC is a keyed BLAKE3 hash
_MAC = 32  # bytes of either MAC
BATCH = b"DCBATCH1"
_BATCH_ENTRY = struct.Struct("<32sQ")  # a child's name (``child_name``), its entry's length
#: A batch holds entries of at most this size; a larger one is an object of its own.
BATCH_ENTRY_BYTES = 1 << 20
#: A batch holds at most this many entries, and about this many bytes.
BATCH_ENTRIES = 1000
BATCH_BYTES = 8 << 20
#: The bytes of batches a process keeps read (``Store``), beyond the run it reads now.
BATCH_CACHE_BYTES = 256 << 20
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "memory"})
#: The states of a run (``run.json``).
STATES = ("running", "finished", "failed")


class StoreError(ValueError):
    """A store that cannot be used as configured (its key, its key file)."""


def _blake3() -> Any:
    """The ``blake3`` module, or None where it is not installed."""
    try:
        import blake3
    except ImportError:
        return None
    return blake3


#: Entries written with a keyed BLAKE3 MAC (``blake3`` installed), else HMAC-SHA256.
BLAKE3 = _blake3()


def token_of(key: Any) -> str | None:
    """The token of the call a child's key names (its content part,
    ``core.keys.child_key``), or None for a key that is not a derived
    child's (a key the user named: not stored)."""
    if slot_of(key) is None:
        return None
    return str(key)[-16:]


def _digest(key: Any) -> str:
    return hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest()


#: A value that is ``bytes`` of at least this length is written as it is.
_RAW_BYTES = 64 << 10


def _raw(obj: Any) -> bool:
    """Whether ``obj`` is written as it is (``_dumps``; ``raw`` in its header)."""
    return type(obj) is bytes and len(obj) >= _RAW_BYTES


def _dumps(obj: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """``obj`` pickled, and its out-of-band buffers (protocol 5: a NumPy
    array's data is not copied into the pickle; nor is a value of large
    ``bytes``, its pickle a buffer's, read back as ``bytes``: ``raw``)."""
    buffers: list[pickle.PickleBuffer] = []
    if _raw(obj):
        obj = pickle.PickleBuffer(obj)
    try:
        return pickle.dumps(obj, protocol=5, buffer_callback=buffers.append), buffers
    except Exception:  # a lambda, a class made in a function: as distributed pickles them
        import cloudpickle

        buffers = []
        return cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append), buffers


def _loads(rest: memoryview, header: dict[str, Any]) -> Any:
    """The value of an entry whose header checked: its pickle, with its
    out-of-band buffers (``_dumps``)."""
    sizes = header.get("buffers")
    if not sizes:
        return pickle.loads(rest)
    at = int(header["pickle"])
    buffers = []
    for size in sizes:
        buffers.append(rest[at : at + size])
        at += size
    if at != len(rest):
        raise ValueError("its buffers do not add up")
    if header.get("raw"):
        return bytes(buffers[0])
    if rest.readonly:  # a value's arrays writable, as they were
        buffers = [memoryview(bytearray(b)) for b in buffers]
    return pickle.loads(rest[: int(header["pickle"])], buffers=buffers)


def _json_key(key: Any) -> Any:
    return list(key) if isinstance(key, tuple) else key


def key_from_json(key: Any) -> Any:
    """A key as ``run.json`` keeps it (a tuple key as a list)."""
    return tuple(key_from_json(k) for k in key) if isinstance(key, list) else key


@dataclass(frozen=True)
class RunInfo:
    """One run of a store (``Store.runs``)."""

    key: Any
    state: str
    started: float
    ended: float | None
    children: int
    bytes: int


class _Local:
    """A local directory: ``os`` and ``pathlib``."""

    protocol = "file"

    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        self.direct = direct.available()  # large entries without the page cache (``direct``)

    def join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, mode=0o700, exist_ok=True)

    def read(self, path: str) -> bytes | bytearray | None:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = bytearray(size)  # writable: a value's arrays are read into it, not copied
                n = f.readinto(data)
                return data if n == size else bytes(data[:n]) + f.read()
        except FileNotFoundError:
            return None

    def write(self, path: str, data: bytes | list[Any]) -> None:
        """``data``: bytes, or the parts of an entry (written one after the
        other, never joined: a large value is not copied again)."""
        # FileNotFoundError: the directory went (the run finished, or was
        # forgotten, meanwhile); the caller drops the entry.
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        if self.direct and isinstance(data, list) and sum(memoryview(p).nbytes for p in data) >= direct.DIRECT_BYTES:
            if direct.write(tmp, data):
                os.replace(tmp, path)
                return
            self.direct = False  # this file system refuses it: the usual way from now on
        with open(tmp, "wb") as f:
            if isinstance(data, list):
                for part in data:
                    f.write(part)
            else:
                f.write(data)
        os.replace(tmp, path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def remove(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def remove_under(self, path: str, folders: tuple[str, ...]) -> None:
        """Delete ``folders`` of directory ``path``."""
        for folder in folders:
            self.remove_tree(os.path.join(path, folder))

    def names(self, path: str) -> dict[str, int]:
        """Files in ``path`` (not temporary ones) and their sizes."""
        out = {}
        try:
            with os.scandir(path) as it:
                for e in it:
                    if not e.name.endswith(".tmp"):
                        try:
                            out[e.name] = e.stat().st_size
                        except FileNotFoundError:
                            pass
        except FileNotFoundError:
            pass
        return out


class _Remote:
    """Any fsspec URL."""

    def __init__(self, url: str, options: dict[str, Any] | None = None):
        import fsspec

        self.fs, self.root = fsspec.core.url_to_fs(url, **(options or {}))
        protocol = self.fs.protocol
        self.protocol = protocol if isinstance(protocol, str) else protocol[0]
        self.root = self.root.rstrip("/")

    def join(self, *parts: str) -> str:
        # As os.path.join joins onto an absolute path: a part that is a path
        # of the store already (run_dir's) is not put under the root again.
        if parts and (parts[0] == self.root or parts[0].startswith(self.root + "/")):
            return "/".join(parts)
        return "/".join((self.root, *parts))

    def makedirs(self, path: str) -> None:
        if self.protocol in _OBJECT_STORES:
            return  # no directories: a key's prefix is there once a key is (a request saved)
        self.fs.makedirs(path, exist_ok=True)

    def read(self, path: str) -> bytes | None:
        try:
            data: bytes = self.fs.cat_file(path)
            return data
        except FileNotFoundError:
            return None

    def read_many(self, paths: list[str]) -> dict[str, bytes | None]:
        """Several objects at once (s3fs: concurrently); None for one that is gone."""
        if not paths:
            return {}
        found = self.fs.cat(paths, on_error="return")
        if not isinstance(found, dict):  # one path whose name fsspec took as no list
            found = {paths[0]: found}
        out: dict[str, bytes | None] = {}
        for path in paths:
            data = found.get(path)
            if isinstance(data, FileNotFoundError) or data is None:
                out[path] = None
            elif isinstance(data, BaseException):
                raise data
            else:
                out[path] = data
        return out

    def write(self, path: str, data: bytes | list[Any]) -> None:
        if isinstance(data, list):
            data = b"".join(data)  # one PUT of the whole entry
        if self.protocol in _OBJECT_STORES:
            self.fs.pipe_file(path, data)  # one PUT: atomic
            return
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, path)

    def exists(self, path: str) -> bool:
        self.fs.invalidate_cache(path)  # another host may have written it
        return bool(self.fs.exists(path))

    def remove(self, path: str) -> None:
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str) -> None:
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def remove_under(self, path: str, folders: tuple[str, ...]) -> None:
        """Delete ``folders`` of directory ``path``: one listing of ``path``,
        then one delete of what is in them (an object store deletes many
        keys in one request)."""
        self.fs.invalidate_cache(path)
        try:
            found = self.fs.find(path)
        except FileNotFoundError:
            return
        prefixes = tuple(f"{path}/{folder}/" for folder in folders)
        doomed = [p for p in found if p.startswith(prefixes)]
        if doomed:
            try:
                self.fs.rm(doomed)
            except FileNotFoundError:
                pass
        if self.protocol not in _OBJECT_STORES:  # directories of their own
            for folder in folders:
                self.remove_tree(f"{path}/{folder}")

    def names(self, path: str) -> dict[str, int]:
        self.fs.invalidate_cache(path)  # a listing cached (s3fs) would miss what was written since
        try:
            found = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for e in found:
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            if e.get("type") != "directory" and not name.endswith(".tmp"):
                out[name] = int(e.get("size") or 0)
        return out


def is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


@dataclass(frozen=True)
class Found:
    """A stored outcome: a value, or an error (``error`` True)."""

    value: Any
    error: bool


class Store:
    """The store at ``location`` (a directory or an fsspec URL), its entries
    authenticated with ``secret`` (the setting ``coro.durability.store-key``),
    else with the local store's key file, made with the store. ``options``:
    keyword arguments of an fsspec URL's filesystem (the setting
    ``coro.durability.store-options``)."""

    def __init__(
        self, location: str, secret: str | bytes | None = None, options: dict[str, Any] | None = None
    ):
        if not isinstance(location, (str, os.PathLike)) or not str(location):
            raise StoreError(
                f"coro.durability.store: {location!r} is not a directory path or an fsspec URL"
            )
        location = os.fspath(location)
        self.location = location
        if location.startswith("file://"):
            location = location[len("file://"):]
        if options is not None and not isinstance(options, dict):
            raise StoreError(
                f"coro.durability.store-options: {options!r} is not a mapping of keyword arguments"
            )
        self.fs: _Local | _Remote = _Remote(location, options) if is_url(location) else _Local(location)
        self._secret = secret
        self._mac_key: bytes | None = None
        self._blake3_key: bytes | None = None
        # The batches this process read, per run directory (the latest used
        # last): each batch's entries by child name (``_Batches``).
        self._batches: OrderedDict[str, _Batches] = OrderedDict()
        self._batches_lock = threading.Lock()

    @property
    def batched(self) -> bool:
        """Whether a worker writes its small entries together, as batches
        (an fsspec URL: one request instead of one per entry); a local
        directory keeps each entry in a file of its own."""
        return isinstance(self.fs, _Remote)

    def __repr__(self) -> str:
        return f"<Store {self.location!r}>"

    # -- the key -------------------------------------------------------------

    @property
    def mac_key(self) -> bytes:
        if self._mac_key is None:
            secret = self._secret
            if secret:
                self._mac_key = secret.encode() if isinstance(secret, str) else bytes(secret)
            elif isinstance(self.fs, _Local):
                self._mac_key = self._key_file()
            else:
                raise StoreError(
                    f"coro.durability.store {self.location!r} is a URL: set "
                    "coro.durability.store-key too (the same secret on every host), "
                    "since a key file kept in a shared store would be readable and "
                    "writable by whoever can write the store"
                )
        return self._mac_key

    @property
    def blake3_key(self) -> bytes:
        """The 32-byte key of the BLAKE3 MAC, derived from ``mac_key``."""
        if self._blake3_key is None:
            assert BLAKE3 is not None
            self._blake3_key = BLAKE3.blake3(self.mac_key, derive_key_context="dask_coro store entry MAC v1").digest()
        return self._blake3_key

    def _mac(self, parts: list[bytes | memoryview], blake3: bool) -> bytes:
        if blake3:
            h = BLAKE3.blake3(key=self.blake3_key)
        else:
            h = hmac.new(self.mac_key, digestmod=hashlib.sha256)
        for part in parts:
            h.update(part)
        return h.digest()

    def _key_file(self) -> bytes:
        """The local store's key: made with the store, readable and writable
        by its owner only (0600); refused if anyone else could read or
        replace it."""
        fs = self.fs
        assert isinstance(fs, _Local)
        fs.makedirs(fs.root)
        path = fs.join("key")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or st.st_uid != os.getuid():
            raise StoreError(
                f"the key file {path} of store {self.location!r} must be a regular file "
                "that only its owner can read and write (0600), owned by this user; "
                "or set coro.durability.store-key"
            )
        with open(path, "rb") as f:
            data = f.read().strip()
        if len(data) < 32:
            raise StoreError(f"the key file {path} of store {self.location!r} is too short")
        return data

    # -- entries -------------------------------------------------------------

    def _pack(self, key: Any, token: str | None, value: Any, error: bool) -> bytes:
        return b"".join(self._pack_parts(key, token, value, error))

    def _pack_parts(self, key: Any, token: str | None, value: Any, error: bool) -> list[bytes | memoryview]:
        """An entry as parts to write one after the other: ``MAGIC`` and the
        HMAC of the rest (``MAGIC_BLAKE3`` and a keyed BLAKE3 hash, where
        ``blake3`` is installed), the header's length and the header, the
        pickle, then its out-of-band buffers (their sizes in the header)."""
        pickled, buffers = _dumps(value)
        views = [b.raw() for b in buffers]
        head: dict[str, Any] = {"key": repr(key), "token": token, "error": error}
        if views:
            head["pickle"] = len(pickled)
            head["buffers"] = [v.nbytes for v in views]
        if _raw(value):
            head["raw"] = True
        header = json.dumps(head).encode()
        body: list[bytes | memoryview] = [struct.pack("<I", len(header)) + header, pickled, *views]
        blake3 = BLAKE3 is not None
        return [(MAGIC_BLAKE3 if blake3 else MAGIC) + self._mac(body, blake3), *body]

    def _unpack(self, data: bytes | bytearray | memoryview, key: Any, token: str | None) -> Found | None:
        """The outcome in ``data`` if it checks (its MAC, then its key and
        token), else None with a warning naming ``key``; unpickled only
        once it checks."""
        why = None
        magic = bytes(data[: len(MAGIC)])
        if len(data) < len(MAGIC) + _MAC + 4 or magic not in (MAGIC, MAGIC_BLAKE3):
            why = "it is not an entry (corrupt)"
        elif magic == MAGIC_BLAKE3 and BLAKE3 is None:
            why = (
                "its MAC is a keyed BLAKE3 hash, which cannot be checked here without the blake3 "
                "package (install it on every host that uses the store, or on none)"
            )
        else:
            whole = memoryview(data)  # slices without copies
            mac, body = whole[len(MAGIC) : len(MAGIC) + _MAC], whole[len(MAGIC) + _MAC :]
            if not hmac.compare_digest(mac, self._mac([body], magic == MAGIC_BLAKE3)):
                what = "MAC (a keyed BLAKE3 hash)" if magic == MAGIC_BLAKE3 else "HMAC"
                why = f"its {what} does not check with the store's key (written by someone else, or corrupt)"
            else:
                (n,) = struct.unpack("<I", body[:4])
                try:
                    header = json.loads(bytes(body[4 : 4 + n]))
                except ValueError:
                    header = None
                if not isinstance(header, dict) or header.get("key") != repr(key):
                    why = "it is the entry of another key"
                elif header.get("token") != token:
                    why = f"it is of another call (token {header.get('token')}, now {token})"
                else:
                    try:
                        return Found(_loads(body[4 + n :], header), bool(header.get("error")))
                    except Exception as e:
                        why = f"it does not unpickle here: {e!r}"
        logger.warning(
            "dask_coro: the stored entry of %r in %s is not used, %s; computing it again",
            key, self.location, why,
        )
        return None

    # -- runs ----------------------------------------------------------------

    def run_dir(self, root: Any) -> str:
        return self.fs.join("runs", _digest(root))

    def child_path(self, root: Any, key: Any) -> str:
        return self.fs.join("runs", _digest(root), "children", _digest(key))

    def child_name(self, key: Any) -> str:
        return _digest(key)

    def stored_children(self, root: Any) -> set[str]:
        """The names (``child_name``) of the children stored for ``root``:
        its entries, and those in its batches (listed afresh, the batches
        not read yet read now and kept for ``get_child``)."""
        names = set(self.fs.names(self.fs.join("runs", _digest(root), "children")))
        if self.batched:
            names.update(self._batches_of(root, fresh=True).names())
        return names

    def put_child(self, root: Any, key: Any, value: Any, error: bool = False, *, again: bool = False) -> bool:
        """Store a child's value (or error) under ``root``'s run, unless it is
        stored already (``again``: even so); False if ``key`` is no child's
        key (none is stored: a key the user named)."""
        if token_of(key) is None:
            return False
        self.write_child(root, key, value, error, again=again)
        return True

    def write_child(self, root: Any, key: Any, value: Any, error: bool = False, *, again: bool = False) -> int:
        """``put_child``: the bytes written (0: none, it was stored already
        or ``key`` is no child's)."""
        token = token_of(key)
        if token is None:
            return 0
        path = self.child_path(root, key)
        if not again and self.fs.exists(path):
            return 0
        parts = self._pack_parts(key, token, value, error)
        self.fs.write(path, parts)
        return sum(memoryview(p).nbytes for p in parts)

    def pack_child(self, key: Any, value: Any, error: bool = False) -> list[bytes | memoryview] | None:
        """A child's entry, as parts (``write_children``); None for a key
        that is no child's."""
        token = token_of(key)
        if token is None:
            return None
        return self._pack_parts(key, token, value, error)

    def write_children(self, root: Any, entries: list[tuple[Any, list[bytes | memoryview]]]) -> None:
        """Write children's entries (``pack_child``) under ``root``'s run:
        those up to ``BATCH_ENTRY_BYTES`` as batches (up to ``BATCH_ENTRIES``
        entries and about ``BATCH_BYTES`` each, one request each), a larger
        one as an object of its own. Each batch is written whole or not at
        all (``write``): an entry is stored once its batch is."""
        batch: list[tuple[str, list[bytes | memoryview], int]] = []
        nbytes = 0
        for key, parts in entries:
            size = sum(memoryview(p).nbytes for p in parts)
            if size > BATCH_ENTRY_BYTES:
                self.fs.write(self.child_path(root, key), parts)
                continue
            if batch and (len(batch) >= BATCH_ENTRIES or nbytes + size > BATCH_BYTES):
                self._write_batch(root, batch)
                batch, nbytes = [], 0
            batch.append((self.child_name(key), parts, size))
            nbytes += size
        if batch:
            self._write_batch(root, batch)

    def _write_batch(self, root: Any, batch: list[tuple[str, list[bytes | memoryview], int]]) -> None:
        head = [BATCH, struct.pack("<I", len(batch))]
        head += [_BATCH_ENTRY.pack(name.encode(), size) for name, _, size in batch]
        parts: list[bytes | memoryview] = [b"".join(head)]
        for _, entry, _ in batch:
            parts += entry
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}-{len(batch)}"
        self.fs.write(self.fs.join(self.run_dir(root), "batches", name), parts)

    def _batches_of(self, root: Any, fresh: bool) -> _Batches:
        """The batches of ``root``'s run as this process read them; ``fresh``
        (or none read yet): listed again, and the new ones read (together)."""
        d = self.run_dir(root)
        with self._batches_lock:
            known = self._batches.get(d)
            if known is not None:
                self._batches.move_to_end(d)
        if known is not None and not fresh:
            return known
        listed = self.fs.names(self.fs.join(d, "batches"))
        with known.lock if known is not None else _NO_LOCK:
            have = set(known.objects) if known is not None else set()
        new = sorted(set(listed) - have)
        read: dict[str, bytes | None] = {}
        if new:
            assert isinstance(self.fs, _Remote)
            read = self.fs.read_many([self.fs.join(d, "batches", name) for name in new])
        with self._batches_lock:
            batches = self._batches.setdefault(d, _Batches())
            self._batches.move_to_end(d)
        with batches.lock:
            for name in list(batches.objects):
                if name not in listed:  # deleted (forgotten, or by another process)
                    batches.drop(name)
            for name in new:
                data = read.get(self.fs.join(d, "batches", name))
                if data is not None:
                    batches.add(name, data, self)
        self._trim(keep=d)
        return batches

    def _trim(self, keep: str) -> None:
        """Batches of other runs let go of, the least recently used first,
        while those kept exceed ``BATCH_CACHE_BYTES``."""
        with self._batches_lock:
            total = sum(b.nbytes for b in self._batches.values())
            for d in list(self._batches):
                if total <= BATCH_CACHE_BYTES:
                    break
                if d != keep:
                    total -= self._batches.pop(d).nbytes

    def forget_batches(self, root: Any) -> None:
        """Let go of the batches of ``root``'s run this process read."""
        with self._batches_lock:
            self._batches.pop(self.run_dir(root), None)

    def get_child(self, root: Any, key: Any) -> Found | None:
        """A child's stored outcome if there is one that checks (else None:
        an entry that does not check is dropped, with a warning)."""
        return self.get_children(root, [key]).get(key)

    def get_children(self, root: Any, keys: list[Any]) -> dict[Any, Found]:
        """The stored outcomes of ``keys`` that check (``get_child``): from
        the batches read (``stored_children``), the newest first, else their
        own entries (read together)."""
        out: dict[Any, Found] = {}
        rest = []
        batches = self._batches_of(root, fresh=False) if self.batched else None
        for key in keys:
            token = token_of(key)
            if token is None:
                continue
            if batches is not None:
                found = batches.get(self, key, token)
                if found is not None:
                    out[key] = found
                    continue
            rest.append(key)
        if not rest:
            return out
        paths = {key: self.child_path(root, key) for key in rest}
        read: dict[str, bytes | bytearray | None]
        if isinstance(self.fs, _Remote) and len(rest) > 1:
            read = dict(self.fs.read_many(list(paths.values())))
        else:
            read = {path: self.fs.read(path) for path in paths.values()}
        for key, path in paths.items():
            data = read.get(path)
            if data is None:
                continue
            found = self._unpack(data, key, token_of(key))
            if found is None:
                self.fs.remove(path)
            else:
                out[key] = found
        return out

    def group_path(self, root: Any, key: Any, group: int) -> str:
        return self.fs.join("runs", _digest(root), "groups", _digest((key, group)))

    def put_group(self, root: Any, key: Any, group: int, log: dict[str, Any]) -> None:
        """Store what group ``group`` of run ``key`` (under ``root``'s run)
        delivered: ``{"deadline": float | None, "order": [index, ...]}``."""
        self.fs.write(self.group_path(root, key, group), self._pack(("group", key, group), None, log, False))

    def get_group(self, root: Any, key: Any, group: int) -> dict[str, Any] | None:
        """A group's stored deliveries (``put_group``), if they check."""
        path = self.group_path(root, key, group)
        data = self.fs.read(path)
        if data is None:
            return None
        found = self._unpack(data, ("group", key, group), None)
        if found is None or not isinstance(found.value, dict):
            self.fs.remove(path)
            return None
        return found.value

    def started(self, root: Any, info: dict[str, Any] | None = None) -> None:
        """The run of ``root`` starts (again): state running (``info``: its
        ``run.json`` as read already)."""
        if info is None:
            info = self.meta(root) or {}
        meta = {
            "key": _json_key(root),
            "state": "running",
            "started": info.get("started") or time.time(),
            "ended": None,
        }
        self._write_meta(root, meta)

    def finished(self, root: Any, value: Any) -> None:
        """The run of ``root`` returned ``value``: kept alone, its children dropped."""
        d = self.run_dir(root)
        self.fs.write(self.fs.join(d, "result"), self._pack_parts(root, None, value, False))
        meta = self.meta(root) or {"key": _json_key(root), "started": time.time()}
        meta.update(state="finished", ended=time.time())
        self._write_meta(root, meta)
        self.drop_children(root)

    def drop_children(self, root: Any) -> None:
        """Delete what a finished run stored for its children and groups."""
        self.fs.remove_under(self.run_dir(root), ("children", "batches", "groups"))
        self.forget_batches(root)

    def failed(self, root: Any) -> None:
        """The run of ``root`` raised: its children stay, for a run again."""
        meta = self.meta(root) or {"key": _json_key(root), "started": time.time()}
        meta.update(state="failed", ended=time.time())
        self._write_meta(root, meta)

    def result(self, root: Any, meta: dict[str, Any] | None = None) -> Found | None:
        """The stored value of a finished run's root, if it checks (``meta``:
        its ``run.json`` as read already)."""
        if meta is None:
            meta = self.meta(root)
        if not meta or meta.get("state") != "finished":
            return None
        path = self.fs.join(self.run_dir(root), "result")
        data = self.fs.read(path)
        if data is None:
            return None
        found = self._unpack(data, root, None)
        if found is None:
            self.fs.remove(path)
        return found

    def meta(self, root: Any) -> dict[str, Any] | None:
        """The ``run.json`` of ``root``'s run (None: no run, or unreadable)."""
        return self._read_meta(self.run_dir(root))

    def _read_meta(self, d: str) -> dict[str, Any] | None:
        data = self.fs.read(self.fs.join(d, "run.json"))
        if data is None:
            return None
        try:
            meta = json.loads(data)
        except ValueError:
            return None
        return meta if isinstance(meta, dict) else None

    def _write_meta(self, root: Any, meta: dict[str, Any]) -> None:
        d = self.run_dir(root)
        self.fs.makedirs(self.fs.join(d, "children"))
        self.fs.makedirs(self.fs.join(d, "groups"))
        self.fs.write(self.fs.join(d, "run.json"), json.dumps(meta).encode())

    def runs(self) -> list[RunInfo]:
        """Every run of the store, the oldest first."""
        out = []
        for name in self._run_names():
            d = self.fs.join("runs", name)
            meta = self._read_meta(d)
            if meta is None:
                continue
            children = self.fs.names(self.fs.join(d, "children"))
            batches = self.fs.names(self.fs.join(d, "batches")) if self.batched else {}
            own = self.fs.names(d)
            state = meta.get("state")
            out.append(
                RunInfo(
                    key=key_from_json(meta.get("key")),
                    state=state if state in STATES else "running",
                    started=float(meta.get("started") or 0.0),
                    ended=meta.get("ended"),
                    children=len(children) + sum(_entries_in(name) for name in batches),
                    bytes=sum(children.values()) + sum(batches.values()) + sum(own.values()),
                )
            )
        out.sort(key=lambda r: r.started)
        return out

    def _run_names(self) -> Iterator[str]:
        fs = self.fs
        if isinstance(fs, _Local):
            try:
                with os.scandir(fs.join("runs")) as it:
                    yield from sorted(e.name for e in it if e.is_dir())
            except FileNotFoundError:
                return
        else:
            fs.fs.invalidate_cache(fs.join("runs"))
            try:
                found = fs.fs.ls(fs.join("runs"), detail=True)
            except FileNotFoundError:
                return
            for e in found:
                if e.get("type") == "directory":
                    yield e["name"].rstrip("/").rsplit("/", 1)[-1]

    def forget(self, root: Any) -> bool:
        """Delete the run of ``root``; whether there was one."""
        d = self.run_dir(root)
        there = self.fs.exists(self.fs.join(d, "run.json")) or self.fs.exists(d)
        self.fs.remove_tree(d)
        self.forget_batches(root)
        return there


def _entries_in(batch: str) -> int:
    """The number of entries a batch's name says it holds (0: not a batch's name)."""
    count = batch.rsplit("-", 1)[-1]
    return int(count) if count.isdigit() else 0


class _NoLock:
    def __enter__(self) -> None:
        pass

    def __exit__(self, *args: Any) -> None:
        pass


_NO_LOCK = _NoLock()


class _Batches:
    """The batches of one run a process read: each one's entries by child
    name (a view of the batch, checked only when it is used), and the
    reason for the names of a batch that is not used whole."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, int] = {}  # batch name -> its bytes
        self.entries: dict[str, list[tuple[str, memoryview | str]]] = {}  # child name -> (batch, entry or why not)
        self.nbytes = 0

    def names(self) -> set[str]:
        with self.lock:
            return set(self.entries)

    def add(self, name: str, data: bytes, store: Store) -> None:
        """Batch ``name``'s entries (its bytes ``data``), the newest batch
        first for each child; a batch whose lengths do not add up is used
        for none of its children (a warning names it, and each child looked
        up in it)."""
        if name in self.objects:
            return  # read by two lookups at once
        found = _parse_batch(data)
        if isinstance(found, str):
            logger.warning(
                "dask_coro: the batch %s of %s is not used, %s; its children are computed again",
                name, store.location, found,
            )
        self.objects[name] = len(data)
        self.nbytes += len(data)
        for child, entry in (found if isinstance(found, list) else _names_in(data, found)):
            self.entries.setdefault(child, []).append((name, entry))
            self.entries[child].sort(key=lambda e: e[0], reverse=True)

    def drop(self, name: str) -> None:
        self.nbytes -= self.objects.pop(name, 0)
        for child in list(self.entries):
            kept = [e for e in self.entries[child] if e[0] != name]
            if kept:
                self.entries[child] = kept
            else:
                del self.entries[child]

    def get(self, store: Store, key: Any, token: str) -> Found | None:
        """``key``'s outcome from the newest of its entries that checks; one
        that does not is warned of (naming ``key``) and not tried again."""
        child = store.child_name(key)
        with self.lock:
            entries = list(self.entries.get(child, ()))
        for batch, entry in entries:
            if isinstance(entry, str):
                found = None
                logger.warning(
                    "dask_coro: the stored entry of %r in %s is not used, %s; computing it again",
                    key, store.location, entry,
                )
            else:
                found = store._unpack(entry, key, token)
            if found is not None:
                return found
            with self.lock:
                kept = [e for e in self.entries.get(child, ()) if e != (batch, entry)]
                if kept:
                    self.entries[child] = kept
                else:
                    self.entries.pop(child, None)
        return None


def _parse_batch(data: bytes) -> list[tuple[str, memoryview]] | str:
    """A batch's entries (child name, entry), or why it is not a batch."""
    if not data.startswith(BATCH) or len(data) < len(BATCH) + 4:
        return "it is not a batch (corrupt)"
    (count,) = struct.unpack_from("<I", data, len(BATCH))
    at = len(BATCH) + 4
    end = at + count * _BATCH_ENTRY.size
    if end > len(data):
        return "it is torn (its entries are not all there)"
    heads = [_BATCH_ENTRY.unpack_from(data, at + i * _BATCH_ENTRY.size) for i in range(count)]
    if end + sum(size for _, size in heads) != len(data):
        return "it is torn (its entries' lengths do not add up to its size)"
    whole = memoryview(data)
    out = []
    for name, size in heads:
        out.append((name.decode("ascii", "replace"), whole[end : end + size]))
        end += size
    return out


def _names_in(data: bytes, why: str) -> list[tuple[str, str]]:
    """The child names a batch that is not used lists, as far as it can be
    read: each with why its entry is not used."""
    if not data.startswith(BATCH) or len(data) < len(BATCH) + 4:
        return []
    (count,) = struct.unpack_from("<I", data, len(BATCH))
    at = len(BATCH) + 4
    count = min(count, (len(data) - at) // _BATCH_ENTRY.size)
    reason = f"its batch {why}"
    return [
        (_BATCH_ENTRY.unpack_from(data, at + i * _BATCH_ENTRY.size)[0].decode("ascii", "replace"), reason)
        for i in range(count)
    ]
