"""Helpers shared by the benchmark scripts (not a benchmark): the embedded cluster, process samplers, tables and the JSON summary run_all.py reads.

Only client-side code lives here: functions that run on workers are defined in
the scripts themselves (pickled by value from ``__main__``) or in dask_coro.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
from distributed import Client, LocalCluster, SchedulerPlugin

N_WORKERS = 2
THREADS_PER_WORKER = 1


INLINE_ENV = "DASK_CORO__INLINE__ENABLED"


@contextlib.contextmanager
def inline_setting(inline: bool | None) -> Iterator[None]:
    """``coro.inline.enabled`` set to ``inline`` (None: leave the default) in
    this process and in the environment, for worker processes started meanwhile
    (the Nanny passes dask.config on; the variable covers anything else)."""
    if inline is None:
        yield
        return
    import dask

    old = os.environ.get(INLINE_ENV)
    os.environ[INLINE_ENV] = str(bool(inline))
    try:
        with dask.config.set({"coro.inline.enabled": bool(inline)}):
            yield
    finally:
        if old is None:
            os.environ.pop(INLINE_ENV, None)
        else:
            os.environ[INLINE_ENV] = old


def _inline_enabled() -> bool:
    import dask

    import dask_coro  # noqa: F401  (loads the coro defaults)

    return bool(dask.config.get("coro.inline.enabled"))


@contextlib.contextmanager
def cluster(inline: bool | None = None, n_workers: int = N_WORKERS,
            **kwargs: Any) -> Iterator[Client]:
    """The embedded cluster every benchmark uses: 2 worker processes x 1 thread.

    ``inline``: dask_coro's ``coro.inline.enabled`` on the workers (True: coroutine
    calls with plain arguments run inline, the default; False: every call is a
    task; None: whatever the environment says). Checked on every worker."""
    with inline_setting(inline), \
            LocalCluster(n_workers=n_workers, threads_per_worker=THREADS_PER_WORKER,
                         processes=True, dashboard_address=":0", **kwargs) as lc, \
            Client(lc) as client:
        client.wait_for_workers(n_workers)
        if inline is not None:
            seen = client.run(_inline_enabled)
            assert set(seen.values()) == {bool(inline)}, f"coro.inline.enabled on workers: {seen}"
        yield client


def worker_processes(client: Client) -> dict[str, psutil.Process]:
    """address -> psutil.Process of each worker process."""
    return {addr: psutil.Process(pid) for addr, pid in client.run(os.getpid).items()}


def with_descendants(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = list(procs)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out.extend(p.children(recursive=True))
    return out


class ProcSampler:
    """Samples a set of processes every ``interval`` s in a background thread
    (from /proc, so it never waits for a busy worker's event loop): the peak
    number of processes, OS threads of the busiest one, OS threads of all of
    them together, and the sum of their RSS. ``procs()`` is called at every
    sample, so a set that grows (Ray's worker pool) is followed."""

    def __init__(self, procs: Callable[[], list[psutil.Process]], interval: float = 0.05):
        self.procs = procs
        self.interval = interval
        self.peak = {"procs": 0, "threads_max": 0, "threads_total": 0, "rss": 0}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[str, int]:
        threads, rss = [], 0
        for p in self.procs():
            try:
                threads.append(p.num_threads())
                rss += p.memory_info().rss
            except psutil.Error:  # exited between listing and reading
                pass
        return {"procs": len(threads), "threads_max": max(threads, default=0),
                "threads_total": sum(threads), "rss": rss}

    def _record(self) -> None:
        s = self.sample()
        for k, v in s.items():
            self.peak[k] = max(self.peak[k], v)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._record()
            self._stop.wait(self.interval)

    def __enter__(self) -> ProcSampler:
        self._record()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self._record()


class CountDone(SchedulerPlugin):
    """Counts tasks that reach memory on the scheduler (which, with a
    LocalCluster, runs in the client process)."""

    name = "bench-count-done"

    def __init__(self) -> None:
        self.done = 0

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "memory":
            self.done += 1


def _count_done(dask_scheduler: Any, reset: bool = False) -> int:
    plugin = dask_scheduler.plugins["bench-count-done"]
    n = plugin.done
    if reset:
        plugin.done = 0
    return n


def tasks_done(client: Client, reset: bool = False) -> int:
    """Tasks that reached memory since the last reset (installs the counter
    on first use)."""
    if not client.run_on_scheduler(_has_counter):
        client.register_plugin(CountDone())
    return client.run_on_scheduler(_count_done, reset=reset)


def _has_counter(dask_scheduler: Any) -> bool:
    return "bench-count-done" in dask_scheduler.plugins


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    r = a / b
    return f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"


def fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def runs(xs: list[float]) -> str:
    """The individual runs, for the reader to judge the spread."""
    return ", ".join(fmt_s(x) for x in xs)


def mib(b: float) -> str:
    return f"{b / 2**20:.0f}"


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def write_json(path: str | None, data: dict[str, Any]) -> None:
    """The numbers run_all.py builds its Targets table from."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1, default=str)


def log(*args: Any) -> None:
    """Progress goes to stderr; stdout is the Markdown result."""
    import sys

    print(*args, file=sys.stderr, flush=True)
