"""A large entry written to a local file without going through the page
cache (``O_DIRECT``, Linux), where the file system takes it.

A durable run writes each child's value once and reads it only at a resume,
if ever. Written the usual way, every byte first fills a page of the page
cache: a gigabyte of entries is a gigabyte of fresh memory the host must
provide and the kernel later write back, 0.2 s of CPU when the memory was
freed a moment before and 1.1-1.6 s after an idle pause on a virtual machine
that hands freed memory back to its host (free page reporting). ``O_DIRECT``
moves the bytes from a reused aligned buffer straight to the disk: about
0.15 s of CPU for a gigabyte either way (the time waiting for the disk is
spent on a writer thread, which nothing waits for).

``O_DIRECT`` wants the buffer, the offset and the length aligned to the
device's block: the entry is copied through a page-aligned buffer in chunks,
the last one padded, and the file truncated to the entry's length. A file
system that refuses it (tmpfs, some FUSE ones: ``EINVAL``) gets the entry
written the usual way; ``write`` says so by returning False.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from typing import Any

#: Entries at least this large go without the page cache.
DIRECT_BYTES = 4 << 20
_CHUNK = 4 << 20  # a multiple of every block size
_ALIGN = 4096
_FLAG = getattr(os, "O_DIRECT", 0)

_free: list[mmap.mmap] = []  # the aligned buffers, reused (touched once: resident)
_lock = threading.Lock()


def available() -> bool:
    return bool(_FLAG)


def write(path: str, parts: list[Any]) -> bool:
    """Write ``parts`` one after the other to a new file ``path`` (0600,
    created here: ``FileExistsError`` if it is there) without the page
    cache; False, and no file left, where the file system refuses it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAG, 0o600)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    with _lock:
        buf = _free.pop() if _free else mmap.mmap(-1, _CHUNK)
    done = False
    try:
        total = _copy_out(fd, buf, parts)
        os.ftruncate(fd, total)
        done = True
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)
        with _lock:
            if len(_free) < 4:
                _free.append(buf)
        if not done:
            os.unlink(path)
    return done


def _copy_out(fd: int, buf: mmap.mmap, parts: list[Any]) -> int:
    """The parts through ``buf`` to ``fd`` in whole blocks; their length."""
    whole = memoryview(buf)
    try:
        fill = total = 0
        for part in parts:
            view = memoryview(part).cast("B")
            while view.nbytes:
                n = min(view.nbytes, _CHUNK - fill)
                whole[fill : fill + n] = view[:n]
                fill += n
                view = view[n:]
                if fill == _CHUNK:
                    _write_all(fd, whole)
                    total += fill
                    fill = 0
        if fill:
            padded = -(-fill // _ALIGN) * _ALIGN
            whole[fill:padded] = bytes(padded - fill)
            _write_all(fd, whole[:padded])
            total += fill
        return total
    finally:
        whole.release()


def _write_all(fd: int, view: memoryview) -> None:
    while view.nbytes:
        n = os.write(fd, view)
        view = view[n:]
