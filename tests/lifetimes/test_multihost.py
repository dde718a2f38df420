"""Shared arrays and lifetimes on a cluster of two simulated hosts
(tests/multihost.py: worker processes in mount namespaces of their own, each
with a private /dev/shm, at 127.0.0.2 and 127.0.0.3)."""

from __future__ import annotations

import os
import signal
import sys
import time

import multihost
import pytest
from helpers import workers_now

reason = multihost.available()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Two hosts of two workers, shared by the tests that leave them as they
    found them."""
    h = multihost.Hosts(tmp_path_factory.mktemp("hosts"), [2, 2])
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def own_hosts(tmp_path):
    """Two hosts of two workers for a test that retires or kills some."""
    h = multihost.Hosts(tmp_path, [2, 2])
    try:
        yield h
    finally:
        h.close()


def produce(n):
    from dask_coro import shm

    a = shm.empty(n)
    a[:] = 1
    return a


def read(a):
    from dask_coro.lifetimes.shm import ShmArray

    return float(a.sum()), type(a) is ShmArray, getattr(a, "segment_name", None)


def copies_and_bytes():
    from dask_coro.lifetimes import shm

    return shm.copies_made[0], shm.sent_to_other_hosts[0]


def wait_until(check, timeout=20):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_hosts_are_hosts(hosts):
    """distributed sees two hosts; a segment of one does not exist on the other."""
    info = workers_now(hosts.client).values()
    assert sorted({w["host"] for w in info}) == hosts.hosts
    a = hosts.client.submit(produce, 10, workers=hosts.workers_of(0))
    a.result()
    assert len(hosts.shm_of(0)) == 1 and hosts.shm_of(1) == []
    del a
    assert wait_until(lambda: hosts.shm_of(0) == [])


def test_a_shared_array_read_on_another_host_is_copied_once_there(hosts):
    c = hosts.client
    A, B = hosts.workers_of(0), hosts.workers_of(1)
    before = c.run(copies_and_bytes)
    a = c.submit(produce, 100_000, workers=A[:1])
    (origin,) = wait_until(lambda: hosts.shm_of(0)) and hosts.shm_of(0)
    reads = [c.submit(read, a, workers=[w], pure=False) for w in A + B]
    got = c.gather(reads)
    # The same answer everywhere, and a shared array on every worker: the
    # origin on its own host (no copy), the host's one copy on the other.
    assert [g[0] for g in got] == [100_000.0] * 4
    assert all(g[1] for g in got)
    assert [g[2] for g in got] == [origin] * 2 + [origin + "-c"] * 2
    assert hosts.shm_of(0) == [origin] and hosts.shm_of(1) == [origin + "-c"]
    after = c.run(copies_and_bytes)
    made = {w: (after[w][0] - before[w][0], after[w][1] - before[w][1]) for w in after}
    assert sum(made[w][0] for w in B) == 1 and sum(made[w][0] for w in A) == 0
    # The bytes crossed once: a second worker of B asking meanwhile was told
    # to come back, and then fetched from B's worker that had it.
    assert sum(made[w][1] for w in A) == 100_000 * 8
    # A client on a third host gets the data as a plain array.
    value = a.result()
    assert type(value).__name__ == "ndarray" and value.sum() == 100_000
    del a, reads, value
    # The copy goes with the keys, on its own host.
    assert wait_until(lambda: hosts.shm_of(0) == [] and hosts.shm_of(1) == [])


def test_a_chain_across_hosts_and_back(hosts):
    """A -> B -> A: back on its own host the original is mapped, not a copy of
    a copy."""
    c = hosts.client
    A, B = hosts.workers_of(0), hosts.workers_of(1)
    a = c.submit(produce, 1000, workers=A[:1])
    on_b = c.submit(lambda x: x, a, workers=B[:1])  # the result is B's copy
    back = c.submit(read, on_b, workers=A[1:])
    total, shared, name = back.result()
    assert total == 1000.0 and shared and name in hosts.shm_of(0)
    assert name + "-c" in hosts.shm_of(1)
    del a, on_b, back
    # This test's segments, by name: a test before it that failed may still
    # hold its own (its traceback keeps its futures).
    gone = lambda: name not in hosts.shm_of(0) and name + "-c" not in hosts.shm_of(1)  # noqa: E731
    assert wait_until(gone), (hosts.shm_of(0), hosts.shm_of(1))


def tie_marker(name):
    """Ties a host-bound resource to this task: its release writes a marker in
    the host's own /dev/shm, so the test sees which host ran it."""
    from dask_coro import tie

    def release(rid):
        with open(f"/dev/shm/released-{rid}", "w") as f:
            f.write(str(os.getpid()))

    tie(name, release, host_bound=True)
    return name


def markers():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("released-"))


def test_host_bound_resources_are_released_on_their_own_host(hosts):
    c = hosts.client
    A, B = hosts.workers_of(0), hosts.workers_of(1)
    ra = c.submit(tie_marker, "res-a", workers=A[:1])
    rb = c.submit(tie_marker, "res-b", workers=B[:1])
    assert c.gather([ra, rb]) == ["res-a", "res-b"]
    del ra, rb
    assert wait_until(lambda: all(c.run(markers, workers=A + B).values()))
    seen = c.run(markers)
    assert {seen[w] == ["released-res-a"] for w in A} == {True}
    assert {seen[w] == ["released-res-b"] for w in B} == {True}


def test_the_last_worker_of_a_host_leaving_releases_only_that_host(own_hosts):
    hosts = own_hosts
    c = hosts.client
    A, B = hosts.workers_of(0), hosts.workers_of(1)
    ra = c.submit(tie_marker, "held-a", workers=A[:1])
    rb = c.submit(tie_marker, "held-b", workers=B[:1])
    c.gather([ra, rb])
    c.retire_workers(A, close_workers=True)
    # Host A's last worker released its host-bound resource (no task can
    # reach it now), though its key is held; host B's stays.
    assert wait_until(lambda: hosts.run_on_host(0, ["ls", "/dev/shm"], capture_output=True, text=True).stdout.split() == ["released-held-a"])
    assert c.run(markers) == {w: [] for w in B}
    del rb
    assert wait_until(lambda: c.run(markers) == {w: ["released-held-b"] for w in B})
    del ra


def test_release_abandoned_on_a_host_releases_only_its_own_segments(own_hosts):
    hosts = own_hosts
    c = hosts.client
    A, B = hosts.workers_of(0), hosts.workers_of(1)
    keep = [c.submit(produce, 10, workers=A[:1], pure=False), c.submit(produce, 10, workers=B[:1], pure=False)]
    c.gather(keep)
    assert len(hosts.shm_of(0)) == 1 and len(hosts.shm_of(1)) == 1
    # The cluster is lost as if killed: its workers stopped (they neither
    # run their releases nor leave), its scheduler gone.
    hosts.signal_host(0, signal.SIGSTOP)
    hosts.signal_host(1, signal.SIGSTOP)
    hosts.kill_scheduler()
    cli = [sys.executable, "-m", "dask_coro", "--release-abandoned"]
    env = {**os.environ, "DASK_TEMPORARY_DIRECTORY": str(hosts.tmp / f"host-{hosts.hosts[0]}")}
    out = hosts.run_on_host(0, cli, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert hosts.shm_of(0) == [] and len(hosts.shm_of(1)) == 1


# -- the other features on two hosts --------------------------------------------


def _host():
    from distributed import get_worker

    return get_worker().address.split("//")[1].rsplit(":", 1)[0]


def slow_leaf(i):
    time.sleep(0.05)
    return [_host()]


def test_a_tree_is_stolen_across_hosts(hosts):
    from dask_coro import coroutine

    leaf = coroutine(slow_leaf)

    @coroutine
    def spread(depth, i=0):
        if depth == 0:
            return (yield leaf(i))
        left, right = yield [spread(depth - 1, 2 * i), spread(depth - 1, 2 * i + 1)]
        return left + right

    ran_on = hosts.client.compute(spread(6)).result(timeout=120)
    assert len(ran_on) == 64
    assert set(ran_on) == set(hosts.hosts)  # both hosts took part


def child_counted(i, log):
    with open(log, "a") as f:
        f.write(f"{i} {_host()}\n")
    time.sleep(0.5)
    return i


def test_a_parent_lost_with_its_host_worker_finds_its_children(hosts, tmp_path):
    import dask

    from dask_coro import coroutine

    log = str(tmp_path / "runs.log")
    child = dask.delayed(child_counted, pure=True)

    @coroutine
    def parent(n):
        first = yield [child(i, log) for i in range(n)]
        second = yield [child(i + n, log) for i in range(n)]
        return sum(first) + sum(second)

    c = hosts.client
    A = hosts.workers_of(0)
    # Started on host A; once its worker is gone, anywhere.
    fut = c.compute(parent(4), workers=A[:1], allow_other_workers=True)
    # Wait until the first yield's children are done, then kill the parent's
    # worker (SIGKILL: its nanny starts another).
    assert wait_until(lambda: os.path.exists(log) and len(open(log).read().split("\n")) > 4, timeout=60)
    time.sleep(0.6)
    pid = c.run(os.getpid, workers=A[:1])[A[0]]
    os.kill(pid, signal.SIGKILL)
    assert fut.result(timeout=120) == sum(range(8))
    runs = [line.split()[0] for line in open(log).read().splitlines()]
    # The first yield's children finished on workers that lived: not run again.
    assert sorted(set(runs)) == [str(i) for i in range(8)]
    assert all(runs.count(str(i)) == 1 for i in range(4) if _ran_elsewhere(log, i, hosts, A[0]))
    assert wait_until(lambda: len(hosts.workers_of(0)) == 2, timeout=60)  # the nanny's new worker


def _ran_elsewhere(log, i, hosts, killed) -> bool:
    """Whether child ``i``'s first run was on a worker of the other host (a
    child on the killed worker's host may have run on the killed worker)."""
    for line in open(log).read().splitlines():
        j, host = line.split()
        if j == str(i):
            return host != hosts.hosts[0]
    return False


def test_a_promise_resolved_across_hosts(hosts):
    """docs/promise.md's program, its resolver on host A pointing the promise
    at a subgraph on host B."""
    import dask

    from dask_coro import Promise

    c = hosts.client
    A, B = hosts.workers_of(0), hosts.workers_of(1)

    @dask.delayed
    def resolver(p, n):
        with dask.annotate(workers=B):
            p.resolve_with(dask.delayed(sum)([dask.delayed(lambda i: i * 10)(i) for i in range(n)]))

    p = Promise()
    with dask.annotate(workers=A):
        p.resolve_with(resolver(p, 5))
    assert c.compute(dask.delayed(lambda v: v + 1)(p)).result(timeout=60) == 101


def test_workers_release_keys_across_hosts(tmp_path):
    """A tree reduction over two hosts with workers releasing keys on their
    own: the right sum, some keys released early, nothing computed twice."""
    from filelog import lines as _lines
    from workloads import tree_sum

    from dask_coro import ReleasePlugin

    (tmp_path / "cluster").mkdir()
    h = multihost.Hosts(tmp_path / "cluster", [1, 1], env={"DASK_CORO__WORKER_RELEASE__ENABLED": "True"})
    try:
        c = h.client
        c.register_plugin(ReleasePlugin())
        folder = tmp_path / "leaves"
        folder.mkdir()
        assert c.compute(tree_sum(16, str(folder))).result(timeout=60) == [sum(range(16))] * 1000
        early = c.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["dask-coro-release"].released_early)
        assert early > 0
        assert len(_lines(str(folder), "leaves")) == 16  # nothing computed twice
    finally:
        h.close()


def test_the_dashboard_page_on_two_hosts(hosts):
    from urllib.request import urlopen

    from dask_coro.examples import fib

    c = hosts.client
    f = c.compute(fib(10))
    assert f.result(timeout=60) == 55
    port = c.scheduler_info()["services"]["dashboard"]
    body = urlopen(f"http://127.0.0.1:{port}/coroutines", timeout=30).read().decode()
    assert "Coroutines" in body and f.key in body


def _answer():
    return 42


def answer():
    from dask_coro import coroutine

    return coroutine(_answer, name="answer")()


def test_a_host_with_another_dask_coro_version_fails_its_tasks_naming_both(tmp_path):
    """One host's workers have another dask_coro version: a coroutine task
    that reaches one of them fails with a VersionMismatchError naming both
    versions and that worker; the other host runs it."""
    import dask_coro

    fake = "0.0.0+other"
    preload = tmp_path / "other_version.py"
    preload.write_text(f"import dask_coro\ndask_coro.__version__ = {fake!r}\n")
    (tmp_path / "cluster").mkdir()
    h = multihost.Hosts(tmp_path / "cluster", [1, 1], host_extra={1: ("--preload", str(preload))})
    try:
        c = h.client
        A, B = h.workers_of(0), h.workers_of(1)
        # A coroutine with no children (children could be stolen by B).
        assert c.compute(answer(), workers=A).result(timeout=60) == 42
        with pytest.raises(dask_coro.VersionMismatchError) as e:
            c.compute(answer(), workers=B).result(timeout=60)
        message = str(e.value)
        assert f"dask_coro {dask_coro.__version__}" in message and f"dask_coro {fake}" in message
        assert f"worker {B[0]}" in message
    finally:
        h.close()


def total_of(a):
    return float(a.sum())


def totals_of(arrays, scale=1):
    return [float(a.sum()) * scale for a in arrays]


def test_a_shared_array_a_body_passes_on_reaches_another_host(hosts):
    """A body holds a shared array a child made on host A and passes it on,
    as a value, to a child pinned to host B: the bytes cross to B once (as
    for an array passed between tasks as a key), and nothing is left on
    either host once the keys are gone."""
    import dask

    from dask_coro import coroutine

    c = hosts.client
    A, B = hosts.workers_of(0), hosts.workers_of(1)
    before = c.run(copies_and_bytes)

    @coroutine
    def body(n):
        with dask.annotate(workers=A[:1], allow_other_workers=False):
            arr = yield dask.delayed(produce)(n)
        with dask.annotate(workers=B, allow_other_workers=False):
            got = yield dask.delayed(total_of)(arr)
        return got, float(arr.sum())

    fut = c.compute(body(100_000), workers=A[:1], allow_other_workers=False)
    assert fut.result(timeout=60) == (100_000.0, 100_000.0)
    after = c.run(copies_and_bytes)
    made = {w: (after[w][0] - before[w][0], after[w][1] - before[w][1]) for w in after}
    assert sum(made[w][0] for w in B) == 1 and sum(made[w][0] for w in A) == 0
    assert sum(made[w][1] for w in A) == 100_000 * 8  # the bytes crossed once
    del fut
    assert wait_until(lambda: hosts.shm_of(0) == [] and hosts.shm_of(1) == []), (hosts.shm_of(0), hosts.shm_of(1))


def test_shared_arrays_a_body_passes_on_in_containers_and_to_coroutines(hosts):
    """The same inside a list, a dict, to a coroutine child, and an array
    the body holds as its host's copy passed back to the array's own host."""
    import dask

    from dask_coro import coroutine

    c = hosts.client
    A, B = hosts.workers_of(0), hosts.workers_of(1)
    totals = coroutine(totals_of)

    @coroutine
    def body(n):
        with dask.annotate(workers=B[:1], allow_other_workers=False):
            arr = yield dask.delayed(produce)(n)  # made on B: the body holds A's copy
        with dask.annotate(workers=B, allow_other_workers=False):
            back = yield dask.delayed(read)(arr)  # to B: its own segment again
            listed = yield dask.delayed(totals_of)([arr, arr[10:]], scale={"x": 2}["x"])
            called = yield totals([arr[:5]], scale=3)
            keyed = yield dask.delayed(lambda d: float(d["a"].sum()))({"a": arr})
        return back, listed, called, keyed

    back, listed, called, keyed = c.compute(body(1000), workers=A[:1], allow_other_workers=False).result(timeout=60)
    assert back[:2] == (1000.0, True) and not back[2].endswith("-c")  # B's own segment
    assert listed == [2000.0, 1980.0] and called == [15.0] and keyed == 1000.0
    assert wait_until(lambda: hosts.shm_of(0) == [] and hosts.shm_of(1) == []), (hosts.shm_of(0), hosts.shm_of(1))


def emits_arrays(n):
    """A stream's producer of plain arrays (each through shared memory)."""
    import numpy as np

    import dask_coro

    for i in range(n):
        yield dask_coro.emit(np.full(2**17, float(i)))


def reads_a_stream(n, where):
    import dask

    import dask_coro

    with dask.annotate(workers=where, allow_other_workers=False):
        s = dask_coro.stream(dask_coro.coroutine(emits_arrays)(n), buffer=2)
    return [(float(a.sum()), getattr(a, "segment_name", None)) for a in s]


def test_a_stream_s_arrays_reach_another_host_as_one_copy(hosts):
    """A stream's items hold arrays in segments of the producer's host; a
    consumer on another host maps that host's copy of each (the bytes cross
    once), and nothing is left on either host after."""
    from dask_coro import coroutine

    c = hosts.client
    A, B = hosts.workers_of(0), hosts.workers_of(1)
    before = c.run(copies_and_bytes)
    fut = c.compute(coroutine(reads_a_stream)(3, A[:1]), workers=B[:1], allow_other_workers=False)
    got = fut.result(timeout=120)
    assert [g[0] for g in got] == [float(i) * 2**17 for i in range(3)]
    assert all(name is not None and name.endswith("-c") for _, name in got), got
    after = c.run(copies_and_bytes)
    assert sum(after[w][0] - before[w][0] for w in B) == 3
    assert sum(after[w][1] - before[w][1] for w in A) == 3 * 2**20
    del fut
    assert wait_until(lambda: hosts.shm_of(0) == [] and hosts.shm_of(1) == [])
