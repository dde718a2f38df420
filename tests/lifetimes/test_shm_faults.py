"""Shared-memory arrays (``dask_coro.shm``) and ``dask_coro.tie`` under faults,
on a ``LocalCluster`` of worker processes (2 workers x 1 thread).

After each of these the host holds no segment a test made: success; an error
in a consumer; the root future cancelled mid-run; the client closed mid-run; a
worker killed while holding a segment; ``client.restart()``. A segment is never
released while a key that holds it is still wanted (a consumer that starts late
still reads correct data). The lifetime tests of streams run with the
segments a worker keeps for its later streams off and on (``POOL``). Tying an id to a key that is already forgotten
releases at once with a warning. A release runs in a worker process, never in
the scheduler (which, for a ``LocalCluster``, is this test process).

Every task that makes a segment appends its name to a file under ``tmp_path``,
and the tests check those names only: other processes on the machine may make
``dask-coro-*`` segments of their own meanwhile. Releases are asynchronous, so
every check polls with a deadline and, on failure, lists what is left. Anything
that blocks a worker thread waits on a ``distributed.Event`` with a timeout and
is let go in a ``finally``, so closing the cluster never hangs.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import dask
import numpy as np
import pytest
from distributed import Client, Event, LocalCluster, get_worker
from filelog import append as _append
from filelog import lines as _lines
from helpers import workers_now

import dask_coro
from dask_coro import DaskCoroError, coroutine, shm
from dask_coro.lifetimes import shm as _shm_impl
from dask_coro.lifetimes.registry import file_name, registry_dir

try:
    shm.segments()
except DaskCoroError:  # pragma: no cover - not Linux
    pytest.skip("listing shared-memory segments needs Linux", allow_module_level=True)

N = 1000
EXPECTED = N * (N - 1) // 2  # sum(range(N))
DEADLINE = 20  # seconds, for anything asynchronous to happen

# --------------------------------------------------------------------------
# helpers (tasks run in worker processes: they only touch files, shared memory
# and distributed primitives)




def _made(folder: str, n: int = N) -> shm.ShmArray:
    """A new segment holding ``arange(n)``, its name recorded in ``folder``."""
    a = shm.from_array(np.arange(n, dtype=np.int64))
    assert a.segment_name is not None
    _append(folder, "segments", a.segment_name)
    return a


def make(folder: str, n: int = N) -> shm.ShmArray:
    return _made(folder, n)


def halves(a: shm.ShmArray) -> dict:
    """Views of ``a``, inside a dict and a tuple: the result holds the segment."""
    mid = len(a) // 2
    return {"halves": (a[:mid], a[mid:])}


def total(x) -> int:
    if isinstance(x, dict):
        return sum(int(h.sum()) for h in x["halves"])
    return int(np.asarray(x).sum())


def part_sum(a) -> int:
    return int(np.asarray(a).sum())


def fails_reading(a, folder: str) -> None:
    _append(folder, "read", str(int(np.asarray(a).sum())))
    raise ValueError("consumer failed after reading")


def wait_for(go: str) -> str:
    """Block this task until the test sets the Event ``go``."""
    if not Event(go).wait(timeout=60):
        raise TimeoutError(f"event {go!r} was never set")
    return "go"


def make_and_wait(folder: str, go: str) -> int:
    """A plain root that holds a segment while it runs, then blocks."""
    a = _made(folder)
    _append(folder, "parts", str(int(a.sum())))
    wait_for(go)
    return int(a.sum())


@coroutine
def holds_and_waits(folder: str, go: str):
    """A coroutine root that makes a segment, has two children read it, then
    waits on a child that blocks until the test lets it go."""
    a = _made(folder)
    try:
        parts = yield [dask.delayed(part_sum)(a[i::2]) for i in range(2)]
        _append(folder, "parts", str(sum(parts)))
        yield dask.delayed(wait_for)(go)
        return sum(parts)
    finally:
        _append(folder, "root-finally", "ran")


@coroutine
def root_with_failing_child(folder: str):
    a = _made(folder)
    yield dask.delayed(fails_reading)(a[1:], folder)  # raises here, not caught
    return "not reached"


def _roots(kind: str, folder: str, go: str) -> Callable[[Client], object]:
    """How each mid-run test starts its root, on a given client."""
    if kind == "coroutine":
        return lambda c: c.compute(holds_and_waits(folder, go))
    return lambda c: c.submit(make_and_wait, folder, go, pure=False)


# -- checks run in this process ---------------------------------------------


def poll(condition: Callable[[], bool], what: Callable[[], str], timeout: float = DEADLINE):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"after {timeout} s: {what()}")
        time.sleep(0.05)


def existing(names: Iterable[str]) -> set[str]:
    return set(names) & set(shm.segments())


def assert_unlinked(names: Iterable[str]) -> None:
    """Every one of ``names`` is unlinked (polling for it)."""
    names = set(names)
    assert names, "the test made no segment: it would pass vacuously"
    poll(lambda: not existing(names), lambda: f"segments left: {sorted(existing(names))}")


def assert_nothing_owed(client: Client, token: str | None = None) -> None:
    """The scheduler's ledger is empty and this cluster's release registry
    (one folder per host, named by the scheduler's id) holds no file, but
    for the names tied to living workers for the segments they keep for
    later streams (``_spare_slots``: none with the pool off)."""
    poll(
        lambda: not client.run_on_scheduler(_ledger_left),
        lambda: f"scheduler ledger not empty: {client.run_on_scheduler(_ledger_left)}",
    )
    folder = registry_dir(token or client.scheduler_info()["id"])

    def files() -> list[str]:
        slots = {file_name(rid) for rids in client.run_on_scheduler(_spare_slots).values() for rid in rids}
        return sorted(set(os.listdir(folder)) - slots) if os.path.isdir(folder) else []

    poll(lambda: not files(), lambda: f"release registry not empty: {files()}")


def assert_released(client: Client, names: Iterable[str]) -> None:
    """``names`` are unlinked, and so is any segment a living worker kept
    for its later streams (``shm.Spares``, none with the pool off): once
    ``names`` are gone, those kept of them were, unused for
    ``coro.stream.segment-pool-idle``; nothing is owed."""
    assert_unlinked(names)
    slots = {rid for rids in client.run_on_scheduler(_spare_slots).values() for rid in rids}
    poll(lambda: not existing(slots), lambda: f"kept segments left: {sorted(existing(slots))}")
    assert_nothing_owed(client)


def _ledger_left(dask_scheduler=None) -> str:
    """What the lifetimes ledger holds but the names tied to living workers
    for their kept segments (``_spare_slots``)."""
    from dask_coro.lifetimes.scheduler import spare_key

    plugin = dask_scheduler.plugins.get("dask-coro-lifetimes")
    if plugin is None or not plugin.ledger:
        return ""
    ledger = plugin.ledger
    living = {spare_key(w) for w in dask_scheduler.workers}
    tied = sorted(rid for rid in ledger._holders if not ledger.holders(rid) <= living)
    return f"{ledger!r}: tied {tied[:8]}" if tied or ledger.owed or ledger.sent else ""


def _spare_slots(dask_scheduler=None) -> dict[str, list[str]]:
    """By living worker, the names tied to it for the segments it keeps for
    its later streams (``shm.Spares``)."""
    from dask_coro.lifetimes.scheduler import spare_key

    plugin = dask_scheduler.plugins.get("dask-coro-lifetimes")
    if plugin is None:
        return {}
    ledger = plugin.ledger
    return {w: sorted(ledger.ids_of(spare_key(w))) for w in dask_scheduler.workers if ledger.ties(spare_key(w))}


def _tasks(dask_scheduler=None) -> dict:
    return {str(k): ts.state for k, ts in dask_scheduler.tasks.items()}


def wait_lines(folder, name: str, n: int = 1) -> list[str]:
    poll(lambda: len(_lines(folder, name)) >= n, lambda: f"{name}: {_lines(folder, name)}")
    return _lines(folder, name)


#: The lifetime tests of streams run with the segments a worker keeps for
#: its later streams off (as all tests, ``conftest``) and on, as users get
#: them (``coro.stream.segment-pool``), unlinked once unused for 200 ms.
POOL = pytest.mark.parametrize(
    "pool",
    [
        pytest.param("off"),
        pytest.param("on", marks=pytest.mark.segment_pool("256MiB", idle="200ms")),
    ],
)


@pytest.fixture
def cluster():
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    with Client(cluster) as client:
        yield client


# --------------------------------------------------------------------------
# success and errors


@coroutine
def shm_sum(folder: str):
    """A coroutine root that makes a segment and has children read views of it."""
    a = _made(folder)
    parts = yield [dask.delayed(part_sum)(a[i::3]) for i in range(3)]
    return sum(parts)


def test_success_releases_every_segment(client, tmp_path):
    folder = str(tmp_path)
    p = client.submit(make, folder, pure=False)
    v = client.submit(halves, p)  # views in a dict and a tuple: v holds it too
    c = client.submit(total, v)
    r = client.compute(shm_sum(folder))
    assert c.result(timeout=60) == EXPECTED
    assert r.result(timeout=60) == EXPECTED
    arr = p.result(timeout=60)
    assert isinstance(arr, shm.ShmArray)
    np.testing.assert_array_equal(arr, np.arange(N))
    names = _lines(folder, "segments")
    assert len(names) == 2 and arr.segment_name in names
    assert existing(names) == set(names)  # held by futures we still hold
    del p, v, c, r, arr
    assert_released(client, names)


def test_a_release_removes_the_sending_markers_of_its_segment_only(client, tmp_path):
    """A worker that died while sending a segment to another host left its
    marker (``shm.sending_to``), whole or half made: the segment's release
    removes them, and no other segment's."""
    folder = str(tmp_path)
    p = client.submit(make, folder, pure=False)
    name = p.result(timeout=60).segment_name
    other = f"{shm.PREFIX}{uuid.uuid4().hex[:16]}"
    mine = [f"dask-coro.to-10.0.0.9.{name}", f"dask-coro.to-10.0.0.9.{name}.0badf00d"]
    theirs = [f"dask-coro.to-10.0.0.9.{other}", f"dask-coro.to-10.0.0.9.{name}-c", f"dask-coro.to-10.0.0.9.{other}.0badf00d"]
    for marker in mine + theirs:
        with open(os.path.join("/dev/shm", marker), "w") as f:
            f.write("sent")
    try:
        del p
        assert_released(client, [name])
        left = set(os.listdir("/dev/shm"))
        assert not left & set(mine) and set(theirs) <= left, (mine, theirs)
    finally:
        for marker in mine + theirs:
            if os.path.exists(os.path.join("/dev/shm", marker)):
                os.unlink(os.path.join("/dev/shm", marker))


def test_error_in_a_consumer(client, tmp_path):
    folder = str(tmp_path)
    p = client.submit(make, folder, pure=False)
    bad = client.submit(fails_reading, p, folder)
    with pytest.raises(ValueError, match="consumer failed after reading"):
        bad.result(timeout=60)
    root = client.compute(root_with_failing_child(folder))
    with pytest.raises(ValueError, match="consumer failed after reading"):
        root.result(timeout=60)
    # Both consumers read the data before they failed.
    assert _lines(folder, "read") == [str(EXPECTED)] * 2
    names = _lines(folder, "segments")
    assert len(names) == 2
    made_by_p = p.result(timeout=60).segment_name
    # The erred root holds no result, so its segment is gone although the
    # root's key is still known (our future holds it); p's stays: p is held.
    (made_by_root,) = set(names) - {made_by_p}
    assert_unlinked([made_by_root])
    assert existing(names) == {made_by_p}
    # The errors' tracebacks hold the futures (Future.result's frame): release
    # them explicitly rather than wait for the garbage collector.
    for f in (p, bad, root):
        f.release()
    assert_released(client, names)


def test_segment_goes_when_its_key_is_released_though_an_erred_dependent_lives(
    client, tmp_path
):
    """The user catches a consumer's error and keeps going, keeping the
    erred future (and with it the key of the array it read); the array's
    result is released: its segment is gone within seconds, not at the end."""
    folder = str(tmp_path)
    p = client.submit(make, folder, pure=False)
    bad = client.submit(fails_reading, p, folder)
    try:
        bad.result(timeout=60)
    except ValueError as e:
        caught = e  # kept, with its traceback
    names = _lines(folder, "segments")
    assert len(names) == 1 and existing(names) == set(names)
    key = p.key
    del p  # the array is wanted no more; the erred consumer still knows it
    assert_unlinked(names)
    assert key in client.run_on_scheduler(_tasks)  # released, not forgotten
    assert isinstance(caught, ValueError)
    bad.release()
    assert_released(client, names)


# --------------------------------------------------------------------------
# cancelled and closed mid-run


@pytest.mark.parametrize("kind", ["coroutine", "task"])
def test_root_cancelled_mid_run(client, tmp_path, kind):
    folder = str(tmp_path)
    go = f"go-{uuid.uuid4().hex}"
    try:
        fut = _roots(kind, folder, go)(client)
        assert wait_lines(folder, "parts") == [str(EXPECTED)]  # it ran and read the data
        (name,) = _lines(folder, "segments")
        assert existing([name]) == {name}
        assert not fut.done()
        fut.cancel()
        assert_released(client, [name])
        if kind == "coroutine":
            wait_lines(folder, "root-finally")
    finally:
        Event(go, client=client).set()
    assert fut.cancelled()


@pytest.mark.parametrize("kind", ["coroutine", "task"])
def test_client_closed_mid_run(cluster, tmp_path, kind):
    folder = str(tmp_path)
    go = f"go-{uuid.uuid4().hex}"
    with Client(cluster, set_as_default=False) as control:
        try:
            user = Client(cluster, set_as_default=False)
            try:
                fut = _roots(kind, folder, go)(user)
                assert wait_lines(folder, "parts") == [str(EXPECTED)]
                (name,) = _lines(folder, "segments")
                assert existing([name]) == {name}
                assert not fut.done()
            finally:
                user.close()
            assert_unlinked([name])
            assert_nothing_owed(control)
        finally:
            Event(go, client=control).set()
        # The cluster still serves shared memory to the client left.
        assert control.submit(total, control.submit(make, folder, pure=False)).result(
            timeout=60
        ) == EXPECTED
        assert_released(control, _lines(folder, "segments"))


# --------------------------------------------------------------------------
# workers dying, restart


def _kill(cluster: LocalCluster, client: Client, address: str, how: str) -> int:
    """Kill the worker at ``address`` (its nanny starts a new one); its pid."""
    pid = client.run(os.getpid, workers=[address])[address]
    if how == "sigkill":
        os.kill(pid, signal.SIGKILL)
    else:
        (nanny,) = [n for n in cluster.workers.values() if n.worker_address == address]
        cluster.sync(nanny.kill, timeout=30)
    poll(
        lambda: address not in workers_now(client),
        lambda: f"{address} still in {list(client.scheduler_info()['workers'])}",
    )
    return pid


@pytest.mark.parametrize("how", ["sigkill", "nanny-kill"])
def test_worker_killed_while_holding_a_segment(cluster, client, tmp_path, how):
    folder = str(tmp_path)
    p = client.submit(make, folder, pure=False)
    first = p.result(timeout=60)
    (old,) = _lines(folder, "segments")
    assert first.segment_name == old and existing([old]) == {old}
    ((address,),) = client.who_has(p).values()
    _kill(cluster, client, address, how)
    # The only copy of p is gone: the scheduler computes it again (the client
    # still wants it), on a worker of this host, into a new segment.
    wait_lines(folder, "segments", 2)
    second = p.result(timeout=60)
    new = second.segment_name
    assert new != old and _lines(folder, "segments") == [old, new]
    np.testing.assert_array_equal(second, np.arange(N))
    assert client.submit(total, client.submit(halves, p)).result(timeout=60) == EXPECTED
    assert new in shm.segments()
    del p, first, second
    # The old segment's worker is gone: another worker of the host unlinks it.
    assert_released(client, [old, new])


def test_restart_releases_every_segment(client, tmp_path):
    folder = str(tmp_path)
    futures = [client.submit(make, folder, pure=False) for _ in range(4)]
    views = [client.submit(halves, f) for f in futures[:2]]
    client.gather(views + futures)
    names = _lines(folder, "segments")
    assert len(names) == 4 and existing(names) == set(names)
    client.restart()
    assert_released(client, names)
    # After the restart the workers make and release segments as before.
    assert client.submit(total, client.submit(make, folder, pure=False)).result(
        timeout=60
    ) == EXPECTED
    assert_released(client, _lines(folder, "segments"))


# --------------------------------------------------------------------------
# never released while wanted


def consume(x, _gate) -> int:
    return total(x)


@pytest.mark.parametrize("through", ["producer", "view"])
def test_late_consumer_reads_correct_data(client, tmp_path, through):
    """The client holds only the consumer. It waits on a gate, so its inputs
    are done long before it runs; the segment must outlive them being done
    (``producer``) and, when a view task handed it on, the producer's result
    being released (``view``)."""
    folder = str(tmp_path)
    go = f"go-{uuid.uuid4().hex}"
    p = dask.delayed(make, pure=False)(folder)
    held = dask.delayed(halves, pure=False)(p) if through == "view" else p
    gate = dask.delayed(wait_for, pure=False)(go)
    consumer = dask.delayed(consume, pure=False)(held, gate)
    try:
        fut = client.compute(consumer)

        def ready() -> bool:
            tasks = client.run_on_scheduler(_tasks)
            if through == "view":
                # the scheduler keeps a released dependency of a task in memory
                return tasks.get(p.key) == "released" and tasks.get(held.key) == "memory"
            return tasks.get(p.key) == "memory"

        poll(ready, lambda: str(client.run_on_scheduler(_tasks)), timeout=60)
        (name,) = _lines(folder, "segments")
        time.sleep(0.5)  # not a timing assertion: a wrong release gets a chance
        assert existing([name]) == {name}, "released while the consumer still wants it"
        assert not fut.done()
    finally:
        Event(go, client=client).set()
    assert fut.result(timeout=60) == EXPECTED
    del fut
    assert_released(client, [name])


# --------------------------------------------------------------------------
# tie() to a forgotten key; where releases run


def released_marker(folder: str, rid: str) -> None:
    """A release: appends this process's pid to a file named by the id."""
    _append(folder, f"released-{rid}", str(os.getpid()))


def tie_to_forgotten(folder: str, gone: str) -> tuple:
    held, dead = f"held-{uuid.uuid4().hex}", f"dead-{uuid.uuid4().hex}"
    release = functools.partial(released_marker, folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dask_coro.tie(held, release)  # to this task's key
        dask_coro.tie(held, release, key=gone)  # warns; this task's key still holds it
        dask_coro.tie(dead, release, key=gone)  # warns; nothing holds it: released now
    return held, dead, [(w.category.__name__, str(w.message)) for w in caught]


def test_tie_to_a_forgotten_key_releases_at_once_with_a_warning(client, tmp_path):
    folder = str(tmp_path)
    gone = f"never-submitted-{uuid.uuid4().hex}"
    f = client.submit(tie_to_forgotten, folder, gone, pure=False)
    held, dead, caught = f.result(timeout=60)
    assert [c for c, _ in caught] == ["RuntimeWarning", "RuntimeWarning"], caught
    assert all(gone in msg and "already forgotten" in msg for _, msg in caught), caught
    assert repr(held) in caught[0][1] and repr(dead) in caught[1][1]
    # Released at once (while f is still held), on the worker that ran f.
    wait_lines(folder, f"released-{dead}")
    ((address,),) = client.who_has(f).values()
    worker_pid = client.run(os.getpid, workers=[address])[address]
    assert _lines(folder, f"released-{dead}") == [str(worker_pid)]
    time.sleep(0.5)  # not a timing assertion: a wrong release gets a chance
    assert _lines(folder, f"released-{held}") == [], "released while f still holds it"
    del f
    wait_lines(folder, f"released-{held}")
    assert_nothing_owed(client)
    # Exactly once each.
    assert _lines(folder, f"released-{held}") == [str(worker_pid)]
    assert _lines(folder, f"released-{dead}") == [str(worker_pid)]


def tie_ids(folder: str, rids: list[str], key=None) -> str:
    release = functools.partial(released_marker, folder)
    for rid in rids:
        dask_coro.tie(rid, release, key=key)
    return get_worker().address


def identity(x):
    return x


def test_releases_run_in_worker_processes_never_in_the_scheduler(cluster, client, tmp_path):
    folder = str(tmp_path)
    me = os.getpid()  # the LocalCluster's scheduler runs in this process
    pids = client.run(os.getpid)
    assert me not in pids.values()
    a, b = sorted(pids)

    # Normal operation: the worker that tied an id runs its release.
    rids = {w: [f"{w[-5:]}-{i}-{uuid.uuid4().hex}" for i in range(3)] for w in (a, b)}
    ties = {w: client.submit(tie_ids, folder, rids[w], workers=[w], pure=False) for w in (a, b)}
    assert {w: f.result(timeout=60) for w, f in ties.items()} == {a: a, b: b}
    del ties
    for w in (a, b):
        for rid in rids[w]:
            assert wait_lines(folder, f"released-{rid}") == [str(pids[w])]

    # The worker that tied an id is dead when the key is forgotten: another
    # worker of the host runs the release, still not the scheduler.
    holder = client.submit(identity, 1, workers=[b], pure=False)
    holder.result(timeout=60)
    orphan = f"orphan-{uuid.uuid4().hex}"
    t = client.submit(tie_ids, folder, [orphan], holder.key, workers=[a], pure=False)
    assert t.result(timeout=60) == a
    del t
    dead_pid = _kill(cluster, client, a, "sigkill")
    del holder
    (pid,) = wait_lines(folder, f"released-{orphan}")
    client.wait_for_workers(2, timeout=60)
    live = client.run(os.getpid)
    assert int(pid) in live.values(), (pid, live)
    assert int(pid) not in (me, dead_pid)
    assert_nothing_owed(client)


# --------------------------------------------------------------------------
# regressions: a coroutine holds what its children made; the scheduler maps
# nothing


def gone_within(name: str, timeout: float = DEADLINE) -> bool:
    """Whether segment ``name`` is unlinked within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while name in shm.segments():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@coroutine
def receives_a_child_array(folder: str):
    a = yield dask.delayed(make, pure=False)(folder)  # a child makes the segment
    # The body holds the array from here on; the child's key is released.
    gone = yield dask.delayed(gone_within, pure=False)(a.segment_name, 3)
    if gone:
        return gone, None
    parts = yield [dask.delayed(part_sum)(a[i::2]) for i in range(2)]
    return gone, sum(parts)


def test_coroutine_keeps_an_array_a_child_made(client, tmp_path):
    """A coroutine that received a shared-memory array from a child holds it
    like any other value: the segment lives until the coroutine's key is
    forgotten. (It was unlinked as soon as the runner released the child's
    key, right after resuming the body: a later yield handing the array on
    failed, and returning it gave the client a handle to nothing.)"""
    folder = str(tmp_path)
    fut = client.compute(receives_a_child_array(folder))
    gone, parts = fut.result(timeout=60)
    (name,) = _lines(folder, "segments")
    del fut
    assert_released(client, [name])
    assert not gone, "unlinked while the coroutine that received it still ran"
    assert parts == EXPECTED


# A body holds the shared arrays that reach it from a group or a stream as it
# holds a yield's results: tied to its key before the child (the producer)
# is let go of. They were not: a consumer leaving a stream early returned
# arrays whose producer had been cancelled, and without children held for a
# re-run (hold-children off, or no budget for them) the producer of a stream
# read to its end and a group's child were forgotten once delivered. Each
# body below then waits until the test saw every other key of its tree
# forgotten and every release they owed run, and returns what it got.

#: Settings under which nothing holds a consumed child for its parent.
NOT_HELD = {
    "hold-children-off": {"coro.durability.hold-children": False},
    "hold-bytes-0": {"coro.durability.hold-bytes": 0},
}


@pytest.fixture(params=sorted(NOT_HELD))
def client_not_holding(request):
    """A client of a cluster made under one of ``NOT_HELD`` (the worker
    processes take the settings from their nannies)."""
    with dask.config.set(NOT_HELD[request.param]), LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        yield client


@coroutine
def emits_arrays(folder: str, n: int):
    """A stream's producer: ``n`` shared arrays, and one more as its value."""
    for _ in range(n):
        yield dask_coro.emit(_made(folder))
    return _made(folder)


@coroutine
def takes_from_a_stream(folder: str, go: str, n: int, take: int | None):
    """The first ``take`` items (None: every item, then the producer's value)."""
    got = []
    with dask_coro.stream(emits_arrays(folder, n), buffer=1) as s:
        for a in s:
            got.append(a)
            if len(got) == take:
                break  # leaves the block: the producer is cancelled
        else:
            got.append(s.result)
    yield dask.delayed(wait_for, pure=False)(go)
    return got


@coroutine
async def takes_from_a_stream_async(folder: str, go: str, n: int, take: int | None):
    got = []
    with dask_coro.stream(emits_arrays(folder, n), buffer=1) as s:
        async for a in s:
            got.append(a)
            if len(got) == take:
                break
        else:
            got.append(s.result)
    await dask_coro.gather(dask.delayed(wait_for, pure=False)(go))
    return got


@coroutine
async def awaits_an_array(folder: str):
    """A child run beside its parent: it gets the array from a task of the parent's."""
    return await dask_coro.gather(dask.delayed(make, pure=False)(folder))


def _spawn_makers(g, folder: str, n: int) -> None:
    for _ in range(n):
        g.spawn(dask.delayed(make, pure=False)(folder))


@coroutine
def takes_from_a_group(folder: str, go: str, how: str):
    with dask_coro.group() as g:
        if how == "stream":
            g.spawn(dask_coro.stream(emits_arrays(folder, 2), buffer=1))
        elif how == "beside":
            g.spawn(awaits_an_array(folder))
        else:
            _spawn_makers(g, folder, 2)
        if how == "next":
            got = []
            while g:
                _, a = yield g.next()
                got.append(a)
        elif how == "all":
            got = yield g.all()
        else:
            got = [a for _, a in g]
    yield dask.delayed(wait_for, pure=False)(go)
    return got


@coroutine
async def takes_from_a_group_async(folder: str, go: str, how: str):
    async with dask_coro.group() as g:
        _spawn_makers(g, folder, 2)
        if how == "next":
            got = []
            while g:
                _, a = await g.next()
                got.append(a)
        else:
            got = await g.all()
    await dask_coro.gather(dask.delayed(wait_for, pure=False)(go))
    return got


def _left_besides(root, dask_scheduler=None) -> list[str]:
    """Keys the scheduler knows other than ``root`` and the child it waits
    in, and the releases it has yet to see run."""
    from dask.utils import key_split

    plugin = dask_scheduler.plugins.get("dask-coro-lifetimes")
    ledger = plugin.ledger if plugin is not None else None
    keys = [str(k) for k in dask_scheduler.tasks if k != root and key_split(k) != "wait_for"]
    return keys + ([f"release of {rid}" for rid in (*ledger.owed, *ledger.sent)] if ledger else [])


def _until_alone(client: Client, name: str, root) -> None:
    def left() -> list[str]:
        return client.run_on_scheduler(_left_besides, root)

    poll(lambda: not left(), lambda: f"{name}: {left()}")


def assert_kept_then_released(client: Client, folder: str, bodies: dict) -> None:
    """Each body (name -> a function of the Event's name making its call)
    runs once every other key of its tree is forgotten and their releases
    ran, returns a list of intact arrays (the client maps their segments: a
    released one cannot be unpickled); once the client lets go of them, no
    segment the test made is left."""
    broken = {}
    for name, body in bodies.items():
        go = f"go-{uuid.uuid4().hex}"
        fut = client.compute(body(go))
        try:
            _until_alone(client, name, fut.key)
        finally:
            Event(go, client=client).set()
        try:
            arrays = fut.result(timeout=60)
        except FileNotFoundError as e:
            broken[name] = str(e)
            continue
        finally:
            fut.release()
        assert arrays and all(isinstance(a, shm.ShmArray) for a in arrays), (name, arrays)
        for a in arrays:
            np.testing.assert_array_equal(a, np.arange(N), err_msg=name)
        del a, arrays
    if broken:
        pytest.fail("\n".join(f"{name}: {e}" for name, e in broken.items()))
    assert_released(client, _lines(folder, "segments"))


@pytest.mark.parametrize("body", [takes_from_a_stream, takes_from_a_stream_async], ids=["generator", "async"])
def test_a_stream_consumer_leaving_early_keeps_the_arrays_it_took(client, tmp_path, body):
    folder = str(tmp_path)
    assert_kept_then_released(client, folder, {"consumer": lambda go: body(folder, go, 5, 2)})


def test_a_stream_read_to_its_end_keeps_its_arrays_though_children_are_not_held(client_not_holding, tmp_path):
    folder = str(tmp_path)
    bodies = {
        body.__name__: functools.partial(lambda body, go: body(folder, go, 2, None), body)
        for body in (takes_from_a_stream, takes_from_a_stream_async)
    }
    assert_kept_then_released(client_not_holding, folder, bodies)


@pytest.mark.inline  # a small async def child runs beside its parent
def test_a_group_child_array_once_delivered_is_kept_though_children_are_not_held(client_not_holding, tmp_path):
    folder = str(tmp_path)
    bodies = {
        f"{body.__name__}-{how}": functools.partial(lambda body, how, go: body(folder, go, how), body, how)
        for body, hows in [
            (takes_from_a_group, ["next", "all", "iteration", "stream", "beside"]),
            (takes_from_a_group_async, ["next", "all"]),
        ]
        for how in hows
    }
    assert_kept_then_released(client_not_holding, folder, bodies)


def _mapped_names(dask_scheduler=None, dask_worker=None) -> list[str]:
    import gc

    gc.collect()
    return sorted(_shm_impl._mapped)


def test_no_process_keeps_a_released_segment_mapped(client, tmp_path):
    """Unlinking a segment frees its memory only once no process maps it. The
    workers drop their mappings with the tasks; the scheduler process (this
    process, for a LocalCluster) must not map the handles it sees in task
    arguments (it did, and kept them mapped through its message logs)."""
    folder = str(tmp_path)
    assert client.compute(shm_sum(folder)).result(timeout=60) == EXPECTED
    (name,) = _lines(folder, "segments")
    assert_released(client, [name])
    poll(
        lambda: name not in client.run_on_scheduler(_mapped_names),
        lambda: f"the scheduler process still maps {name}",
        timeout=5,
    )
    assert all(name not in m for m in client.run(_mapped_names).values())


# --------------------------------------------------------------------------
# a stream's items holding plain NumPy arrays go through shared memory

#: float64s in an array a stream hands through shared memory (1 MiB:
#: ``stream.remote.SHARED``).
M = 2**17


def _item(i: int) -> np.ndarray:
    return np.arange(M, dtype=np.float64) + i


@coroutine
def emits_plain_arrays(n: int, fail: bool = False):
    """A stream's producer: ``(i, array)`` for ``i < n``, plain arrays, then
    its value, or an error."""
    for i in range(n):
        yield dask_coro.emit((i, _item(i)))
    if fail:
        raise ValueError("the producer failed after its items")
    return n


@coroutine
def endless_plain_arrays():
    i = 0
    while True:
        yield dask_coro.emit(_item(i))
        i += 1


@coroutine
def reads_plain_arrays(folder: str, n: int, where: str):
    """Reads the stream, keeping a view of every third item: an item not kept
    is released once the body asked for a later one (the one before the
    last asked for is kept one request longer: item ``i - 2`` is gone once
    the body has item ``i``, asked for alone with ``buffer=1``)."""
    import mmap

    with dask.annotate(workers=[where], allow_other_workers=False):
        s = dask_coro.stream(emits_plain_arrays(n), buffer=1)
    seen, kept, let_go = [], [], {}
    for i, a in s:
        _append(folder, "segments", a.segment_name)
        seen.append((i, a.segment_name, isinstance(a.base.base, mmap.mmap), bool(np.array_equal(a, _item(i)))))
        if i % 3 == 0:
            kept.append(a[:4])
        if i >= 2 and (i - 2) % 3:
            let_go[i - 2] = gone_within(seen[i - 2][1])
    return seen, kept, let_go, s.result


def test_a_stream_hands_plain_arrays_through_shared_memory_and_lets_them_go(client, tmp_path):
    folder = str(tmp_path)
    a, b = sorted(workers_now(client))
    n = 8
    fut = client.compute(reads_plain_arrays(folder, n, b), workers=[a], allow_other_workers=False)
    seen, kept, let_go, result = fut.result(timeout=120)
    assert result == n
    # Each item is a view of a segment this host maps (no copy through a
    # socket), intact, one segment per item.
    assert [i for i, *_ in seen] == list(range(n))
    assert all(name and mapped and equal for _, name, mapped, equal in seen), seen
    names = [name for _, name, *_ in seen]
    assert len(set(names)) == n and _lines(folder, "segments") == names
    # Items the body did not keep were released while it read on...
    assert let_go == {i: True for i in range(n - 2) if i % 3}, let_go
    # ... those it kept (views of items 0, 3, 6) and the last one (its loop
    # variable) are held by its key, and still read the same.
    held = [names[i] for i in range(n) if i % 3 == 0 or i == n - 1]
    assert existing(held) == set(held)
    for i, view in zip(range(0, n, 3), kept):
        np.testing.assert_array_equal(view, _item(i)[:4])
    # The same stream read in client code gives the same items.
    s = dask_coro.stream(emits_plain_arrays(3))
    assert [(i, float(x.sum())) for i, x in s] == [(i, float(_item(i).sum())) for i in range(3)]
    del fut, kept, view, s
    assert_released(client, names)


def _inode(name: str) -> int:
    return os.stat(os.path.join("/dev/shm", name)).st_ino


@coroutine
def reads_and_lets_go(folder: str, n: int, where: str):
    """Reads the stream keeping nothing: each item's segment (its name, and
    the file under it), and whether it holds the item; each item is let go
    of, its name gone, before the next is asked for."""
    with dask.annotate(workers=[where], allow_other_workers=False):
        s = dask_coro.stream(emits_plain_arrays(n), buffer=1)
    seen = []
    for i, a in s:
        _append(folder, "segments", a.segment_name)
        seen.append((a.segment_name, _inode(a.segment_name), bool(np.array_equal(a, _item(i)))))
        if i >= 2:
            assert gone_within(seen[i - 2][0])
    return seen


def _reused() -> tuple[int, int]:
    return _shm_impl.reused[0], _shm_impl.busy[0]


def test_a_stream_s_producer_copies_later_items_into_segments_given_back(client, tmp_path):
    """An item let go of gives its segment back to its producer (renamed:
    its own name is gone as after an unlink), which copies a later item into
    it instead of making a new one (a new one's pages cost more to allocate
    and free than to copy into)."""
    folder = str(tmp_path)
    a, b = sorted(workers_now(client))
    n = 12
    seen = client.compute(reads_and_lets_go(folder, n, b), workers=[a], allow_other_workers=False).result(timeout=120)
    assert all(equal for *_, equal in seen), seen
    names = [name for name, *_ in seen]
    assert len(set(names)) == n, names  # a name per item, however its segment was made
    inodes = [inode for _, inode, _ in seen]
    assert len(set(inodes)) < n, inodes  # some segments held several items, one after another
    reused, _ = client.run(_reused)[b]
    assert reused == n - len(set(inodes)), (reused, inodes)
    assert_released(client, names)


@coroutine
def emits_some_it_keeps(n: int):
    """Emits ``(i, array)``: every third array it keeps and writes over
    after the emit, the others it holds no reference to."""
    kept = []
    for i in range(n):
        if i % 3:
            yield dask_coro.emit((i, _item(i)))
            continue
        a = _item(i)
        yield dask_coro.emit((i, a))
        a[:] = -1.0
        kept.append(a)
    # What it wrote after each emit stays its own: no later item reaches it.
    return all(bool((k == -1.0).all()) for k in kept)


@coroutine
def reads_items(n: int, where: str):
    with dask.annotate(workers=[where], allow_other_workers=False):
        s = dask_coro.stream(emits_some_it_keeps(n), buffer=2)
    got = [(i, a.segment_name, bool(np.array_equal(a, _item(i)))) for i, a in s]
    return got, s.result


def _handed() -> int:
    return _shm_impl.handed[0]


@pytest.mark.skipif(_shm_impl.allocator() is None, reason="the allocator of arrays made in a segment is not built")
def test_an_array_made_in_a_segment_given_back_and_held_by_nothing_else_is_handed_over_in_it(client):
    """Once segments are given back, the producer's next arrays of their size
    are made in them (NumPy's allocator in its body's context); one that
    nothing but the item holds at its emit is handed over in its segment
    without a copy. One the body keeps is copied: the consumer reads it as
    it was at the emit though the body wrote over it after, and the body's
    array keeps what it wrote, never a later item."""
    a, b = sorted(workers_now(client))
    before = client.run(_handed)[b]
    got, kept_own = client.compute(reads_items(30, b), workers=[a], allow_other_workers=False).result(timeout=120)
    assert [(i, equal) for i, _, equal in got] == [(i, True) for i in range(30)], got
    assert kept_own is True
    handed = client.run(_handed)[b] - before
    assert 5 <= handed <= 20, handed  # of the 20 not kept, all but the first few
    assert_released(client, [name for _, name, _ in got])


@coroutine
def emits_then_leaves_an_array(n: int):
    for i in range(n):
        yield dask_coro.emit((i, _item(i)))
    alloc = _shm_impl.allocator()
    left: np.ndarray | None = None
    for _ in range(200):  # an array of an item's size, made in a segment armed at an emit
        left = _item(-1)
        if alloc.state(left.__array_interface__["data"][0]) == alloc.USED:
            break
        left = None
        yield dask_coro.emit(None)  # a small item; arms the segments given back meanwhile
        time.sleep(0.01)
    if left is None:
        raise AssertionError("no segment was armed for an array in 200 emits")
    get_worker().__dict__.setdefault("_left_arrays", []).append(left)  # outlives the producer
    yield dask_coro.emit(None)  # with the array still in the body
    return n


@coroutine
def reads_all(where: str, producer: Any, n: int):
    with dask.annotate(workers=[where], allow_other_workers=False):
        s = dask_coro.stream(producer(n), buffer=2)
    return [bool(item is None or np.array_equal(item[1], _item(item[0]))) for item in s]


def _left_state(dask_worker: Any = None) -> list[tuple[bool, int]]:
    alloc = _shm_impl.allocator()
    left = dask_worker.__dict__.get("_left_arrays", [])
    return [(bool(np.array_equal(a, _item(-1))), alloc.state(a.__array_interface__["data"][0])) for a in left]


@pytest.mark.skipif(_shm_impl.allocator() is None, reason="the allocator of arrays made in a segment is not built")
def test_an_array_a_producer_leaves_in_a_segment_is_never_written_by_a_later_stream(client):
    """An array made in an armed segment that outlives its producer (kept in
    a global here) keeps its segment out of every later use: the segment is
    not given back nor kept for later streams, and a later stream on the
    same worker writes none of it."""
    a, b = sorted(workers_now(client))
    got = client.compute(reads_all(b, emits_then_leaves_an_array, 12), workers=[a]).result(timeout=120)
    assert len(got) >= 13 and all(got)
    ((intact, state),) = client.run(_left_state)[b]
    assert intact and state == _shm_impl.allocator().HANDED  # made in a segment, retired with the pool
    again = client.compute(reads_all(b, emits_plain_arrays, 30), workers=[a]).result(timeout=120)
    assert again == [True] * 30
    ((intact, state),) = client.run(_left_state)[b]
    assert intact and state == _shm_impl.allocator().HANDED


def _keep(n: int) -> int:
    old, _shm_impl.Pool.KEEP = _shm_impl.Pool.KEEP, n
    return old


@coroutine
def reads_without_a_buffer(n: int, where: str):
    with dask.annotate(workers=[where], allow_other_workers=False):
        s = dask_coro.stream(emits_plain_arrays(n))
    return [(i, a.segment_name, bool(np.array_equal(a, _item(i)))) for i, a in s]


def test_a_producer_far_ahead_keeps_a_few_of_its_mappings(client):
    """A producer keeps its own mapping of at most ``Pool.KEEP`` segments
    (each holds a descriptor); those past it are mapped again when given
    back, and read the same."""
    a, b = sorted(workers_now(client))
    old = client.run(_keep, 2, workers=[b])[b]
    try:
        n = 16
        got = client.compute(reads_without_a_buffer(n, b), workers=[a]).result(timeout=120)
        assert [(i, equal) for i, _, equal in got] == [(i, True) for i in range(n)], got
    finally:
        client.run(_keep, old, workers=[b])
    assert_released(client, [name for _, name, _ in got])


def _keeps_every_item(client: Client, where: str, n: int = 10) -> None:
    """Client code keeps every item of a stream produced on ``where``: each
    is let go of by the stream as the next is asked for, and its segment
    given back to the producer, but still mapped here: the producer makes a
    new segment for the next item instead of copying into it (an unlinked
    segment's pages stay with who maps them, a segment given back's too)."""
    with dask.annotate(workers=[where], allow_other_workers=False):
        s = dask_coro.stream(emits_plain_arrays(n), buffer=1)
    items = []
    for item in s:
        items.append(item)
        if len(items) >= 3:  # let go of (with the request for the one before)
            assert gone_within(items[-3][1].segment_name)
    assert [i for i, _ in items] == list(range(n))
    for i, x in items:
        np.testing.assert_array_equal(x, _item(i))
    assert len({x.segment_name for _, x in items}) == n
    assert len({x.__array_interface__["data"][0] for _, x in items}) == n
    reused, busy = client.run(_reused)[where]
    assert reused == 0 and busy > 0, (reused, busy)
    names = [x.segment_name for _, x in items]
    del items, x, s
    assert_released(client, names)


def test_a_segment_given_back_is_not_copied_into_while_a_process_maps_it(client):
    _, b = sorted(workers_now(client))
    _keeps_every_item(client, b)


def test_a_segment_given_back_is_not_copied_into_while_its_producer_s_process_maps_it():
    """The same with the client in the producer's process (threads): the
    producer's own mapping is what an item kept here views."""
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        _, b = sorted(workers_now(client))
        _keeps_every_item(client, b)


def _tied(dask_scheduler=None) -> list[str]:
    """The resource ids the lifetimes ledger knows now."""
    plugin = dask_scheduler.plugins.get("dask-coro-lifetimes")
    return sorted(plugin.ledger._origin) if plugin is not None else []


@coroutine
def takes_then_leaves(folder: str, go: str, where: str, n: int):
    """Takes ``n`` items of an endless producer on ``where``, waits for the
    test, then leaves: the producer is cancelled."""
    with dask.annotate(workers=[where], allow_other_workers=True):
        s = dask_coro.stream(endless_plain_arrays(), buffer=2)
    sums = []
    with s:
        for a in s:
            _append(folder, "segments", a.segment_name)
            sums.append(float(a[1]))
            if len(sums) == n:
                yield dask.delayed(wait_for, pure=False)(go)
                break
    return sums


@pytest.mark.parametrize("n", [2, 10], ids=["2-items", "10-items"])
@pytest.mark.parametrize("kill", [False, True], ids=["cancelled", "producer-sigkilled"])
@POOL
def test_nothing_is_left_of_a_stream_s_shared_items(cluster, client, tmp_path, kill, n, pool):
    """A producer cancelled while its buffer is full, with or without its
    worker SIGKILLed first (its segments, made there, released by the other
    worker of the host): every segment it made is gone. After 10 items, the
    segments of the first ones were given back to the producer (renamed to
    names tied to its key, ``shm.Pool``): those go too. With the pool on,
    the names tied to the producer's worker for segments it keeps (in
    ``_tied``) hold none once unused, and a SIGKILLed worker's are released
    by the other worker."""
    folder = str(tmp_path)
    a, b = sorted(workers_now(client))
    handed = client.run(_handed)[b]
    go = f"go-{uuid.uuid4().hex}"
    fut = client.compute(takes_then_leaves(folder, go, b, n), workers=[a], allow_other_workers=False)
    wait_lines(folder, "segments", n)
    if n == 10 and _shm_impl.allocator() is not None:
        # Some of its items were made in segments given back, and handed
        # over in them (``shm.hand_over``): those go too.
        assert client.run(_handed)[b] > handed
    # The producer's buffer fills: items, and names tied ahead of them.
    poll(lambda: len(client.run_on_scheduler(_tied)) >= 4, lambda: f"tied: {client.run_on_scheduler(_tied)}")
    tied = set(client.run_on_scheduler(_tied))
    made = existing(tied)
    # The last two items taken are still held (the loop variable's, and the
    # one before it, kept one request longer).
    assert made >= set(_lines(folder, "segments")[-2:]), (made, _lines(folder, "segments"))
    if kill:
        _kill(cluster, client, b, "sigkill")
    Event(go, client=client).set()
    assert fut.result(timeout=120) == [float(i + 1) for i in range(n)]
    del fut
    tied |= set(client.run_on_scheduler(_tied))
    assert_released(client, tied)


@coroutine
def reads_a_failing_producer(folder: str, n: int):
    got = []
    try:
        for i, a in dask_coro.stream(emits_plain_arrays(n, fail=True), buffer=2):
            _append(folder, "segments", a.segment_name)
            got.append(i)
    except ValueError as e:
        return got, str(e)
    return got, None


@pytest.mark.parametrize("n", [3, 12], ids=["3-items", "12-items"])
@POOL
def test_nothing_is_left_of_a_failed_producer_s_shared_items(client, tmp_path, pool, n):
    """After 12 items, some were made in segments given back and handed
    over in them (``shm.hand_over``, with the allocator built): those go
    too, as the copies do."""
    folder = str(tmp_path)
    assert client.compute(reads_a_failing_producer(folder, n)).result(timeout=120) == (
        list(range(n)), "the producer failed after its items"
    )
    assert_released(client, _lines(folder, "segments"))


# --------------------------------------------------------------------------
# segments a worker keeps for its later streams (coro.stream.segment-pool)

ITEM_BYTES = M * 8


def _spares() -> tuple[list[str], int, int, int]:
    """The producer's process's spares: their names, bytes, its bound, and
    how many segments were made from one."""
    s = _shm_impl.spares
    with _shm_impl._lock:
        return sorted(s.held), s.bytes, s.limit, s.taken


@coroutine
def keeps_every_item(n: int, where: str):
    """Reads a stream of ``n`` items made on ``where`` keeping every one (each
    tied to this body's key as it asks for the next, so none is let go of
    before the producer ended); their segments' names."""
    with dask.annotate(workers=[where], allow_other_workers=False):
        s = dask_coro.stream(emits_plain_arrays(n), buffer=1)
    items = list(s)
    assert [i for i, _ in items] == list(range(n))
    assert all(np.array_equal(x, _item(i)) for i, x in items)
    return [x.segment_name for _, x in items]


def _keep_all_then_let_go(client: Client, where: str, n: int) -> list[str]:
    """``keeps_every_item`` on the other worker; let go of: its items' names."""
    (a,) = set(workers_now(client)) - {where}
    fut = client.compute(keeps_every_item(n, where), workers=[a], allow_other_workers=False)
    names = fut.result(timeout=120)
    assert len(set(names)) == n
    del fut
    return names


@pytest.mark.segment_pool(3 * ITEM_BYTES)
def test_a_worker_keeps_its_streams_segments_for_later_ones_within_its_bound():
    """Once a stream's items are let go of and its producer ended, the
    producer's worker keeps at most ``coro.stream.segment-pool`` bytes of
    their segments (renamed: the items' names are gone); the next stream's
    items are copied into those; unused for ``segment-pool-idle`` they go."""
    with dask.config.set({"coro.stream.segment-pool-idle": "2s"}), LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        _, b = sorted(workers_now(client))
        names = _keep_all_then_let_go(client, b, 6)
        assert_unlinked(names)
        poll(lambda: len(client.run(_spares)[b][0]) == 3, lambda: f"spares: {client.run(_spares)[b]}")
        kept, nbytes, limit, taken = client.run(_spares)[b]
        assert (nbytes, limit, taken) == (3 * ITEM_BYTES, 3 * ITEM_BYTES, 0)
        assert existing(kept) == set(kept)
        # The next stream's first items go into them, and read the same.
        with dask.annotate(workers=[b], allow_other_workers=False):
            s = dask_coro.stream(emits_plain_arrays(3), buffer=1)
        later = []
        for i, x in s:
            np.testing.assert_array_equal(x, _item(i))
            later.append(x.segment_name)
        del s, x
        assert client.run(_spares)[b][3] >= 1
        # Unused, they go: nothing of either stream is left (the second's
        # items let go of, kept in turn, then gone too).
        assert_unlinked(later)
        assert_unlinked(kept)
        poll(lambda: not shm.segments(), lambda: f"left: {shm.segments()}, spares: {client.run(_spares)[b]}")
        assert client.run(_spares)[b][:2] == ([], 0)


@pytest.mark.segment_pool(3 * ITEM_BYTES)
def test_a_sigkilled_worker_s_spare_segments_are_released_by_another_worker(cluster, client):
    """Segments a worker keeps for its later streams are tied to it: SIGKILLed,
    the other worker of its host releases them."""
    _, b = sorted(workers_now(client))
    assert_unlinked(_keep_all_then_let_go(client, b, 4))
    poll(lambda: len(client.run(_spares)[b][0]) == 3, lambda: f"spares: {client.run(_spares)[b]}")
    kept = client.run(_spares)[b][0]
    assert existing(kept) == set(kept)
    _kill(cluster, client, b, "sigkill")
    assert_released(client, kept)
