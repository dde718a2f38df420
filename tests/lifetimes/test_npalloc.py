"""NumPy's allocator of a stream item's arrays in shared memory
(``lifetimes/_npalloc.c``), without a cluster: which arrays it serves, and
what handing one over does (``shm.hand_over``)."""

from __future__ import annotations

import contextvars
import mmap
import os

import numpy as np
import pytest

from dask_coro.lifetimes import shm

alloc = shm.allocator()
pytestmark = pytest.mark.skipif(alloc is None, reason="the allocator is not built")

N = 1 << 20


@pytest.fixture
def segment():
    fd = os.memfd_create("dask-coro-test")
    os.ftruncate(fd, N)
    mm = mmap.mmap(fd, N)
    address = shm._address(mm)
    assert alloc.arm(address, N)
    yield fd, mm, address
    alloc.disarm(address)  # freed arrays leave it FREE or empty
    os.close(fd)


def _in_context(fn):
    def run():
        shm.install_allocator()
        return fn()

    return contextvars.copy_context().run(run)


def test_only_arrays_of_an_armed_size_made_in_its_context_are_served(segment):
    _, _, address = segment
    other = np.full(N, 1, np.uint8)  # not in the context
    assert other.__array_interface__["data"][0] != address
    smaller = _in_context(lambda: np.full(N // 2, 1, np.uint8))
    assert smaller.__array_interface__["data"][0] != address
    a = _in_context(lambda: np.full(N, 7, np.uint8))
    assert a.__array_interface__["data"][0] == address
    assert alloc.state(address) == alloc.USED
    b = _in_context(lambda: np.full(N, 8, np.uint8))  # the one slot is taken
    assert b.__array_interface__["data"][0] != address
    del a
    assert alloc.state(address) == alloc.FREE  # free again, for the next
    del smaller, b, other


def test_an_array_handed_over_empties_its_slot_when_freed(segment):
    _, _, address = segment
    a = _in_context(lambda: np.full(N, 7, np.uint8))
    assert alloc.hand(address) == alloc.USED
    assert alloc.state(address) == alloc.HANDED
    assert alloc.hand(address) == alloc.HANDED  # once: it stays the item's
    del a
    assert alloc.state(address) == alloc.EMPTY  # the segment is the item's
    b = _in_context(lambda: np.full(N, 1, np.uint8))
    assert b.__array_interface__["data"][0] != address


def test_a_retired_slot_is_never_served_again(segment):
    _, _, address = segment
    a = _in_context(lambda: np.full(N, 7, np.uint8))
    assert alloc.retire(address) == alloc.USED
    del a
    assert alloc.state(address) == alloc.EMPTY
    b = _in_context(lambda: np.full(N, 1, np.uint8))
    assert b.__array_interface__["data"][0] != address
