"""Chaos: the killer, the workloads and the rounds, shared by tests/runtime/test_chaos.py
and benchmarks/bench_chaos.py (worker processes import the coroutines from
here by name, so this folder is on their path).

A round runs every workload once, one after the other, on a ``LocalCluster``
of Nanny workers while a ``Killer`` SIGKILLs a random worker process every
1-3 s (its Nanny starts a new one); each answer is compared with the known
one. ``WorkerMemory`` samples the resident memory of the worker processes
meanwhile, so a round reports its peak.

Two workloads are about what a lost worker does to a coroutine that waits:

* ``stream``: a loop that yields one child of ``mb`` MB at a time and
  consumes it (``a = yield chunk(i)``; ``total += a[0]``; ``del a``), the
  most common coroutine there is; with ``coro.durability.hold-children``
  every consumed chunk stays held until the loop ends.
* ``waiting_tree``: a root waits on parents that wait on children sleeping
  ``secs``, so a kill usually finds children running and parents waiting.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import dask
import psutil
from distributed import Client, LocalCluster, worker_client
from distributed.core import Status
from helpers import Background
from workloads import fib, process_all_pure

from dask_coro import coroutine
from dask_coro.examples import logical_task, shared_totals

# distributed's SpecCluster closes a worker's Nanny for good when, at
# distributed.deploy.lost-worker-timeout (15 s) after the worker left, no
# worker of that name is registered (SpecCluster._update_worker_status). Kills
# every 1-3 s often land on a worker just restarted by its Nanny, so the
# cluster shrank for good (2 of 3 workers, then 1): LocalCluster's behaviour,
# not dask_coro's. Each Nanny restarts its own worker; a timeout longer than
# the run leaves that to it.
NANNIES_STAY = {"distributed.deploy.lost-worker-timeout": "600s"}


# -- the killer and the memory sampler -----------------------------------------


def _running_pids(cluster: LocalCluster) -> list[int]:
    """The process ids of the workers whose Nanny saw them start and connect
    (``WorkerProcess.status`` is running once the worker reported its address
    through the Nanny's init queue, ``WorkerProcess.start``; stopped when the
    process exits, ``WorkerProcess.mark_stopped``)."""
    pids = []
    for nanny in list(cluster.workers.values()):
        wp = getattr(nanny, "process", None)
        proc = getattr(wp, "process", None)
        pid = getattr(proc, "pid", None)
        if pid is not None and getattr(wp, "status", None) == Status.running and proc.is_alive():
            pids.append(pid)
    return pids


class Killer(Background):
    """SIGKILLs a random worker process of ``cluster`` every ``low``-``high``
    seconds while in a ``with`` block; counts the kills.

    Only a worker that finished starting is a target, and after a kill the
    next interval starts once the Nanny's new worker is running again. On
    two loaded cores a Nanny takes seconds to start a worker; a killer on a
    fixed clock outran the restarts (the starts themselves loading the
    machine further), so most kills hit a cluster already down a worker or
    two, and fib(14) took minutes instead of seconds: a test of the
    machine's load, not of what a kill does. Kills still land at random
    moments of the work, one worker at a time.

    ``per_workload`` (None: no limit) caps the kills between two calls of
    ``next_workload()``: a workload's time then has a bound (its time
    without kills plus a recovery per kill), where a killer on a clock
    alone, every kill adding work and so time and so kills, has none on a
    machine slow enough."""

    def __init__(self, cluster: LocalCluster, low: float = 1.0, high: float = 3.0, seed: int = 0,
                 back_within: float = 60.0, per_workload: int | None = None):
        self.cluster = cluster
        self.low, self.high = low, high
        self.back_within = back_within
        self.per_workload = per_workload
        self.random = random.Random(seed)
        self.kills = 0
        self._since = 0  # kills since next_workload()
        super().__init__()

    def _run(self) -> None:
        while not self._stop.wait(self.random.uniform(self.low, self.high)):
            if self.per_workload is not None and self._since >= self.per_workload:
                continue
            pids = _running_pids(self.cluster)
            if len(pids) < 2:
                continue
            victim = self.random.choice(pids)
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills += 1
            self._since += 1
            # Until the Nanny saw it die and its new worker runs (or the
            # stop, or a time after which the next kill goes ahead anyway):
            # right after the signal the dead process may still count as
            # running, until its exit is handled.
            deadline = time.monotonic() + self.back_within
            while time.monotonic() < deadline:
                now = _running_pids(self.cluster)
                if victim not in now and len(now) >= len(pids):
                    break
                if self._stop.wait(0.1):
                    return

    def next_workload(self) -> None:
        self._since = 0


class WorkerMemory(Background):
    """The resident memory of ``cluster``'s worker processes, sampled every
    ``interval`` s in a thread: ``peak()`` says the largest one process
    reached and the largest sum over the processes alive at one sample,
    since the last ``reset()``. A worker killed and started again is a new
    process, so a peak is never a dead worker's memory carried over."""

    def __init__(self, cluster: LocalCluster, interval: float = 0.1):
        self.cluster = cluster
        self.interval = interval
        self._lock = threading.Lock()
        self._procs: dict[int, psutil.Process] = {}
        self._one = self._sum = 0
        super().__init__()

    def _sample(self) -> None:
        total = one = 0
        for pid in _running_pids(self.cluster):
            p = self._procs.get(pid)
            try:
                if p is None:
                    p = self._procs[pid] = psutil.Process(pid)
                rss = p.memory_info().rss
            except psutil.Error:
                self._procs.pop(pid, None)
                continue
            total += rss
            one = max(one, rss)
        with self._lock:
            self._one = max(self._one, one)
            self._sum = max(self._sum, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def reset(self) -> None:
        with self._lock:
            self._one = self._sum = 0

    def peak(self) -> tuple[int, int]:
        """(largest worker process, largest sum over the workers), in bytes."""
        self._sample()
        with self._lock:
            return self._one, self._sum


# -- the new workloads -------------------------------------------------------------


def chunk(i: int, nbytes: int, secs: float) -> bytes:
    """``nbytes`` bytes, every one ``i % 251``, after ``secs`` of sleep (a
    producer that takes a while, so kills meet the loop): a chunk whose
    first byte says which it is."""
    time.sleep(secs)
    return bytes([i % 251]) * nbytes


@coroutine(inline=False)
def stream(n: int, mb: float, secs: float):
    """Yields ``n`` chunks of ``mb`` MB one at a time and keeps only a sum
    of each: their first bytes and their lengths. A task whatever
    ``coro.inline.enabled`` says, its chunks too (``dask.delayed``)."""
    nbytes = int(mb * 2**20)
    total = size = 0
    for i in range(n):
        a = yield dask.delayed(chunk, pure=True)(i, nbytes, secs)
        total += a[0]
        size += len(a)
        del a
    return total, size


def stream_answer(n: int, mb: float) -> tuple[int, int]:
    return sum(i % 251 for i in range(n)), n * int(mb * 2**20)


def nap(j: int, k: int, secs: float) -> int:
    time.sleep(secs)
    return 10 * j + k


@coroutine(inline=False)
def waiting_parent(j: int, width: int, secs: float):
    """Waits on ``width`` children that sleep ``secs`` each."""
    got = yield [dask.delayed(nap, pure=True)(j, k, secs) for k in range(width)]
    return sum(got)


@coroutine(inline=False)
def waiting_tree(parents: int, width: int, secs: float):
    """A root waiting on ``parents`` coroutines, each waiting on ``width``
    sleeping children."""
    got = yield [waiting_parent(j, width, secs) for j in range(parents)]
    return sum(got)


def wc_stream(n: int, mb: float, secs: float) -> tuple[int, int]:
    """``stream`` in plain Dask: a task looping over ``submit(...).result()``
    on its ``worker_client``, one chunk at a time."""
    nbytes = int(mb * 2**20)
    total = size = 0
    with worker_client() as c:
        for i in range(n):
            a = c.submit(chunk, i, nbytes, secs, pure=False).result()
            total += a[0]
            size += len(a)
            del a
    return total, size


def waiting_tree_answer(parents: int, width: int) -> int:
    return sum(10 * j + k for j in range(parents) for k in range(width))


# -- the workloads of a round ---------------------------------------------------


@dataclass(frozen=True)
class Size:
    """How large a round is: the streaming loop's chunks (count, MB each,
    seconds each takes) and the waiting tree (parents, children each,
    seconds each child sleeps)."""

    chunks: int = 16
    chunk_mb: float = 4.0
    chunk_secs: float = 0.25
    parents: int = 3
    width: int = 3
    secs: float = 0.5


SMALL = Size()  # the test's round
LARGE = Size(chunks=40, chunk_mb=8.0, chunk_secs=0.25, parents=4, width=4, secs=1.0)  # the benchmark's


class Workload(NamedTuple):
    key: str  # short, for tables
    name: str
    start: Callable[[Client], Any]  # submits it, returns its future
    answer: Any
    # Plain Dask, for comparison: its error is its outcome, not a wrong
    # answer of ours (a task running on allowed-failures + 1 killed workers
    # fails with KilledWorker, Scheduler.remove_worker).
    plain: bool = False


def workloads(size: Size) -> list[Workload]:
    """Each workload of a round, with its right answer."""
    n, mb, secs = size.chunks, size.chunk_mb, size.chunk_secs
    return [
        Workload("fib", "fib(14), every call a task", lambda c: c.compute(fib(14)), 377),
        # Pure tasks only: a lost result is computed again, and a random one
        # (process_all's generate_data) would then differ between its consumers.
        Workload("process_all", "process_all", lambda c: c.compute(process_all_pure(40)),
                 (sum(range(1, 41)), list(range(40)))),
        Workload("promise", "a promise", lambda c: c.compute(logical_task(5) + 1), 101),
        Workload("shm", "shared memory", lambda c: c.compute(shared_totals(200_000, 2)),
                 [200_000.0, 200_000.0]),
        Workload("stream", f"a streaming loop of {n} chunks of {mb:g} MB",
                 lambda c: c.compute(stream(n, mb, secs)), stream_answer(n, mb)),
        # The same loop in plain Dask, for its memory: a task of its own.
        Workload("stream_wc", "the same loop as a worker_client task (plain Dask)",
                 lambda c: c.submit(wc_stream, n, mb, secs, pure=False), stream_answer(n, mb),
                 plain=True),
        Workload("tree", f"a tree of {size.parents} parents waiting on {size.width} "
                 "running children each",
                 lambda c: c.compute(waiting_tree(size.parents, size.width, size.secs)),
                 waiting_tree_answer(size.parents, size.width)),
    ]


@dataclass
class Round:
    """What one round saw: workload runs, wrong answers of ours (name, what
    came back: a value or an error), errors of the plain Dask ones (by
    key), kills, wall time and the peak worker memory (bytes: the largest
    worker process, the largest sum over the workers), in all and per
    workload (by key)."""

    runs: int = 0
    wrong: list[tuple[str, Any]] = field(default_factory=list)
    plain_errors: dict[str, str] = field(default_factory=dict)
    kills: int = 0
    wall: float = 0.0
    peak_worker: int = 0
    peak_workers: int = 0
    walls: dict[str, float] = field(default_factory=dict)
    kills_in: dict[str, int] = field(default_factory=dict)
    peaks: dict[str, tuple[int, int]] = field(default_factory=dict)


def run_round(client: Client, killer: Killer | Any, memory: WorkerMemory, size: Size,
              timeout: float = 240) -> Round:
    """Every workload once, one after the other; a wrong answer (or an
    error, or no answer within ``timeout``) is recorded, not raised, so a
    caller counts them all. ``killer`` may be anything with ``kills`` and
    ``next_workload()`` (a round without kills)."""
    r = Round()
    kills, start = killer.kills, time.monotonic()
    for w in workloads(size):
        # What the last workload held is let go of (on the scheduler, then
        # on the workers) before this one's memory is measured.
        poll(lambda: client.run_on_scheduler(scheduler_tasks) == 0, 60,
             "tasks left on the scheduler after a workload")
        killer.next_workload()
        memory.reset()
        t, k = time.monotonic(), killer.kills
        try:
            got = w.start(client).result(timeout=timeout)
        except Exception as e:
            # Kept without its traceback: that holds Future.result's frame,
            # and so the future, and the scheduler would keep its erred key
            # for this client through the next workload's check.
            got = e.with_traceback(None)
        r.walls[w.key] = time.monotonic() - t
        r.kills_in[w.key] = killer.kills - k
        r.peaks[w.key] = memory.peak()
        r.runs += 1
        if w.plain and isinstance(got, Exception):
            r.plain_errors[w.key] = type(got).__name__
        elif isinstance(got, Exception) or got != w.answer:
            r.wrong.append((w.name, got))
    r.wall = time.monotonic() - start
    r.kills = killer.kills - kills
    r.peak_worker = max(one for one, _ in r.peaks.values())
    r.peak_workers = max(total for _, total in r.peaks.values())
    return r


def scheduler_tasks(dask_scheduler=None) -> int:
    return len(dask_scheduler.tasks)


class QueueCleanings:
    """Counts and times what ``TreePlugin`` does about dask/distributed
    #7504 (under validation only): each rebuild of the scheduler's queue
    heap (``drop_stale_queue_entries``), the entries it dropped, the largest
    heap it rebuilt and the time it took, on the scheduler's event loop.
    ``LocalCluster``'s scheduler runs in this process, so the module's name
    for the function is wrapped while in a ``with`` block."""

    def __init__(self) -> None:
        self.calls = self.dropped = self.largest = 0
        self.seconds = 0.0

    def __enter__(self) -> QueueCleanings:
        from dask_coro.diagnostics import scheduler as tree

        self._module, self._orig = tree, tree.drop_stale_queue_entries
        orig = self._orig

        def timed(scheduler: Any) -> int:
            from dask_coro._internals.distributed.collections import queue_entries

            n = queue_entries(scheduler)
            t = time.perf_counter()
            dropped = orig(scheduler)
            self.seconds += time.perf_counter() - t
            self.calls += 1
            self.dropped += dropped
            self.largest = max(self.largest, n)
            return dropped

        tree.drop_stale_queue_entries = timed  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        self._module.drop_stale_queue_entries = self._orig

    def __str__(self) -> str:
        return (f"{self.dropped} stale queue entries dropped in {self.calls} rebuilds of the "
                f"queue's heap (at most {self.largest} entries), {self.seconds * 1000:.1f} ms "
                "on the scheduler's event loop")


def poll(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
