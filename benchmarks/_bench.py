"""The harness every benchmark script uses (not a benchmark itself).

Argument parsing (``--repeat``, ``--json``, ``--quick`` for tiny sizes), the
embedded cluster, timed runs with their medians, process samplers, the
alternatives compared side by side with their ratio rows, Markdown tables, the
JSON summary run_all.py reads, and a section of RESULTS.md.

Only client-side code lives here: functions that run on workers are defined in
the scripts themselves (pickled by value from ``__main__``) or in dask_coro.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import psutil
from distributed import Client, LocalCluster, SchedulerPlugin

if TYPE_CHECKING:
    from typing_extensions import Self

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


class Sampler:
    """Samples something every ``interval`` s in a background thread and keeps
    the peak of each quantity ``sample()`` returns (a dict of numbers); one
    sample at the start (``first``) and one at the end count too."""

    first = True

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[str, int]:
        raise NotImplementedError

    def _record(self) -> None:
        for k, v in self.sample().items():
            self.peak[k] = max(self.peak.get(k, 0), v)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._record()
            self._stop.wait(self.interval)

    def __enter__(self) -> Self:
        if self.first:
            self._record()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self._record()


class ProcSampler(Sampler):
    """Samples a set of processes (from /proc, so it never waits for a busy
    worker's event loop): the peak number of processes, OS threads of the
    busiest one, OS threads of all of them together, and the sum of their RSS.
    ``procs()`` is called at every sample, so a set that grows (Ray's worker
    pool) is followed."""

    def __init__(self, procs: Callable[[], list[psutil.Process]], interval: float = 0.05):
        super().__init__(interval)
        self.procs = procs
        self.peak = {"procs": 0, "threads_max": 0, "threads_total": 0, "rss": 0}

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


def worker_sampler(client: Client, interval: float = 0.05,
                   descendants: bool = False) -> ProcSampler:
    """A ProcSampler of the cluster's worker processes (and their children)."""
    procs = list(worker_processes(client).values())
    return ProcSampler((lambda: with_descendants(procs)) if descendants else (lambda: procs),
                       interval)


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


def slow_task_finished(delay: float, dask_scheduler: Any = None) -> None:
    """A loaded scheduler, measured: its handler of task-finished sleeps
    ``delay`` s a message (``client.run_on_scheduler(slow_task_finished, delay)``;
    with a LocalCluster the scheduler runs in this process)."""
    if not delay:
        return
    handler = dask_scheduler.stream_handlers["task-finished"]

    def slow(**kwargs: Any) -> Any:
        time.sleep(delay)
        return handler(**kwargs)

    dask_scheduler.stream_handlers["task-finished"] = slow


def _has_counter(dask_scheduler: Any) -> bool:
    return "bench-count-done" in dask_scheduler.plugins


# -- arguments --------------------------------------------------------------


def parser(doc: str | None, repeat: int | None = 3, json: bool = True) -> argparse.ArgumentParser:
    """The scripts' argument parser: ``--repeat`` (None: none), ``--json`` and,
    added by ``parse``, ``--quick``. ``doc``: the script's docstring."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if repeat is not None:
        p.add_argument("--repeat", type=int, default=repeat, help="timed runs (their median)")
    if json:
        p.add_argument("--json", help="also write the numbers to this JSON file")
    return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None,
          quick: dict[str, Any]) -> argparse.Namespace:
    """Parses ``argv``; with ``--quick`` the defaults are ``quick``'s (tiny
    sizes, one run: a smoke test of the script, not a measurement), and
    arguments given still win."""
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes for a smoke run: " + ", ".join(
                       f"--{k.replace('_', '-')} {_arg(v)}" for k, v in quick.items()))
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**quick)
        args = p.parse_args(argv)
    return args


def _arg(v: Any) -> str:
    return " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


# -- timing -----------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def median(xs: Iterable[float]) -> float:
    return statistics.median(xs)


def median_of(fn: Callable[[], Any], k: int, warm: bool = False) -> tuple[float, list[float]]:
    """Median of ``k`` timed calls of ``fn`` (one untimed first with ``warm``)
    and the individual times."""
    if warm:
        fn()
    walls = [timed(fn)[0] for _ in range(k)]
    return median(walls), walls


def timed_runs(client: Client | None, run: Callable[[], Any], repeat: int, expect: Any,
               label: str, before: Callable[[], Any] | None = None,
               after: Callable[[], Any] | None = None,
               ) -> tuple[list[float], list[int] | None]:
    """``repeat`` timed calls of ``run``, each checked against ``expect``: the
    wall times, and with a ``client`` the tasks that reached memory on the
    scheduler during each (``before()`` and ``after()`` run around each time,
    neither timed nor counted)."""
    walls: list[float] = []
    ran: list[int] | None = None if client is None else []
    for _ in range(repeat):
        if before is not None:
            before()
        if ran is not None:
            tasks_done(client, reset=True)
        wall, value = timed(run)
        assert value == expect, value
        walls.append(wall)
        if ran is not None:
            ran.append(tasks_done(client))
        if after is not None:
            after()
        log(f"{label}: {wall:.3f} s" + ("" if ran is None else f", {ran[-1]} tasks"))
    return walls, ran


class Alt(NamedTuple):
    """One alternative of a scenario: its label in the table, ``run(client,
    n)`` (the measured work, returning the value checked), and the cluster it
    runs on (``coro.inline.enabled``, None: the default; worker processes)."""

    label: str
    run: Callable[[Client, int], Any]
    inline: bool | None = None
    workers: int = N_WORKERS


def measure(key: str, alt: Alt, n: int, repeat: int, expect: Callable[[int], Any],
            warm_n: int) -> tuple[list[float], list[int]]:
    """A fresh cluster for ``alt``, one untimed run of size ``warm_n`` (imports,
    plugins, the workers' clients), then ``repeat`` timed runs of size ``n``:
    their wall times and tasks run."""
    with cluster(inline=alt.inline, n_workers=alt.workers) as client:
        assert alt.run(client, warm_n) == expect(warm_n)
        walls, ran = timed_runs(client, lambda: alt.run(client, n), repeat, expect(n),
                                f"{key} (n = {n})")
    assert ran is not None
    return walls, ran


# -- plain Python references --------------------------------------------------


def seq_fib(i: int) -> int:
    """Sequential Python fib, the reference the coroutine versions are checked
    and compared against."""
    return i if i < 2 else seq_fib(i - 1) + seq_fib(i - 2)


def fib_calls(n: int) -> int:
    """Calls of fib(n), every one a coroutine call (a task when inline is off)."""
    return 2 * seq_fib(n + 1) - 1


# -- report -----------------------------------------------------------------


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


def counts(xs: list[int] | None) -> str:
    """Per-run counts (tasks run), "-" if not counted."""
    return "-" if xs is None else "/".join(str(x) for x in xs)


def wall_cells(walls: list[float]) -> list[str]:
    """The median and the individual runs: the two wall-time columns."""
    return [fmt_s(median(walls)), runs(walls)]


def wall_header(repeat: int, what: str = "wall") -> list[str]:
    return [f"{what} s, median of {repeat}", "runs s"]


def mib(b: float) -> str:
    return f"{b / 2**20:.0f}"


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fill(text: str) -> str:
    """A paragraph of notes, wrapped as in RESULTS.md."""
    return textwrap.fill(text, 79, break_on_hyphens=False)


def report(header: list[str], rows: list[list[Any]], *notes: str) -> None:
    """The Markdown result on stdout: the table, then each paragraph of notes."""
    print(table(header, rows))
    for text in notes:
        print()
        print(text)


def write_json(path: str | None, data: dict[str, Any]) -> None:
    """The numbers run_all.py builds its Targets table from."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1, default=str)


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def replace_section(heading: str, section: str, path: str = RESULTS) -> None:
    """Puts ``section`` (starting with ``heading``, a ``## `` line) in
    RESULTS.md in place of the section of that heading, or at its end."""
    with open(path) as f:
        text = f.read()
    start = text.find(heading + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + section + ("" if end < 0 else text[end:])
    with open(path, "w") as f:
        f.write(text)


def log(*args: Any) -> None:
    """Progress goes to stderr; stdout is the Markdown result."""
    print(*args, file=sys.stderr, flush=True)
