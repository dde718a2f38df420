"""Cluster-test helpers shared by the test modules: the ``cluster`` decorator
and a scheduler plugin that records what the scheduler saw."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from typing import TypeVar

from distributed import Client, SchedulerPlugin
from distributed.utils_test import gen_cluster

_B = TypeVar("_B", bound="Background")


class Background:
    """Work done by a daemon thread while in a ``with`` block: ``_run``, which
    returns once ``self._stop`` is set (leaving the block sets it, then joins
    the thread)."""

    def __init__(self, name: str | None = None) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self: _B) -> _B:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def cluster(**kwargs):
    """gen_cluster whose client is not the default client.

    A worker's ``get_client()`` adopts the process's default client when it
    talks to the same scheduler; gen_cluster's workers live in the test's
    process, so with the test's client as default the coroutines would submit
    their children through it. Here every worker makes its own client, as it
    does in a real deployment, and closing or cancelling from the test's client
    is something the runner has to notice.
    """
    return gen_cluster(client=True, client_kwargs={"set_as_default": False}, **kwargs)


def inline_and_as_tasks(check, workers: int = 2):
    """Two cluster tests of ``await check(client)``: one with coroutine calls
    run inline (marked ``inline``) on one worker of one thread, one with them
    as tasks on ``workers`` workers of one thread each. A module names them
    ``test_x_inline, test_x_as_tasks = inline_and_as_tasks(_check_x)``."""
    import pytest  # not at the top: scripts import this module

    @pytest.mark.inline
    @cluster(nthreads=[("", 1)])
    async def inline(c, s, a):
        await check(c)

    @cluster(nthreads=[("", 1)] * workers)
    async def as_tasks(c, s, *ws):
        await check(c)

    return inline, as_tasks


class Recorder(SchedulerPlugin):
    """Records what the scheduler heard of.

    seen
        Every key the scheduler ever heard of (graphs and transitions).
    memory
        Keys that reached memory, in order (repeated if computed again).
    graphs
        The keys of each update-graph.
    transitions
        Every ``(key, start, finish)``.
    max_tasks
        The most tasks the scheduler held at once (once ``scheduler`` is set).
    """

    def __init__(self) -> None:
        self.seen: set = set()
        self.memory: list = []
        self.graphs: list[set] = []
        self.transitions: list[tuple] = []
        self.max_tasks = 0
        self.scheduler = None

    async def start(self, scheduler):
        self.scheduler = scheduler

    def update_graph(self, scheduler, *, keys, **kwargs):
        self.seen.update(keys)
        self.graphs.append(set(keys))

    def transition(self, key, start, finish, *args, **kwargs):
        self.seen.add(key)
        self.transitions.append((key, start, finish))
        if finish == "memory":
            self.memory.append(key)
        if self.scheduler is not None:
            self.max_tasks = max(self.max_tasks, len(self.scheduler.tasks))

    def ran(self, prefix: str) -> list:
        """Keys with this prefix that finished computing (went to memory)."""
        return [k for k in self.memory if str(k).startswith(prefix + "-")]


def recorder(s) -> Recorder:
    """A ``Recorder`` added to scheduler ``s`` (in this process)."""
    r = Recorder()
    r.scheduler = s
    s.add_plugin(r)
    return r


def dask_cli(*args: str, log) -> subprocess.Popen:
    """``dask <args>`` (scheduler, worker) as a process of this interpreter's
    environment, its stderr to the file ``log``."""
    bindir = os.path.dirname(sys.executable)
    return subprocess.Popen(
        [os.path.join(bindir, "dask"), *args],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )


def start_worker(address: str, tmp_path, *extra: str) -> subprocess.Popen:
    """A ``dask worker`` process with one thread on 127.0.0.1."""
    n = len(list(tmp_path.glob("w*.log")))
    return dask_cli(
        "worker", address, "--nthreads", "1", "--host", "127.0.0.1",
        "--dashboard-address", ":0", "--local-directory", str(tmp_path / f"w{n}"),
        *extra, log=tmp_path / f"w{n}.log",
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def cli_cluster(tmp_path, n_workers: int, scheduler_args=(), worker_args=()):
    """A ``dask scheduler`` and ``n_workers`` ``dask worker`` processes on
    127.0.0.1, with a client connected once the workers are there."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [
        dask_cli("scheduler", "--host", "127.0.0.1", "--port", str(port),
              "--dashboard-address", ":0", *scheduler_args, log=tmp_path / "s.log")
    ]
    try:
        procs += [start_worker(address, tmp_path, *worker_args) for _ in range(n_workers)]
        with Client(address, timeout=60) as client:
            client.wait_for_workers(n_workers, timeout=60)
            yield client
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def _worker_threads(dask_worker):
    return threading.active_count(), dask_worker.state.nthreads, sum(
        ts.state == "long-running" for ts in dask_worker.state.tasks.values()
    )


def peak_threads_until_waiting(client, worker: str, n: int, timeout: float = 90) -> tuple[int, int]:
    """Poll ``worker`` (a process) until ``n`` of its tasks are long-running:
    the most OS threads it had meanwhile, and its nthreads."""
    peak = 0
    deadline = time.monotonic() + timeout
    while True:
        ((threads, nthreads, waiting),) = client.run(_worker_threads, workers=[worker]).values()
        peak = max(peak, threads)
        if waiting >= n:
            return peak, nthreads
        assert time.monotonic() < deadline, f"only {waiting} of {n} tasks waiting"
        time.sleep(0.2)


def places(keys) -> set:
    """The places of children's keys (``prefix-<slot>``, as
    ``derive_key(prefix, parent, index, path)`` gives them: a child's key adds
    a token of its content); other keys as they are."""
    from dask_coro.core.keys import slot_of

    return {k[:-17] if slot_of(k) else k for k in keys}


def key_at(keys, place: str):
    """The key among ``keys`` of the child at ``place`` (a ``derive_key``), or None."""
    from dask_coro.core.keys import slot_of

    found = [k for k in keys if slot_of(k) and k[:-17] == place]
    assert len(found) <= 1, found
    return found[0] if found else None


def workers_now(client) -> dict:
    """``{address: {"host", "nthreads"}}`` of every worker, asked of the
    scheduler now. ``Client.scheduler_info(n_workers=-1)["workers"]`` can come
    back empty under load: the client's periodic refresh (``n_workers=0``)
    may replace the answer between ``_update_scheduler_info`` and its return
    (``Client.scheduler_info``). The function travels by value: a scheduler
    started without this folder on its path can run it."""

    def workers(dask_scheduler):
        return {a: {"host": ws.host, "nthreads": ws.nthreads} for a, ws in dask_scheduler.workers.items()}

    return client.run_on_scheduler(workers)


class Busy:
    """User code that holds a thread of its worker for a while (``busy(s)``),
    counted per worker address: ``most(address)`` is the most that ran there
    at once. gen_cluster's workers share the test's process, so one counter
    sees them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active: dict = {}  # worker address -> [running now, the most at once]

    def clear(self) -> None:
        with self._lock:
            self.active.clear()

    def most(self, address: str) -> int:
        return int(self.active[address][1])

    def __call__(self, seconds: float) -> None:
        from distributed import get_worker

        with self._lock:
            count = self.active.setdefault(get_worker().address, [0, 0])
            count[0] += 1
            count[1] = max(count[1], count[0])
        try:
            time.sleep(seconds)
        finally:
            with self._lock:
                count[0] -= 1


async def stream_left_nothing(s, tag: str) -> None:
    """The ``endless`` producer of ``tag`` (workloads.py) was closed, and
    nothing of its stream is left on scheduler ``s``: no book of it, none of
    its items (let go of as it is forgotten)."""
    from distributed.utils_test import async_poll_for

    await async_poll_for(lambda: f"closed-{tag}" in s.extensions["variables"].variables, timeout=30)
    await async_poll_for(lambda: not s.plugins["dask-coro-streams"].books, timeout=30)
    await async_poll_for(lambda: not [k for k in s.tasks if "endless" in str(k)], timeout=30)


def waits_behind_a_gate(tmp_path, root_of, n: int, timeout: float):
    """``root_of(gate_key)``, a tree of ``n`` bodies waiting on a gate, on a
    LocalCluster of one worker process with one thread. The gate needs a
    resource no worker has: it stays pending while the bodies wait on it,
    and they hold no thread meanwhile (at most 10 more than the worker's,
    for the event loop and the like); it runs once a worker that has it
    joins. Gives the root's result."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as lc, Client(lc) as client:
        (worker,) = workers_now(client)
        gate = client.submit(lambda: 1, resources={"GATE": 1}, pure=False)
        root = client.compute(root_of(gate.key))
        peak, nthreads = peak_threads_until_waiting(client, worker, n + 1)
        assert not root.done()
        assert peak <= nthreads + 10, (peak, nthreads)
        gate_worker = start_worker(lc.scheduler_address, tmp_path, "--resources", "GATE=1")
        try:
            return root.result(timeout=timeout)
        finally:
            gate_worker.terminate()
            gate_worker.wait(timeout=30)
