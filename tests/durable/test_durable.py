"""Durable runs (``coro.durability.store``): a coroutine tree resumed from a
store after the loss of its whole cluster and its client, every child
stored before the loss reused without running; entries authenticated, so
nobody gets in through the store; runs listed and forgotten."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import dask
import pytest
from distributed import Client
from distributed.utils_test import async_poll_for, captured_logger
from filelog import append as _append
from filelog import lines as _lines
from helpers import cluster, dask_cli, free_port, recorder

import dask_coro
import dask_coro.durable.local
from dask_coro import coroutine
from dask_coro.core.keys import child_key, derive_key
from dask_coro.durable.store import BATCH, MAGIC, MAGIC_BLAKE3, Store, StoreError

HERE = Path(__file__).parents[1]  # tests/, where durable_program.py is

# --------------------------------------------------------------------------
# the store


def _child(n: int) -> str:
    return child_key(derive_key("inc", "root", 0, (n,)), f"token-{n}")


def test_an_entry_reads_back_and_checks_its_key_and_token(tmp_path):
    s = Store(str(tmp_path / "st"))
    a, b = _child(1), _child(2)
    with pytest.raises(FileNotFoundError):
        s.put_child("root", a, 1)  # a run that has not started (or has finished): none stored
    s.started("root")
    assert s.put_child("root", a, {"x": 1})
    assert s.put_child("root", b, ValueError("no"), error=True)
    assert not s.put_child("root", "my-named-key", 1)  # a key the user named: not stored
    assert s.get_child("root", a).value == {"x": 1}
    found = s.get_child("root", b)
    assert found.error and isinstance(found.value, ValueError)
    assert s.stored_children("root") == {s.child_name(a), s.child_name(b)}
    # An entry moved under another key's name is not that key's.
    os.replace(s.child_path("root", a), s.child_path("root", b))
    with captured_logger("dask_coro") as log:
        assert s.get_child("root", b) is None
    assert repr(b) in log.getvalue() and "another key" in log.getvalue()


def test_an_arrays_data_and_a_large_bytes_value_are_stored_out_of_band_and_read_back(tmp_path):
    np = pytest.importorskip("numpy")
    s = Store(str(tmp_path / "st"))
    s.started("root")
    k = _child(4)
    arr = np.arange(100_000, dtype="f8")
    parts = s._pack_parts(k, k[-16:], arr, False)
    assert [memoryview(p).nbytes for p in parts][-1] == arr.nbytes  # its data, not copied into the pickle
    s.put_child("root", k, arr)
    back = s.get_child("root", k).value
    assert (back == arr).all() and back.flags.writeable
    Path(s.child_path("root", k)).write_bytes(b"".join(parts)[:-1])  # torn: its buffers do not add up
    with captured_logger("dask_coro") as log:
        assert s.get_child("root", k) is None
    assert repr(k) in log.getvalue()
    # A value of large bytes too: written from where it is, read back as bytes.
    blob = bytes(range(256)) * 1024
    parts = s._pack_parts(k, k[-16:], blob, False)
    assert [memoryview(p).nbytes for p in parts][-1] == len(blob) and len(parts[-2]) < 64
    s.put_child("root", k, blob, again=True)
    back = s.get_child("root", k).value
    assert type(back) is bytes and back == blob
    s.put_child("root", k, blob[:100], again=True)  # small: in its pickle
    assert s.get_child("root", k).value == blob[:100]


@pytest.mark.parametrize("refused", [False, True])
def test_a_large_entry_is_written_without_the_page_cache_where_the_file_system_takes_it(
    tmp_path, monkeypatch, refused
):
    """A local directory writes a large entry with O_DIRECT (Linux), through
    an aligned buffer, truncated to its length. A file system that refuses
    O_DIRECT (EINVAL: some FUSE ones, tmpfs before Linux 6.6) gets it written
    the usual way, from then on. Either way it reads back."""
    from dask_coro.durable import direct

    if not direct.available():
        pytest.skip("no O_DIRECT on this platform")
    probe = tmp_path / "probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
    except OSError:
        refused = True  # this file system refuses it already
    if refused:
        real_open = os.open

        def refusing(path, flags, *args):
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_open(path, flags, *args)

        monkeypatch.setattr(os, "open", refusing)
    s = Store(str(tmp_path / "st"))
    s.started("root")
    k = _child(5)
    value = bytes(range(251)) * (direct.DIRECT_BYTES // 251 + 3)  # not a whole number of blocks
    written = s.write_child("root", k, value)
    assert written >= direct.DIRECT_BYTES
    path = Path(s.child_path("root", k))
    assert path.stat().st_size == written
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert s.get_child("root", k).value == value
    assert s.fs.direct is not refused


def test_the_key_file_is_made_with_the_store_for_its_owner_only(tmp_path):
    s = Store(str(tmp_path / "st"))
    s.mac_key
    key = tmp_path / "st" / "key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert Store(str(tmp_path / "st")).mac_key == s.mac_key  # the same key, read again
    key.chmod(0o644)
    with pytest.raises(StoreError, match="only its owner"):
        Store(str(tmp_path / "st")).mac_key
    with pytest.raises(StoreError, match=r"coro\.durability\.store-key"):
        Store("memory://runs").mac_key
    assert Store("memory://runs", secret="s3cret").mac_key == b"s3cret"


@pytest.fixture(params=["hmac-sha256", "blake3"])
def mac(request, monkeypatch):
    """Entries written with either MAC: HMAC-SHA256, or a keyed BLAKE3 hash
    (where the blake3 package is installed)."""
    import dask_coro.durable.store as store

    if request.param == "blake3":
        if store.BLAKE3 is None:
            pytest.skip("blake3 is not installed")
    else:
        monkeypatch.setattr(store, "BLAKE3", None)
    return request.param


def test_an_entry_of_another_key_or_corrupt_or_torn_is_never_unpickled(tmp_path, mac):
    s = Store(str(tmp_path / "st"))
    k = _child(3)
    s.started("root")
    s.put_child("root", k, 3)
    path = s.child_path("root", k)
    good = Path(path).read_bytes()
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Opens(str(marker)))
    other = Store(str(tmp_path / "other"))  # another store's key signed it
    other_entry = other._pack(k, k[-16:], _Opens(str(marker)), False)
    assert good.startswith(MAGIC_BLAKE3 if mac == "blake3" else MAGIC)
    made_up = [magic + bytes(32) + good[40:44] + evil for magic in (MAGIC, MAGIC_BLAKE3)]
    for data in (evil, MAGIC + evil, good[:-3], good[:40] + evil, other_entry, *made_up):
        Path(path).write_bytes(data)
        with captured_logger("dask_coro") as log:
            assert s.get_child("root", k) is None
        assert repr(k) in log.getvalue()
        assert not os.path.exists(path)  # dropped: computed and stored again
    assert not marker.exists()


def test_entries_of_either_mac_read_back_and_one_that_cannot_be_checked_is_never_unpickled(
    tmp_path, monkeypatch
):
    """A store written before blake3 was installed (HMAC-SHA256) reads
    back with it; an entry whose MAC is a keyed BLAKE3 hash, read where
    blake3 is not installed, cannot be checked: it is computed again, with a
    warning naming its key and the package, and never unpickled."""
    import dask_coro.durable.store as store

    if store.BLAKE3 is None:
        pytest.skip("blake3 is not installed")
    s = Store(str(tmp_path / "st"))
    s.started("root")
    a, b = _child(1), _child(2)
    with monkeypatch.context() as m:
        m.setattr(store, "BLAKE3", None)
        s.put_child("root", a, "sha")
    s.put_child("root", b, "blake")
    assert Path(s.child_path("root", a)).read_bytes().startswith(MAGIC)
    assert Path(s.child_path("root", b)).read_bytes().startswith(MAGIC_BLAKE3)
    assert s.get_child("root", a).value == "sha" and s.get_child("root", b).value == "blake"
    marker = tmp_path / "pwned"
    forged = s._pack(b, b[-16:], _Opens(str(marker)), False)  # with the key: it would check
    Path(s.child_path("root", b)).write_bytes(forged)
    monkeypatch.setattr(store, "BLAKE3", None)
    with captured_logger("dask_coro") as log:
        assert s.get_child("root", b) is None
        assert s.get_child("root", a).value == "sha"
    assert repr(b) in log.getvalue() and "blake3 package" in log.getvalue()
    assert not marker.exists()


class _Opens:
    """A pickle that writes a file when it is loaded."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _batch(entries) -> bytes:
    """A batch as the store writes one: ``BATCH``, the number of entries,
    each one's child name and length, then the entries."""
    head = BATCH + struct.pack("<I", len(entries))
    head += b"".join(struct.pack("<32sQ", name.encode(), len(e)) for name, e in entries)
    return head + b"".join(e for _, e in entries)


def _batches(s, root) -> list[str]:
    return sorted(s.fs.fs.find(s.fs.join(s.run_dir(root), "batches")))


def test_a_batchs_entries_read_back_and_a_forged_or_torn_one_is_never_unpickled(tmp_path):
    s = Store(f"memory://batches-{tmp_path.name}", secret="s3cret")
    assert s.batched and not Store(str(tmp_path / "st")).batched  # a local directory: one file per entry
    s.started("root")
    keys = [_child(i) for i in range(6)]
    s.write_children("root", [(k, s.pack_child(k, {"i": i})) for i, k in enumerate(keys[:4])])
    [batch] = _batches(s, "root")  # one object for the four entries
    assert s.stored_children("root") == {s.child_name(k) for k in keys[:4]}
    assert {k: f.value for k, f in s.get_children("root", keys).items()} == {k: {"i": i} for i, k in enumerate(keys[:4])}
    [info] = s.runs()
    assert info.children == 4 and info.bytes > s.fs.fs.size(batch)
    # Someone who can write the store but has not its key, and a torn batch.
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Opens(str(marker)))
    other = Store(str(tmp_path / "other"))
    good = s.pack_child(keys[3], 3)
    s.fs.fs.rm(batch)
    names = [s.child_name(k) for k in keys]
    s.fs.fs.pipe_file(s.fs.join(s.run_dir("root"), "batches", f"{1:020d}-a-3"), _batch([
        (names[0], evil),  # a bare pickle
        (names[1], MAGIC + bytes(32) + evil),  # a made-up HMAC
        (names[2], other._pack(keys[2], keys[2][-16:], _Opens(str(marker)), False)),  # another key signed it
    ]))
    s.fs.fs.pipe_file(s.fs.join(s.run_dir("root"), "batches", f"{2:020d}-b-1"), _batch([(names[3], b"".join(good))])[:-1])
    s.fs.fs.pipe_file(s.fs.join(s.run_dir("root"), "batches", f"{3:020d}-c-1"), _batch([(names[4], evil)]) + b"more")
    reader = Store(f"memory://batches-{tmp_path.name}", secret="s3cret")  # another process: nothing read yet
    with captured_logger("dask_coro") as log:
        assert reader.stored_children("root") == set(names[:5])
        assert reader.get_children("root", keys) == {}
    assert not marker.exists()
    warned = log.getvalue()
    for k in keys[:5]:
        assert repr(k) in warned  # each child of a forged entry or a torn batch named
    assert warned.count("does not check with the store's key") == 2 and warned.count("is torn") >= 2
    # Stored again in a newer batch: that one is used, the forged one not
    # tried again (in another process, the newest first).
    s.write_children("root", [(keys[0], s.pack_child(keys[0], "again"))])
    with captured_logger("dask_coro") as log:
        assert reader.stored_children("root") == {names[0]}
        assert reader.get_child("root", keys[0]).value == "again"
    assert log.getvalue() == ""
    with captured_logger("dask_coro") as log:
        fresh = Store(f"memory://batches-{tmp_path.name}", secret="s3cret")
        assert fresh.get_child("root", keys[0]).value == "again"
    assert repr(keys[0]) not in log.getvalue()
    assert reader.forget("root")
    assert reader.runs() == []


def test_runs_are_listed_and_forgotten_and_a_finished_one_keeps_its_result_only(tmp_path):
    loc = str(tmp_path / "st")
    s = Store(loc)
    s.started("a")
    s.put_child("a", _child(1), b"x" * 1000)
    s.started(("b", 1))
    s.put_child(("b", 1), _child(2), 2)
    s.finished(("b", 1), 42)
    s.started("c")
    s.failed("c")
    runs = {r.key: r for r in dask_coro.runs(store=loc)}
    assert set(runs) == {"a", ("b", 1), "c"}
    assert (runs["a"].state, runs["a"].children) == ("running", 1) and runs["a"].bytes > 1000
    assert (runs[("b", 1)].state, runs[("b", 1)].children) == ("finished", 0)
    assert s.result(("b", 1)).value == 42
    assert runs["c"].state == "failed"
    assert dask_coro.forget_run("a", store=loc)
    assert not dask_coro.forget_run("a", store=loc)
    assert {r.key for r in dask_coro.runs(store=loc)} == {("b", 1), "c"}
    with dask.config.set({"coro.durability.store": loc}):
        assert {r.key for r in dask_coro.runs()} == {("b", 1), "c"}
    with pytest.raises(ValueError, match=r"coro\.durability\.store"):
        dask_coro.runs()


def test_the_command_line_lists_and_forgets_runs(tmp_path):
    loc = str(tmp_path / "st")
    s = Store(loc)
    s.started("my-run")
    s.put_child("my-run", _child(1), 1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-m", "dask_coro", "runs", "--store", loc], capture_output=True, text=True, env=env,
        cwd=HERE.parent, check=True,
    ).stdout
    assert "my-run" in out and "running" in out
    out = subprocess.run(
        [sys.executable, "-m", "dask_coro", "runs", "--store", loc, "--forget", "my-run"],
        capture_output=True, text=True, env=env, cwd=HERE.parent, check=True,
    ).stdout
    assert "forgot" in out
    assert dask_coro.runs(store=loc) == []


# --------------------------------------------------------------------------
# on a cluster


def work(i, folder):
    _append(folder, "executions", str(i))
    return i * 10


def failing(i, folder):
    _append(folder, "executions", f"f{i}")
    raise ZeroDivisionError(f"child {i}")


@coroutine
def two_yields(n, folder, fail_at_end):
    xs = yield [dask.delayed(work)(i, folder) for i in range(n)]
    ys = yield [dask.delayed(work)(100 + x, folder) for x in xs[:2]]
    if fail_at_end:
        raise ValueError("the run fails after its children")
    return sum(xs) + sum(ys)


def _executions(folder):
    return Counter(_lines(folder, "executions"))


async def _compute(c, s, call):
    """``call``'s value, its key forgotten by the scheduler afterwards (a key
    computed again is a new computation, as in a new program)."""
    key = call.key
    f = c.compute(call)
    error = None
    try:
        value = await f
    except Exception as e:
        error = e.with_traceback(None)  # its frames hold the future
    del f
    await async_poll_for(lambda: key not in s.tasks, timeout=10)
    if error is not None:
        raise error
    return value


@cluster()
async def test_a_run_again_reuses_every_stored_child_and_a_finished_one_its_result(c, s, a, b, tmp_path):
    folder, store = str(tmp_path), str(tmp_path / "store")
    with dask.config.set({"coro.durability.store": store}):
        with pytest.raises(ValueError, match="fails after"):
            await _compute(c, s, two_yields(5, folder, True, dask_key_name="run-1"))
        first = _executions(folder)
        assert sum(first.values()) == 7
        [info] = dask_coro.runs()
        assert (info.key, info.state, info.children) == ("run-1", "failed", 7)
        # The program fixed: nothing computed again but the root's body.
        assert await _compute(c, s, two_yields(5, folder, False, dask_key_name="run-1")) == 2200
        assert _executions(folder) == first
        [info] = dask_coro.runs()
        assert (info.key, info.state, info.children) == ("run-1", "finished", 0)
        # A finished run: its root's result, the body never runs.
        assert await _compute(c, s, two_yields(5, folder, True, dask_key_name="run-1")) == 2200
        assert _executions(folder) == first
        # Another root key is another run.
        assert await _compute(c, s, two_yields(5, folder, False, dask_key_name="run-2")) == 2200
        assert sum(_executions(folder).values()) == 14
    # Without the setting nothing is read or stored.
    assert await _compute(c, s, two_yields(5, folder, False, dask_key_name="run-1")) == 2200
    assert sum(_executions(folder).values()) == 21


@coroutine
def shifted(n, folder, shift, fail):
    xs = yield [dask.delayed(work)(i + shift, folder) for i in range(n)]
    if fail:
        raise ValueError("fails")
    return xs


@cluster()
async def test_a_child_whose_call_changed_is_computed_anew(c, s, a, b, tmp_path):
    folder, store = str(tmp_path), str(tmp_path / "store")
    with dask.config.set({"coro.durability.store": store}):
        with pytest.raises(ValueError):
            await _compute(c, s, shifted(3, folder, 0, True, dask_key_name="run"))
        # The same slots, other calls: never the stored values.
        assert await _compute(c, s, shifted(3, folder, 10, False, dask_key_name="run")) == [100, 110, 120]
    assert sorted(_lines(folder, "executions")) == ["0", "1", "10", "11", "12", "2"]


@coroutine
def with_an_error(folder, fail):
    try:
        yield dask.delayed(failing)(1, folder)
    except ZeroDivisionError as e:
        caught = str(e)
    x = yield dask.delayed(work)(2, folder)
    if fail:
        raise ValueError("fails")
    return caught, x


@cluster()
async def test_a_stored_error_is_raised_again_at_its_yield(c, s, a, b, tmp_path):
    folder, store = str(tmp_path), str(tmp_path / "store")
    with dask.config.set({"coro.durability.store": store}):
        with pytest.raises(ValueError):
            await _compute(c, s, with_an_error(folder, True, dask_key_name="run"))
        assert await _compute(c, s, with_an_error(folder, False, dask_key_name="run")) == ("child 1", 20)
    assert _lines(folder, "executions") == ["f1", "2"]


@coroutine
def grouped(n, folder, fail):
    out = []
    with dask_coro.group() as g:
        for i in range(n):
            g.spawn(dask.delayed(work)(i, folder))
        while g:
            _, value = yield g.next()
            out.append(value)
    if fail:
        raise ValueError("fails")
    return sorted(out)


@cluster()
async def test_a_groups_stored_children_are_not_computed_again(c, s, a, b, tmp_path):
    folder, store = str(tmp_path), str(tmp_path / "store")
    with dask.config.set({"coro.durability.store": store}):
        with pytest.raises(ValueError):
            await _compute(c, s, grouped(4, folder, True, dask_key_name="run"))
        assert await _compute(c, s, grouped(4, folder, False, dask_key_name="run")) == [0, 10, 20, 30]
    assert sorted(_lines(folder, "executions")) == ["0", "1", "2", "3"]


def slept(i, folder, seconds):
    _append(folder, "executions", str(i))
    time.sleep(seconds)
    return i


@coroutine
def in_completion_order(n, folder, fail):
    order = []
    with dask_coro.group(timeout=600) as g:
        for i in range(n):  # the first spawned finish last, the first time
            g.spawn(dask.delayed(slept)(i, folder, 0.2 * (n - i)))
        while g:
            _, index = yield g.next()  # its value is its index
            order.append(index)
    if fail:
        raise ValueError(repr((order, g.deadline)))
    return order, g.deadline


@cluster()
async def test_a_groups_delivery_order_and_deadline_are_replayed_from_the_store(c, s, a, b, tmp_path):
    """Run again on a scheduler that has forgotten the first run (as a new
    cluster would), every child given from the store: the group delivers
    them in the order the first run took them, with the first run's
    deadline, not the order the store gives them in now."""
    folder, store = str(tmp_path), str(tmp_path / "store")
    with dask.config.set({"coro.durability.store": store}):
        with pytest.raises(ValueError) as info:
            await _compute(c, s, in_completion_order(5, folder, True, dask_key_name="run"))
        await async_poll_for(_writes_done, timeout=10)
        first_order, first_deadline = eval(str(info.value))
        assert sorted(first_order) == list(range(5)) and first_order != list(range(5))
        assert await _compute(c, s, in_completion_order(5, folder, False, dask_key_name="run")) == (
            first_order, first_deadline
        )
    assert sorted(_lines(folder, "executions")) == ["0", "1", "2", "3", "4"]  # none again


@cluster()
async def test_a_forged_entry_is_computed_again_with_a_warning_and_never_loaded(c, s, a, b, tmp_path):
    folder, store = str(tmp_path), str(tmp_path / "store")
    marker = tmp_path / "pwned"
    r = recorder(s)
    with dask.config.set({"coro.durability.store": store}):
        with pytest.raises(ValueError):
            await _compute(c, s, shifted(3, folder, 0, True, dask_key_name="run"))
        keys = sorted(set(r.ran("work")))
        assert len(keys) == 3
        entries = sorted((Path(store) / "runs").glob("*/children/*"))
        assert len(entries) == 3
        # Someone who can write the store but has not its key: a bare pickle,
        # an entry with a made-up HMAC, one signed with another store's key.
        evil = pickle.dumps(_Opens(str(marker)))
        header = b'{"key": "x", "token": null, "error": false}'
        made_up = MAGIC + bytes(32) + struct.pack("<I", len(header)) + header + evil
        other = Store(str(tmp_path / "other"))
        signed = [other._pack(k, k[-16:], _Opens(str(marker)), False) for k in keys]
        for path, data in zip(entries, [evil, made_up, signed[0]]):
            path.write_bytes(data)
        with captured_logger("dask_coro") as log:
            assert await _compute(c, s, shifted(3, folder, 0, False, dask_key_name="run")) == [0, 10, 20]
    assert not marker.exists()
    assert Counter(_lines(folder, "executions")) == {"0": 2, "1": 2, "2": 2}
    warned = log.getvalue()
    assert warned.count("is not used") == 3 and warned.count("does not check with the store's key") == 2
    for key in keys:
        assert repr(key) in warned  # each warning names the child's key


def _writes_done():
    w = dask_coro.durable.local.WRITES
    return not w.queue and w.idle == w.threads


def sized(i, folder, nbytes):
    _append(folder, "executions", str(i))
    return bytes(nbytes)


@coroutine
def long_loop(n, folder, fail):
    total = 0
    for i in range(n):  # one child at a time: each consumed before the next
        total += len((yield dask.delayed(sized)(i, folder, 1000)))
    if fail:
        raise ValueError("fails")
    return total


@cluster()
async def test_store_bytes_bounds_what_a_running_run_keeps_stored(c, s, a, b, tmp_path):
    folder, store = str(tmp_path), str(tmp_path / "store")
    n, bound = 20, 4096
    with dask.config.set({"coro.durability.store": store, "coro.durability.store-bytes": bound}):
        with pytest.raises(ValueError):
            await _compute(c, s, long_loop(n, folder, True, dask_key_name="run"))
        await async_poll_for(_writes_done, timeout=10)
        [info] = dask_coro.runs()
        assert 0 < info.children < n
        entry = max(p.stat().st_size for p in Path(store).glob("runs/*/children/*"))
        # Each worker (here, the process) stores until it wrote the bound: one entry past it at most.
        assert sum(p.stat().st_size for p in Path(store).glob("runs/*/children/*")) < bound + entry
        kept = info.children
        # A resume computes the others again, and only those.
        assert await _compute(c, s, long_loop(n, folder, False, dask_key_name="run")) == n * 1000
    assert sum(_executions(folder).values()) == n + (n - kept)
    with dask.config.set({"coro.durability.store-bytes": "lots"}), pytest.raises(ValueError, match="store-bytes"):
        dask_coro._config.check()


# --------------------------------------------------------------------------
# the whole cluster and the client lost: SIGKILL, then the program again


def _assert_only_the_running_ran_again(folder: str, n: int, slow: int) -> None:
    """Of ``n`` children, the ``n - slow`` fast ones, stored before the loss,
    ran once (never again); the ``slow`` ones, running at the loss, twice."""
    ran = _executions(folder)
    assert {str(i): ran[str(i)] for i in range(n - slow)} == {str(i): 1 for i in range(n - slow)}
    assert {str(i): ran[str(i)] for i in range(n - slow, n)} == {str(i): 2 for i in range(n - slow, n)}


def _program(store, folder, n, slow) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    return subprocess.Popen(
        [sys.executable, str(HERE / "durable_program.py"), store, folder, str(n), str(slow)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )


@pytest.mark.timeout(240)
def test_a_run_killed_with_its_cluster_finishes_from_the_store(tmp_path):
    """The program's process group (client, scheduler, worker processes)
    SIGKILLed once the fast children are stored, while the slow ones run;
    the same program again computes only those that were running."""
    store, folder = str(tmp_path / "store"), str(tmp_path)
    n, slow = 12, 3
    (tmp_path / "hold").touch()
    p = _program(store, folder, n, slow)
    try:
        deadline = time.monotonic() + 180
        stored: list = []
        while time.monotonic() < deadline and p.poll() is None:
            stored = list((tmp_path / "store").glob("runs/*/children/*"))
            ran = _executions(folder)
            if len(stored) == n - slow and all(str(i) in ran for i in range(n - slow, n)):
                break
            time.sleep(0.1)
        assert p.poll() is None, p.communicate()
        assert len(stored) == n - slow, (sorted(ran), os.killpg(p.pid, signal.SIGKILL), p.communicate())
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
    [info] = dask_coro.runs(store=store)
    assert (info.key, info.state, info.children) == ("durable-program", "running", n - slow)
    (tmp_path / "hold").unlink()
    p = _program(store, folder, n, slow)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    assert int(out.split()[-1]) == sum(i * i for i in range(n))
    _assert_only_the_running_ran_again(folder, n, slow)
    [info] = dask_coro.runs(store=store)
    assert (info.state, info.children) == ("finished", 0)


# --------------------------------------------------------------------------
# the scheduler lost under a live client: SIGKILL, then a new scheduler at
# the same address


def _cli_cluster(tmp_path, port, n_workers, run):
    """``dask scheduler`` on 127.0.0.1:``port`` and ``n_workers`` ``dask
    worker`` processes without a nanny (SIGKILL ends them), of 2 threads."""
    procs = [dask_cli("scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", ":0",
                      log=tmp_path / f"s{run}.log")]
    for i in range(n_workers):
        procs.append(dask_cli(
            "worker", f"tcp://127.0.0.1:{port}", "--nthreads", "2", "--host", "127.0.0.1", "--no-nanny",
            "--dashboard-address", ":0", "--local-directory", str(tmp_path / f"w{run}-{i}"),
            log=tmp_path / f"w{run}-{i}.log",
        ))
    return procs


def _until_stored_and_running(tmp_path, folder: str, n: int, slow: int) -> None:
    """Until the fast children are stored and the slow ones run (120 s at most)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        stored = list((tmp_path / "store").glob("runs/*/children/*"))
        ran = _executions(folder)
        if len(stored) == n - slow and all(str(i) in ran for i in range(n - slow, n)):
            return
        time.sleep(0.1)
    assert len(stored) == n - slow, sorted(ran)


def _kill(procs):
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait(timeout=30)


class _LiveCluster:
    """``_cli_cluster`` of two workers at a free port of 127.0.0.1; ``kill()``
    SIGKILLs the scheduler and its workers, ``start_again()`` starts new ones
    at the same address."""

    def __init__(self, tmp_path):
        self.tmp_path, self.port, self.runs = tmp_path, free_port(), 0
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.procs = _cli_cluster(tmp_path, self.port, 2, self.runs)

    def kill(self) -> None:
        _kill(self.procs)

    def start_again(self) -> None:
        self.runs += 1
        self.procs = _cli_cluster(self.tmp_path, self.port, 2, self.runs)


@contextlib.contextmanager
def _client_of_a_live_cluster(tmp_path, store: str):
    """A client, with ``store`` as its durable store, of a ``_LiveCluster``
    whose slow children wait while the file ``tmp_path/hold`` is there; the
    scheduler and the workers are SIGKILLed at the end."""
    (tmp_path / "hold").touch()
    live = _LiveCluster(tmp_path)
    try:
        with dask.config.set({"coro.durability.store": store}), Client(live.address, timeout=60) as c:
            c.wait_for_workers(2, timeout=60)
            yield c, live
    finally:
        live.kill()


@pytest.mark.timeout(240)
def test_a_live_clients_durable_root_resumes_on_a_new_scheduler(tmp_path, monkeypatch):
    """The scheduler and its workers SIGKILLed once the fast children are
    stored, while the slow ones run; a new scheduler at the same address,
    new workers: the client, still alive, sends its durable root again when
    it reconnects and the user's Future gets the root's value. Children
    stored before the loss do not run again; those running at the loss do."""
    from durable_program import run

    store, folder = str(tmp_path / "store"), str(tmp_path)
    n, slow = 12, 3
    monkeypatch.setenv("DASK_CORO__DURABILITY__STORE", store)
    monkeypatch.setenv("DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION", "1.0")
    with _client_of_a_live_cluster(tmp_path, store) as (c, live):
        future = c.compute(run(n, folder, slow, dask_key_name="durable-live-client"))
        other = c.submit(sum, [1, 2])  # not a durable root: cancelled by the loss, as in distributed
        assert other.result(timeout=60) == 3
        _until_stored_and_running(tmp_path, folder, n, slow)
        live.kill()
        (tmp_path / "hold").unlink()
        live.start_again()
        assert future.result(timeout=120) == sum(i * i for i in range(n))
        assert other.status == "cancelled"
    _assert_only_the_running_ran_again(folder, n, slow)
    [info] = dask_coro.runs(store=store)
    assert (info.key, info.state, info.children) == ("durable-live-client", "finished", 0)


@pytest.mark.timeout(240)
def test_a_root_whose_worker_died_reads_its_lost_childrens_results_from_the_store(tmp_path, monkeypatch):
    """The worker running the root and holding the fast children's results
    SIGKILLed, while the slow children run on the other worker, children not
    held for a re-run (``hold-children: false``): the root runs again there,
    and the fast children, whose results went with the dead worker, come
    from the store instead of running again (without a store each ran twice
    here, computed again for the root's re-run); the slow ones, let go of
    with the root's first run, run again.

    Their hold is let go only once the scheduler let go of them (the dead
    run's client gone): let go earlier, a slow child could finish while the
    scheduler still wanted it, and the re-run found its result in memory
    (it ran once); which of the two happened was a race. The slow children
    hold both threads of their worker, so the re-run starts, and asks for
    them again, only once their first executions ended."""
    from durable_program import pinned

    store, folder = str(tmp_path / "store"), str(tmp_path)
    n, slow = 10, 2
    monkeypatch.setenv("DASK_CORO__DURABILITY__STORE", store)
    monkeypatch.setenv("DASK_CORO__DURABILITY__HOLD_CHILDREN", "false")
    with _client_of_a_live_cluster(tmp_path, store) as (c, _):
        doomed, other = sorted(c.scheduler_info()["workers"])
        pids = c.run(os.getpid)
        root = pinned(n, folder, slow, doomed, other, dask_key_name="durable-worker-lost")
        future = c.compute(root, workers=[doomed], allow_other_workers=True)
        _until_stored_and_running(tmp_path, folder, n, slow)
        running = c.run_on_scheduler(_processing_on, address=other)
        assert len(running) == slow, running
        os.kill(pids[doomed], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while set(running) & c.run_on_scheduler(_keys) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not set(running) & c.run_on_scheduler(_keys), "the scheduler kept the dead run's children"
        (tmp_path / "hold").unlink()
        assert future.result(timeout=120) == sum(i * i for i in range(n))
    _assert_only_the_running_ran_again(folder, n, slow)


def _processing_on(dask_scheduler, address):
    """The keys processing on worker ``address``."""
    return [
        str(k) for k, ts in dask_scheduler.tasks.items()
        if ts.state == "processing" and ts.processing_on is not None and ts.processing_on.address == address
    ]


def _keys(dask_scheduler):
    return {str(k) for k in dask_scheduler.tasks}


# --------------------------------------------------------------------------
# an S3-API store (a local moto server, as s3fs's own tests use)


@pytest.fixture(scope="module")
def s3_server():
    """The endpoint of a moto S3 server on 127.0.0.1, with a bucket ``runs``."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        # Made here, the filesystem's IO threads (fsspec's loop, its
        # executor) are there before a test starts: not leaked by it.
        import boto3
        import fsspec

        boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket="runs")
        fsspec.filesystem("s3", **_s3_settings(endpoint, "")["coro.durability.store-options"]).ls("runs")
        yield endpoint
    finally:
        server.stop()


def _s3_settings(endpoint, name):
    return {
        "coro.durability.store": f"s3://runs/{name}",
        "coro.durability.store-key": "a-secret-shared-by-every-host",
        "coro.durability.store-options": {
            "endpoint_url": endpoint, "key": "testing", "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
        },
    }


@cluster()
async def test_an_s3_store_resumes_a_run_and_refuses_forged_entries(c, s, a, b, tmp_path, s3_server):
    folder, marker = str(tmp_path), tmp_path / "pwned"
    settings = _s3_settings(s3_server, "resume")
    settings["coro.durability.store-batch-window"] = 0  # each entry an object of its own
    with dask.config.set(settings):
        with pytest.raises(ValueError):
            await _compute(c, s, shifted(3, folder, 0, True, dask_key_name="run"))
        [info] = dask_coro.runs()
        assert (info.key, info.state, info.children) == ("run", "failed", 3)
        # A resume from the store: nothing computed again.
        with pytest.raises(ValueError):
            await _compute(c, s, shifted(3, folder, 0, True, dask_key_name="run"))
        assert sorted(_lines(folder, "executions")) == ["0", "1", "2"]
        # Someone who can write the bucket but has not the store's key.
        store = dask_coro.durable.local.store_of_settings()
        entries = sorted(store.fs.fs.find(store.fs.join("runs")))
        entries = [e for e in entries if "/children/" in e]
        assert len(entries) == 3
        other = Store(str(tmp_path / "other"))
        evil = pickle.dumps(_Opens(str(marker)))
        store.fs.fs.pipe_file(entries[0], evil)
        store.fs.fs.pipe_file(entries[1], other._pack("x", None, _Opens(str(marker)), False))
        with captured_logger("dask_coro") as log:
            assert await _compute(c, s, shifted(3, folder, 0, False, dask_key_name="run")) == [0, 10, 20]
        [info] = dask_coro.runs()
        assert (info.state, info.children) == ("finished", 0)
        assert dask_coro.forget_run("run") and dask_coro.runs() == []
    assert not marker.exists()
    assert sorted(Counter(_lines(folder, "executions")).values()) == [1, 2, 2]  # the 2 forged: again
    assert log.getvalue().count("is not used") == 2


@cluster()
async def test_an_s3_stores_batches_resume_a_run_and_a_forged_or_torn_one_is_never_loaded(
    c, s, a, b, tmp_path, s3_server
):
    folder, marker = str(tmp_path), tmp_path / "pwned"
    r = recorder(s)
    with dask.config.set(_s3_settings(s3_server, "batched")):
        with pytest.raises(ValueError):
            await _compute(c, s, shifted(3, folder, 0, True, dask_key_name="run"))
        store = dask_coro.durable.local.store_of_settings()
        objects = store.fs.fs.find(store.fs.join("runs"))
        batches = [o for o in objects if "/batches/" in o]
        assert batches and not [o for o in objects if "/children/" in o]  # no object per entry
        # The run's end wrote every worker's open batch: all its children stored.
        [info] = dask_coro.runs()
        assert (info.key, info.state, info.children) == ("run", "failed", 3)
        assert info.bytes == sum(store.fs.fs.size(o) for o in objects)
        # A resume from the batches: nothing computed again, nor written again.
        with pytest.raises(ValueError):
            await _compute(c, s, shifted(3, folder, 0, True, dask_key_name="run"))
        assert sorted(_lines(folder, "executions")) == ["0", "1", "2"]
        assert store.fs.fs.find(store.fs.join("runs")) == objects
        # Someone who can write the bucket but has not the store's key: one
        # entry a bare pickle in a batch that adds up, one in a torn batch.
        keys = sorted(set(r.ran("work")))
        entries = {}
        for o in batches:
            data = store.fs.fs.cat_file(o)
            (count,) = struct.unpack_from("<I", data, len(BATCH))
            at = len(BATCH) + 4 + 40 * count
            for i in range(count):
                name, size = struct.unpack_from("<32sQ", data, len(BATCH) + 4 + 40 * i)
                entries[name.decode()] = data[at : at + size]
                at += size
            store.fs.fs.rm_file(o)
        names = [store.child_name(k) for k in keys]
        d = store.fs.join(store.run_dir("run"), "batches")
        evil = pickle.dumps(_Opens(str(marker)))
        store.fs.fs.pipe_file(f"{d}/{1:020d}-a-2", _batch([(names[0], evil), (names[2], entries[names[2]])]))
        store.fs.fs.pipe_file(f"{d}/{2:020d}-b-1", _batch([(names[1], entries[names[1]])])[:-1])
        with captured_logger("dask_coro") as log:
            assert await _compute(c, s, shifted(3, folder, 0, False, dask_key_name="run")) == [0, 10, 20]
        [info] = dask_coro.runs()
        assert (info.state, info.children) == ("finished", 0)
        assert dask_coro.forget_run("run") and dask_coro.runs() == []
    assert not marker.exists()
    assert sorted(Counter(_lines(folder, "executions")).values()) == [1, 2, 2]  # the forged and the torn: again
    warned = log.getvalue()
    assert "not an entry" in warned and "is torn" in warned
    for key in keys[:2]:
        assert repr(key) in warned  # each warning names the child's key


_HELD = threading.Event()  # a batch is being written (the workers are in the test's process)


def _once_held():
    return _HELD.wait(30)


@coroutine
def stored_then_held(n, folder):
    xs = yield [dask.delayed(work)(i, folder) for i in range(n)]
    assert (yield dask.delayed(_once_held)())
    return xs


@cluster()
async def test_a_finished_runs_value_waits_for_no_write_and_what_lands_after_is_deleted(
    c, s, a, b, tmp_path, monkeypatch
):
    """A run that returns does not wait for its children's writes still in
    flight (no resume will read them): its value arrives while a batch is
    held mid-write; once the batch lands, the writer deletes it, and the
    store keeps the run's result alone."""
    import dask_coro.durable.writes as writes

    folder = str(tmp_path)
    gate, held = threading.Event(), _HELD
    held.clear()
    real = writes.write_batch

    def held_write(store, root, items):
        held.set()
        gate.wait(60)
        real(store, root, items)

    monkeypatch.setattr(writes, "write_batch", held_write)
    monkeypatch.setattr(writes, "FLUSH_TIMEOUT", 5.0)  # before: the run's end waited this long
    settings = {
        "coro.durability.store": f"memory://finished-{tmp_path.name}",  # batched, as an object store is
        "coro.durability.store-key": "s3cret",
        "coro.durability.store-batch-window": "10ms",
    }
    try:
        with dask.config.set(settings), captured_logger("dask_coro") as log:
            future = c.compute(stored_then_held(4, folder, dask_key_name="run"))
            assert await future == [0, 10, 20, 30]
            assert held.is_set() and not gate.is_set()  # a batch was mid-write as the value came
            assert writes.BATCHES.waiting("run") > 0
            gate.set()
            await async_poll_for(lambda: writes.BATCHES.waiting("run") == 0, timeout=30)
            store = dask_coro.durable.local.store_of_settings()
            [info] = dask_coro.runs()
            assert (info.key, info.state, info.children) == ("run", "finished", 0)
            assert store.stored_children("run") == set()
            assert store.result("run").value == [0, 10, 20, 30]
        assert "not all stored" not in log.getvalue()
    finally:
        gate.set()


@pytest.mark.timeout(240)
def test_a_worker_killed_before_its_batch_is_written_runs_those_children_again(tmp_path, monkeypatch, s3_server):
    """The worker running the root SIGKILLed while the fast children it
    finished wait in its open batch (a window of an hour: nothing written
    before the run's end), the slow ones running on the other worker: the
    root runs again there, finds none stored, and computes them again; its
    value is right, and the run's end leaves it finished."""
    from distributed import Client
    from durable_program import pinned

    folder = str(tmp_path)
    n, slow = 8, 2
    settings = {**_s3_settings(s3_server, "killed"), "coro.durability.store-batch-window": "1h"}
    for name, value in settings.items():
        monkeypatch.setenv("DASK_" + name.upper().replace(".", "__").replace("-", "_"), repr(value))
    monkeypatch.setenv("DASK_CORO__DURABILITY__HOLD_CHILDREN", "false")
    (tmp_path / "hold").touch()
    port = free_port()
    procs = _cli_cluster(tmp_path, port, 2, 0)
    try:
        with dask.config.set(settings), Client(f"tcp://127.0.0.1:{port}", timeout=60) as c:
            c.wait_for_workers(2, timeout=60)
            doomed, other = sorted(c.scheduler_info()["workers"])
            pids = c.run(os.getpid)
            root = pinned(n, folder, slow, doomed, other, dask_key_name="durable-batch-lost")
            future = c.compute(root, workers=[doomed], allow_other_workers=True)
            deadline = time.monotonic() + 120
            waiting = 0
            while time.monotonic() < deadline:
                waiting = c.run(_waiting_entries, workers=[doomed])[doomed]
                if waiting == n - slow and all(str(i) in _executions(folder) for i in range(n)):
                    break
                time.sleep(0.1)
            assert waiting == n - slow
            store = dask_coro.durable.local.store_of_settings()
            assert store.stored_children("durable-batch-lost") == set()  # none written yet
            os.kill(pids[doomed], signal.SIGKILL)
            (tmp_path / "hold").unlink()
            assert future.result(timeout=120) == sum(i * i for i in range(n))
            [info] = dask_coro.runs()
    finally:
        _kill(procs)
    assert (info.key, info.state, info.children) == ("durable-batch-lost", "finished", 0)
    assert _executions(folder) == {str(i): 2 for i in range(n)}  # the fast ones too: their batch was lost


def _waiting_entries() -> int:
    from dask_coro.durable.writes import BATCHES

    return BATCHES.waiting()
