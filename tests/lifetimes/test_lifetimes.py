"""``tie``: resources released when the last key holding them is forgotten.

In-process clusters (gen_cluster, validation on), so releases can be counted in
a module-level list; separate processes and /dev/shm are in test_shm_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import warnings

import dask
import pytest
from bodies import cleared
from distributed import Event, get_worker, wait
from distributed.utils_test import async_poll_for, captured_logger, gen_cluster

import dask_coro
from dask_coro import DaskCoroError, LifetimesPlugin, NotInTaskError, coroutine, tie
from dask_coro.lifetimes.scheduler import NAME

validated = dict(
    client=True,
    nthreads=[("", 1), ("", 1)],
    scheduler_kwargs={"validate": True},
    worker_kwargs={"validate": True},
)

#: (resource id, address of the worker that ran the release)
RELEASED: list[tuple[str, str]] = []


_clear = cleared(RELEASED)


def record(rid: str) -> None:
    RELEASED.append((rid, get_worker().address))


def bad_release(rid: str) -> None:
    RELEASED.append((rid, "bad"))
    raise RuntimeError("release exploded")


def released_ids() -> list[str]:
    return [rid for rid, _ in RELEASED]


def tie_and_return(rid, value, key=None):
    tie(rid, record, key=key)
    return value


def ledger(s):
    return s.plugins[NAME].ledger


async def settled(s):
    """Wait until no release is owed or running."""
    await async_poll_for(lambda: NAME in s.plugins and not ledger(s).owed and not ledger(s).sent, 10)


@gen_cluster(**validated)
async def test_release_when_key_forgotten(c, s, a, b):
    fut = c.submit(tie_and_return, "r1", 42, key="holder")
    assert await fut == 42
    assert ledger(s).holders("r1") == {"holder"}
    assert RELEASED == []  # held by the client's future
    del fut
    await async_poll_for(lambda: RELEASED, 10)
    assert released_ids() == ["r1"]
    await settled(s)
    assert not ledger(s)


@gen_cluster(**validated)
async def test_release_runs_on_the_worker_that_tied(c, s, a, b):
    fut = c.submit(tie_and_return, "r", 1, workers=[b.address])
    await fut
    del fut
    await async_poll_for(lambda: RELEASED, 10)
    assert RELEASED == [("r", b.address)]


@gen_cluster(**validated)
async def test_same_id_from_two_keys_counts_references(c, s, a, b):
    f1 = c.submit(tie_and_return, "shared", 1, key="k1", workers=[a.address])
    await f1
    f2 = c.submit(tie_and_return, "shared", 2, key="k2", workers=[b.address])
    await f2
    assert ledger(s).holders("shared") == {"k1", "k2"}
    del f1
    await async_poll_for(lambda: "k1" not in s.tasks, 10)
    await asyncio.sleep(0.2)
    assert RELEASED == []  # k2 still holds it
    del f2
    await async_poll_for(lambda: RELEASED, 10)
    await settled(s)
    assert released_ids() == ["shared"]  # exactly once
    assert RELEASED[0][1] == a.address  # the worker that tied it first


@gen_cluster(**validated)
async def test_intermediate_key_released_with_its_last_dependent(c, s, a, b):
    x = dask.delayed(tie_and_return)("mid", 5, dask_key_name="mid-key")
    y = dask.delayed(lambda v: v + 1)(x, dask_key_name="y")
    fut = c.compute(y)
    assert await fut == 6
    # distributed drops mid-key's data once y ran, but keeps the key (released)
    # while y exists, to recompute y after data loss: it is not forgotten yet.
    await async_poll_for(lambda: s.tasks["mid-key"].state == "released", 10)
    await asyncio.sleep(0.2)
    assert RELEASED == []
    del fut
    await async_poll_for(lambda: RELEASED, 10)
    assert released_ids() == ["mid"]
    assert "mid-key" not in s.tasks


@gen_cluster(**validated)
async def test_released_on_error_of_holder(c, s, a, b):
    def tie_then_fail():
        tie("err", record)
        raise ValueError("boom")

    fut = c.submit(tie_then_fail)
    await wait(fut)  # (an exception caught here would keep the future alive)
    assert fut.status == "error"
    assert RELEASED == []  # the erred key is held by the future
    del fut
    await async_poll_for(lambda: RELEASED, 10)
    assert released_ids() == ["err"]


@gen_cluster(**validated)
async def test_released_on_cancel_while_running(c, s, a, b):
    ev = Event()

    def tie_then_wait(ev):
        tie("cancelled", record)
        ev.wait(30)
        return 1

    fut = c.submit(tie_then_wait, ev)
    await async_poll_for(lambda: ledger(s).holders("cancelled") if NAME in s.plugins else False, 10)
    await fut.cancel()
    await async_poll_for(lambda: RELEASED, 10)
    assert released_ids() == ["cancelled"]
    await ev.set()


@gen_cluster(**validated)
async def test_tie_to_forgotten_key_releases_at_once_with_warning(c, s, a, b):
    def tie_to_nothing():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            tie("orphan", record, key="never-submitted")
        return [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]

    with captured_logger("dask_coro", level=logging.INFO) as log:
        messages = await c.submit(tie_to_nothing)
    assert len(messages) == 1
    assert "'never-submitted'" in messages[0] and "already forgotten" in messages[0]
    await async_poll_for(lambda: RELEASED, 10)
    assert released_ids() == ["orphan"]
    assert "never-submitted" in log.getvalue()


@gen_cluster(**validated)
async def test_tie_in_coroutine_uses_its_key(c, s, a, b):
    @coroutine
    def gen(x):
        tie("gen-res", record)
        y = yield dask.delayed(lambda v: v * 2)(x)
        return y

    @coroutine
    async def agen(x):
        tie("agen-res", record)
        return await dask_coro.gather(dask.delayed(lambda v: v + 1)(x))

    g = c.compute(gen(3))
    h = c.compute(agen(3))
    assert await g == 6 and await h == 4
    assert ledger(s).holders("gen-res") == {g.key}
    assert ledger(s).holders("agen-res") == {h.key}
    del g, h
    await async_poll_for(lambda: len(RELEASED) == 2, 10)
    assert sorted(released_ids()) == ["agen-res", "gen-res"]


@gen_cluster(**validated)
async def test_release_on_another_worker_of_the_host_when_origin_left(c, s, a, b):
    holder = c.submit(lambda: 1, key="holder", workers=[b.address])
    await holder
    # a ties the id to b's key, then a leaves the cluster
    await c.submit(lambda: tie_and_return("moved", 0, key="holder"), workers=[a.address])
    assert ledger(s).holders("moved") == {"holder"}
    await a.close()
    del holder
    await async_poll_for(lambda: RELEASED, 10)
    assert RELEASED == [("moved", b.address)]


@gen_cluster(**validated)
async def test_failing_release_is_logged_not_retried(c, s, a, b):
    def tie_bad():
        tie("bad", bad_release)
        return 1

    with captured_logger("dask_coro", level=logging.ERROR) as log:
        fut = c.submit(tie_bad)
        await fut
        del fut
        await async_poll_for(lambda: RELEASED, 10)
        await settled(s)
    assert RELEASED == [("bad", "bad")]
    assert "release exploded" in log.getvalue() and "'bad'" in log.getvalue()
    assert not ledger(s)


@gen_cluster(**validated)
async def test_many_concurrent_first_ties_install_once(c, s, a, b):
    futs = c.map(tie_and_return, [f"c{i}" for i in range(40)], range(40))
    assert await c.gather(futs) == list(range(40))
    assert list(s.plugins).count(NAME) == 1
    assert len(ledger(s).holders("c0")) == 1
    del futs
    await async_poll_for(lambda: len(RELEASED) == 40, 10)
    assert sorted(released_ids()) == sorted(f"c{i}" for i in range(40))


@gen_cluster(**validated)
async def test_registering_the_plugin_again_keeps_its_state(c, s, a, b):
    fut = c.submit(tie_and_return, "kept", 1)
    await fut
    plugin = s.plugins[NAME]
    await c.register_plugin(LifetimesPlugin())  # idempotent
    await dask_coro.dask_setup(s)  # preload hook: idempotent too
    assert s.plugins[NAME] is plugin
    del fut
    await async_poll_for(lambda: RELEASED, 10)
    assert released_ids() == ["kept"]


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_restart_hook_releases_everything(c, s, a):
    futs = c.map(tie_and_return, ["x1", "x2"], [1, 2])
    await wait(futs)
    # Scheduler.restart clears its tasks without "forgotten" transitions and
    # calls this hook. (A real client.restart() with nannies, which replaces
    # the workers, is in test_shm_faults.py.)
    s.plugins[NAME].restart(s)
    await async_poll_for(lambda: len(RELEASED) == 2, 10)
    assert sorted(released_ids()) == ["x1", "x2"]


@gen_cluster(**validated)
async def test_scheduler_keeps_only_ids_and_keys(c, s, a, b):
    fut = c.submit(tie_and_return, "plain", 1, key=("tuple", 1))
    await fut
    led = ledger(s)
    assert led.holders("plain") == {("tuple", 1)}
    for value in vars(led).values():
        assert not any(callable(v) for v in (value.values() if isinstance(value, dict) else value))


# -- bad input ---------------------------------------------------------------


def test_tie_outside_a_worker():
    with pytest.raises(NotInTaskError, match="distributed worker"):
        tie("r", record)


@pytest.mark.parametrize(
    "rid, release, match",
    [
        ("", record, "non-empty string"),
        (3, record, "non-empty string"),
        (None, record, "non-empty string"),
        ("r", "not callable", "callable release"),
        ("r", None, "callable release"),
    ],
)
def test_tie_bad_arguments(rid, release, match):
    with pytest.raises(TypeError, match=match):
        tie(rid, release)


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_tie_bad_key(c, s, a):
    def bad_key():
        tie("r", record, key=["a", "list"])

    with pytest.raises(TypeError):
        await c.submit(bad_key)


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_tie_on_the_event_loop_says_to_use_a_thread(c, s, a):
    async def on_loop():
        tie("r", record)

    with pytest.raises(DaskCoroError, match="to_thread"):
        await c.submit(on_loop)

    async def in_thread():
        await asyncio.to_thread(tie, "threaded", record)
        return 1

    fut = c.submit(in_thread)
    assert await fut == 1
    del fut
    await async_poll_for(lambda: RELEASED, 10)
    assert released_ids() == ["threaded"]


@gen_cluster(**validated)
async def test_worker_missing_its_plugin_adds_it_on_first_tie(c, s, a, b):
    await c.submit(tie_and_return, "first", 1, workers=[a.address])
    await async_poll_for(lambda: NAME in b.plugins, 10)
    await b.plugin_remove(NAME)  # as if the scheduler's broadcast had missed b
    fut = c.submit(tie_and_return, "second", 2, workers=[b.address])
    assert await fut == 2
    assert NAME in b.plugins
    del fut
    await async_poll_for(lambda: len(RELEASED) == 2, 10)
    assert sorted(RELEASED) == [("first", a.address), ("second", b.address)]


# -- after a crash -------------------------------------------------------------


def _record_for(token: str, address: str, rid: str) -> str:
    from dask_coro.lifetimes.registry import file_name as _file_name
    from dask_coro.lifetimes.registry import registry_dir
    from dask_coro.lifetimes.registry import write_record as _write_record

    path = os.path.join(registry_dir(token), _file_name(rid))
    _write_record(path, address, rid, record_anywhere)
    return path


def record_anywhere(rid: str) -> None:
    RELEASED.append((rid, "sweep"))


@pytest.fixture
def own_registry(tmp_path):
    """A registry of this test's own (under dask's temporary-directory). Not
    for a gen_cluster test: gen_cluster resets dask's config to what it was
    at import (``config_for_cluster_tests`` calls ``reset_config``), which
    drops this setting; such a test sets it in its body (``registry_in``)."""
    with registry_in(tmp_path):
        yield tmp_path


@contextlib.contextmanager
def registry_in(folder):
    """The release registry of this process under ``folder``, not the host's
    shared one (under the system's temporary directory), where every
    cluster of the host keeps its records: release_abandoned there would run
    those of any dead cluster of another process, another test run's too."""
    from dask_coro.lifetimes.registry import registry_root

    with dask.config.set({"temporary-directory": str(folder)}):
        assert registry_root().startswith(str(folder))
        yield


def test_release_abandoned_runs_releases_of_a_dead_cluster(own_registry):
    from helpers import free_port

    dead = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    paths = [_record_for("Scheduler-dead-test", dead, f"dead-{i}") for i in range(3)]
    with open(paths[0] + ".123.tmp", "wb"):
        pass  # a write the crash cut short
    released = dask_coro.release_abandoned(timeout=2)
    assert sorted(released) == ["dead-0", "dead-1", "dead-2"]
    assert sorted(RELEASED) == [(f"dead-{i}", "sweep") for i in range(3)]
    assert not os.path.exists(os.path.dirname(paths[0]))
    assert dask_coro.release_abandoned(timeout=2) == []  # nothing left


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_release_abandoned_keeps_live_clusters(c, s, a, tmp_path):
    # Set here, not by the own_registry fixture: gen_cluster resets the
    # config, and release_abandoned then swept the host's shared registry,
    # running the records of other processes' dead clusters too.
    with registry_in(tmp_path):
        fut = c.submit(tie_and_return, "live", 1)
        await fut
        # the same address answering with another identity is another cluster
        stale = _record_for("Scheduler-stale-test", s.address, "stale")
        released = await asyncio.to_thread(dask_coro.release_abandoned, 5)
        assert released == ["stale"] and not os.path.exists(stale)
        assert released_ids() == ["stale"]
        del fut
        await async_poll_for(lambda: len(RELEASED) == 2, 10)
        assert released_ids() == ["stale", "live"]


def test_release_abandoned_from_the_command_line(own_registry):
    from helpers import free_port

    _record_for("Scheduler-cli-test", f"tcp://127.0.0.1:{free_port()}", "cli-res")
    env = {**os.environ, "DASK_TEMPORARY_DIRECTORY": str(own_registry)}
    out = subprocess.run(
        [sys.executable, "-m", "dask_coro", "--release-abandoned"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "released 1 resources" in out.stdout and "cli-res" in out.stdout


def test_a_record_is_written_though_its_folder_is_removed_while_makedirs_looks(tmp_path, monkeypatch):
    """A folder emptied by another process's last release is removed
    (``remove_record``); ``os.makedirs`` then finds it existing at its
    mkdir and gone at its check, and raises FileExistsError: the record is
    written on the next try, as when the folder goes before the open."""
    from dask_coro.lifetimes import registry

    made = os.makedirs
    raced = []

    def makedirs(path, mode=0o777, exist_ok=False):
        if not raced:
            raced.append(path)
            raise FileExistsError(17, "File exists", path)
        made(path, mode=mode, exist_ok=exist_ok)

    monkeypatch.setattr(registry.os, "makedirs", makedirs)
    path = os.path.join(str(tmp_path), "records", registry.file_name("rid-1"))
    assert registry.write_record(path, "tcp://127.0.0.1:1", "rid-1", record_anywhere)
    assert raced and os.path.exists(path)
