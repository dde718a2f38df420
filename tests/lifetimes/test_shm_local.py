"""``dask_coro.shm`` arrays outside a cluster: handles, views, other processes,
local lifetime, bad input. The cluster lifetimes are in test_shm_faults.py."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dask_coro import shm


@pytest.fixture(autouse=True)
def no_segment_left(monkeypatch):
    """Outside a cluster a segment lives as long as its arrays: once a test's
    arrays are gone, so are the segments it made. The segments this process
    made, by name: the host's (``shm.segments()``) may meanwhile hold a
    segment of another process of the machine."""
    from dask_coro.lifetimes import shm as impl

    made: list[str] = []
    create = impl._create

    def recording(nbytes):
        segment = create(nbytes)
        made.append(segment.name)
        return segment

    monkeypatch.setattr(impl, "_create", recording)
    yield
    gc.collect()
    left = sorted(set(made) & set(shm.segments()))
    assert not left, f"segments left behind: {left}"


def exists(name: str) -> bool:
    return name in shm.segments()


def test_empty_is_zeroed_shared_and_named():
    a = shm.empty((3, 4), dtype="i4")
    assert isinstance(a, shm.ShmArray) and isinstance(a, np.ndarray)
    assert a.shape == (3, 4) and a.dtype == np.dtype("i4") and a.flags.c_contiguous
    assert (a == 0).all()
    assert a.segment_name.startswith(shm.PREFIX)
    assert exists(a.segment_name)


def test_from_array_copies_values():
    src = np.arange(12.0).reshape(3, 4)
    a = shm.from_array(src)
    np.testing.assert_array_equal(a, src)
    src[0, 0] = 99
    assert a[0, 0] == 0


def test_fortran_order():
    a = shm.empty((3, 4), dtype="f8", order="F")
    assert a.flags.f_contiguous
    a[...] = np.arange(12).reshape(3, 4)
    b = pickle.loads(pickle.dumps(a))
    np.testing.assert_array_equal(b, np.arange(12).reshape(3, 4))


def test_pickles_as_a_small_handle():
    a = shm.from_array(np.arange(1_000_000, dtype="f8"))  # 8 MB
    data = pickle.dumps(a)
    assert len(data) < 500
    b = pickle.loads(data)
    np.testing.assert_array_equal(a, b)
    b[5] = -1
    assert a[5] == -1  # same memory


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a[10:20],
        lambda a: a[::-3],
        lambda a: a.reshape(10, 10).T,
        lambda a: a.reshape(10, 10)[2:5, ::2],
        lambda a: a[100:],  # empty, at the end
    ],
    ids=["slice", "negative-stride", "transpose", "2d-strided", "empty-end"],
)
def test_views_pickle_as_handles_to_the_same_memory(view):
    a = shm.from_array(np.arange(100.0))
    v = view(a)
    assert isinstance(v, shm.ShmArray) and v.segment_name == a.segment_name
    data = pickle.dumps(v)
    assert len(data) < 500
    w = pickle.loads(data)
    np.testing.assert_array_equal(w, v)
    assert w.shape == v.shape and w.strides == v.strides


def test_new_memory_is_a_plain_array():
    a = shm.from_array(np.arange(10.0))
    for out in (a + 1, np.sqrt(a), a * a):
        assert type(out) is np.ndarray
    c = a.copy()
    assert c.segment_name is None
    d = pickle.loads(pickle.dumps(c))
    assert type(d) is np.ndarray
    np.testing.assert_array_equal(d, a)
    assert float(a.sum()) == 45.0


def test_another_process_maps_the_same_memory():
    a = shm.from_array(np.arange(10, dtype="i8"))
    code = textwrap.dedent(
        """
        import pickle, sys
        b = pickle.loads(sys.stdin.buffer.read())
        assert list(b) == list(range(10)), list(b)
        b[0] = 1234  # seen by the parent
        print(int(b[9]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(a), capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.strip() == b"9"
    assert a[0] == 1234


def test_local_segment_unlinked_when_arrays_are_collected():
    a = shm.empty(10)
    name = a.segment_name
    v = a[2:]
    del a
    gc.collect()
    assert exists(name)  # the view still holds it
    del v
    gc.collect()
    assert not exists(name)


def test_local_segment_unlinked_at_process_exit():
    code = "from dask_coro import shm; a = shm.empty(10); print(a.segment_name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(shm.PREFIX)
    assert not exists(out.stdout.strip())


def test_attaching_a_released_segment_names_the_problem():
    a = shm.empty(10)
    data = pickle.dumps(a)
    name = a.segment_name
    del a
    gc.collect()
    assert not exists(name)
    with pytest.raises(FileNotFoundError, match=f"{name}.*released"):
        pickle.loads(data)


def test_distributed_serialization_sends_the_handle():
    from distributed.protocol import deserialize, serialize

    a = shm.from_array(np.arange(1_000_000, dtype="f8"))
    header, frames = serialize(a, serializers=("dask", "pickle"))
    assert sum(len(memoryview(f).cast("B")) for f in frames) < 500
    b = deserialize(header, frames)
    assert isinstance(b, shm.ShmArray) and b.segment_name == a.segment_name
    # nested, as in a task's result
    header, frames = serialize({"x": [a[:10]]}, serializers=("dask", "pickle"))
    out = deserialize(header, frames)
    np.testing.assert_array_equal(out["x"][0], np.arange(10.0))
    # an array whose memory is not shared travels by value
    plain = a.copy()
    header, frames = serialize(plain, serializers=("dask", "pickle"))
    np.testing.assert_array_equal(deserialize(header, frames), plain)


def test_sizeof_counts_the_handle_not_the_pages():
    from dask.sizeof import sizeof

    a = shm.empty(1_000_000)
    assert sizeof(a) < 1000
    assert sizeof(a.copy()) == a.nbytes


def test_zero_sized_and_scalar_shapes():
    for shape in [(0,), (), 0, (3, 0)]:
        a = shm.empty(shape, dtype="f4")
        b = pickle.loads(pickle.dumps(a))
        assert b.shape == a.shape == (np.empty(shape).shape)


def test_segments_in_finds_nested_managed_arrays_only():
    a = shm.empty(5)  # outside a cluster: local lifetime, not managed
    assert shm.segments_in([a, {"k": (a,)}]) == set()
    a._segment.managed = True
    try:
        assert shm.segments_in({"k": [1, (a[1:],)]}) == {a.segment_name}
        cyclic: list = [a]
        cyclic.append(cyclic)
        assert shm.segments_in(cyclic) == {a.segment_name}
        assert shm.segments_in(np.arange(3)) == set()
    finally:
        a._segment.managed = False


@pytest.mark.parametrize(
    "args, kwargs, exc, match",
    [
        ((10,), {"dtype": object}, TypeError, "Python objects"),
        ((-1,), {}, ValueError, "non-negative"),
        (((2, 2.5),), {}, ValueError, "non-negative integers"),
        ((3,), {"order": "K"}, ValueError, "order"),
        ((3,), {"dtype": "not-a-dtype"}, TypeError, "not-a-dtype"),
    ],
)
def test_bad_input(args, kwargs, exc, match):
    before = set(shm.segments())
    with pytest.raises(exc, match=match):
        shm.empty(*args, **kwargs)
    assert set(shm.segments()) == before  # nothing made


def test_from_array_of_objects():
    with pytest.raises(TypeError, match="Python objects"):
        shm.from_array(np.array([object()]))


def test_a_sending_marker_is_never_seen_half_written(tmp_path, monkeypatch):
    """The marker that says "this host is being sent these bytes, or just
    was" is read by the other workers of the host while its sender writes it.
    Read empty it would look like a dead sender's, and the bytes would cross
    to that host a second time (seen in CI on a loaded machine)."""
    import threading

    from dask_coro.lifetimes import shm as impl

    monkeypatch.setattr(impl, "_SHM_DIR", str(tmp_path))
    segment = type("Seg", (), {"origin": "dask-coro-0123"})()
    path = impl._marker(segment.origin, "127.0.0.9", "k")
    stop = threading.Event()
    seen_empty: list[int] = []

    def reader():
        while not stop.is_set():
            try:
                with open(path) as f:
                    if f.read() == "":
                        seen_empty.append(1)
            except FileNotFoundError:
                pass

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(3000):
            sending = impl.sending_to([("k", segment)], "127.0.0.9")
            assert sending.claim()
            sending.done(sent=True)
            assert impl._marker_holds(path)
            os.unlink(path)
    finally:
        stop.set()
        t.join()
    assert not seen_empty
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_copy_hashed_as_it_lands_has_the_digest_of_its_bytes_in_memory_order(order):
    """A stream's producer hashes an item's array while copying it into its
    segment (one pass over the bytes): the digest is that of the whole copy
    taken after, so a re-run that hashed otherwise compares equal."""
    xxhash = pytest.importorskip("xxhash")
    from dask_coro.lifetimes.shm import HASH_CHUNK, _copy_hashed

    a = np.asarray(np.arange(3 * HASH_CHUNK // 8 + 5, dtype=np.float64).reshape(-1, 1), order=order)
    a = np.asfortranarray(np.hstack([a, -a])) if order == "F" else np.hstack([a, -a])
    out = shm.empty(a.shape, a.dtype, order=order)
    h = xxhash.xxh3_128()
    assert _copy_hashed(out, a, h)
    np.testing.assert_array_equal(out, a)
    assert h.hexdigest() == xxhash.xxh3_128_hexdigest(out.view(np.ndarray).ravel(order="K"))
    del out


def test_a_strided_array_is_not_hashed_as_it_is_copied():
    xxhash = pytest.importorskip("xxhash")
    from dask_coro.lifetimes.shm import _copy_hashed

    a = np.arange(1000, dtype=np.int64)[::2]
    out = shm.empty(a.shape, a.dtype)
    h = xxhash.xxh3_128()
    assert not _copy_hashed(out, a, h)
    assert h.hexdigest() == xxhash.xxh3_128().hexdigest()  # fed nothing
    del out


def test_a_sent_segment_holds_back_the_same_key_to_that_host_not_another(tmp_path, monkeypatch):
    """A key's value sent to a host marks the key and its segment for that
    host: the same key asked again from that host is ``busy`` (fetch it from
    the worker there that got it), but another key holding the same segment
    is sent (no worker there holds that key: a ``busy`` sent its asker back
    here until the grace ran out, 10 s)."""
    from dask_coro.lifetimes import shm as impl

    monkeypatch.setattr(impl, "_SHM_DIR", str(tmp_path))
    segment = type("Seg", (), {"origin": "dask-coro-0123"})()
    first = impl.sending_to([("x", segment)], "127.0.0.9")
    assert first.claim()
    first.done(sent=True)
    assert not impl.sending_to([("x", segment)], "127.0.0.9").claim()  # same key, just sent
    assert impl.sending_to([(("y", 0), segment)], "127.0.0.9").claim()  # another key
    assert impl.sending_to([("x", segment)], "127.0.0.8").claim()  # another host
    both = impl.sending_to([("x", segment), ("z", segment)], "127.0.0.9")
    assert not both.claim()  # x is held back, so z's marker is let go of again
    assert impl.sending_to([("z", segment)], "127.0.0.9").claim()
