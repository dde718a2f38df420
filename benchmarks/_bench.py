"""The harness every benchmark script uses (not a benchmark itself).

Argument parsing (``--repeat``, ``--json``, ``--quick`` for tiny sizes), the
embedded cluster, timed runs with their medians, process samplers, the
alternatives compared side by side with their ratio rows, Markdown tables, the
JSON summary run_all.py reads, and a section of RESULTS.md.

Besides, what several scenarios run on the cluster: settings made here and for
the worker processes (``settings``), waiting on a condition (``wait_for``),
worker release installed (``release_plugin``), and a gate that holds a child
back until every waiter is suspended (``Gate``). Worker processes import this
module by name (a spawned process starts with its parent's ``sys.path``, so
this folder is on it), as they import the scripts' own functions.

A scenario is a script that declares its sections of RESULTS.md
(``SCENARIOS``, a list of ``Scenario``) and, where it has targets, a
``targets(data)`` giving their rows; run_all.py runs every script it lists and
writes their sections and the targets table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import psutil
from distributed import Client, LocalCluster, SchedulerPlugin

if TYPE_CHECKING:
    from typing_extensions import Self

N_WORKERS = 2
THREADS_PER_WORKER = 1


def env_name(key: str) -> str:
    """The environment variable dask reads for a configuration key
    (``dask.config.collect_env``: ``DASK_``, ``__`` for a dot)."""
    return "DASK_" + key.upper().replace(".", "__").replace("-", "_")


@contextlib.contextmanager
def settings(values: Mapping[str, Any]) -> Iterator[None]:
    """dask.config ``values`` set in this process and in the environment, for
    worker processes started meanwhile (the Nanny passes dask.config on; the
    variables cover anything else; dask reads each with ``ast.literal_eval``,
    so a value is written as its ``repr``). Both are restored after."""
    import dask

    old = {}
    for key, value in values.items():
        name = env_name(key)
        old[name] = os.environ.get(name)
        os.environ[name] = value if isinstance(value, str) else repr(value)
    try:
        with dask.config.set(dict(values)):
            yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def inline_setting(inline: bool | None) -> contextlib.AbstractContextManager[None]:
    """``coro.inline.enabled`` set to ``inline`` (None: leave the default), here
    and for worker processes started meanwhile."""
    return settings({} if inline is None else {"coro.inline.enabled": bool(inline)})


def _inline_enabled() -> bool:
    import dask

    import dask_coro  # noqa: F401  (loads the coro defaults)

    return bool(dask.config.get("coro.inline.enabled"))


@contextlib.contextmanager
def cluster(inline: bool | None = None, n_workers: int = N_WORKERS,
            config: Mapping[str, Any] | None = None, **kwargs: Any) -> Iterator[Client]:
    """The embedded cluster every benchmark uses: 2 worker processes x 1 thread.

    ``inline``: dask_coro's ``coro.inline.enabled`` on the workers (True: coroutine
    calls with plain arguments run inline, the default; False: every call is a
    task; None: whatever the environment says). Checked on every worker.
    ``config``: more dask settings, made before the cluster starts (``settings``)."""
    with inline_setting(inline), settings(config or {}), \
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


def wait_for(ready: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.05) -> float:
    """Calls ``ready`` every ``interval`` s until it returns something true:
    the seconds that took; TimeoutError naming ``what`` after ``timeout``."""
    start = time.monotonic()
    while not ready():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not after {timeout:g} s")
        time.sleep(interval)
    return time.monotonic() - start


def _release_ready(dask_scheduler: Any) -> int:
    from dask_coro.release.scheduler import NAME

    return len(dask_scheduler.plugins[NAME].ready)


def release_plugin(client: Client, workers: int, timeout: float = 30) -> None:
    """Worker release installed (``ReleasePlugin``) and its worker plugin
    ready on ``workers`` workers."""
    from dask_coro.release.scheduler import ReleasePlugin

    client.register_plugin(ReleasePlugin())
    wait_for(lambda: client.run_on_scheduler(_release_ready) >= workers, timeout,
             "worker release's worker plugins")


# -- a gate: waiters held back until all are suspended ------------------------


def gate_value() -> int:
    return 1000


async def _open_gate(name: str, dask_worker: Any = None) -> None:
    await dask_worker.set_resources(**{name: 1})


def _schedule_unrunnable(dask_scheduler: Any, worker: str) -> int:
    """What the scheduler does for no-worker tasks when a worker joins (it does
    not when a worker's resources change)."""
    ws = dask_scheduler.workers[worker]
    recs = dask_scheduler.bulk_schedule_unrunnable_after_adding_worker(ws)
    dask_scheduler.transitions(recs, stimulus_id=f"bench-open-gate-{time.time()}")
    return len(recs)


def _long_running(prefix: str, dask_worker: Any = None) -> int:
    return sum(1 for ts in dask_worker.state.tasks.values()
               if ts.state == "long-running" and str(ts.key).startswith(prefix))


class Gate:
    """A task (value 1000) restricted to a resource no worker has, a new one
    each time: it stays in no-worker on the scheduler, and every child that
    depends on it waits, until ``open()`` gives the resource to one worker."""

    def __init__(self, client: Client) -> None:
        import uuid

        self.client = client
        self.tag = uuid.uuid4().hex
        self.resource = f"GATE-{self.tag}"
        self.future = client.submit(gate_value, resources={self.resource: 1}, pure=False)
        self.key = self.future.key

    def wait_suspended(self, prefix: str, n: int, timeout: float) -> float:
        """Waits until ``n`` tasks whose keys start with ``prefix`` are
        waiting (seceded: ``long-running``) on the workers: the seconds."""
        seen = [0]

        def enough() -> bool:
            seen[0] = sum(self.client.run(_long_running, prefix).values())
            return seen[0] >= n

        try:
            return wait_for(enough, timeout, f"{n} tasks {prefix}* suspended", interval=0.2)
        except TimeoutError:
            raise TimeoutError(f"{seen[0]} of {n} suspended after {timeout} s") from None

    def open(self) -> None:
        first = min(self.client.scheduler_info()["workers"])
        self.client.run(_open_gate, self.resource, workers=[first])
        assert self.client.run_on_scheduler(_schedule_unrunnable, worker=first) == 1


# -- arguments --------------------------------------------------------------


def parser(doc: str | None, repeat: int | None = 3, json: bool = True,
           write: bool = False) -> argparse.ArgumentParser:
    """The scripts' argument parser: ``--repeat`` (None: none), ``--json``,
    ``--write`` (with ``write``: the script's section of RESULTS.md,
    ``write_section``; ``--results`` is the same) and, added by ``parse``,
    ``--quick``. ``doc``: the script's docstring."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if repeat is not None:
        p.add_argument("--repeat", type=int, default=repeat, help="timed runs (their median)")
    if json:
        p.add_argument("--json", help="also write the numbers to this JSON file")
    if write:
        p.add_argument("--write", "--results", dest="write", action="store_true",
                       help="put the table in its section of benchmarks/RESULTS.md")
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


def interleaved(alts: Iterable[Any], repeat: int) -> Iterator[Any]:
    """Each alternative once per round, ``repeat`` rounds, every other round in
    reverse order (so neither comes always first on a machine whose speed
    drifts)."""
    alts = list(alts)
    for r in range(repeat):
        yield from (alts if r % 2 == 0 else reversed(alts))


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


class Compared(NamedTuple):
    """The alternatives of one scenario, by key: wall times, tasks run, medians."""

    walls: dict[str, list[float]]
    tasks: dict[str, list[int]]
    median: dict[str, float]


def compare(what: str, alts: Mapping[str, Alt], n: int, repeat: int,
            expect: Callable[[int], Any], warm_n: int) -> Compared:
    """``measure`` of each alternative in turn, each on a fresh cluster."""
    out = {key: measure(f"{what} {key}", alt, n, repeat, expect, warm_n)
           for key, alt in alts.items()}
    return Compared({k: w for k, (w, _) in out.items()}, {k: t for k, (_, t) in out.items()},
                    {k: median(w) for k, (w, _) in out.items()})


# -- plain Python references --------------------------------------------------


def seq_fib(i: int) -> int:
    """Sequential Python fib, the reference the coroutine versions are checked
    and compared against."""
    return i if i < 2 else seq_fib(i - 1) + seq_fib(i - 2)


def fib_calls(n: int) -> int:
    """Calls of fib(n), every one a coroutine call (a task when inline is off)."""
    return 2 * seq_fib(n + 1) - 1


def ns_making_calls(f: Callable[[int], Any], k: int) -> float:
    """ns to make one call object of ``f``: ``f(3)`` in a loop of ``k``, the
    fastest of 9, less the empty loop's fastest of 9."""

    def best(g: Callable[[int], Any] | None) -> float:
        out = float("inf")
        for _ in range(9):
            t0 = time.perf_counter()
            if g is None:
                for _ in range(k):
                    pass
            else:
                for _ in range(k):
                    g(3)
            out = min(out, time.perf_counter() - t0)
        return out

    return (best(f) - best(None)) / k * 1e9


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


@dataclass
class Scenario:
    """One section of RESULTS.md that run_all.py writes: it runs
    ``python benchmarks/<script> <args>`` within ``budget`` seconds and puts its
    Markdown output under ``heading`` (then ``notes``). ``json``: the script
    takes ``--json`` (its numbers, for the targets); ``render``: it can print
    its table from a partial JSON (``--render``); ``quick``: the arguments
    kept with run_all's ``--quick`` (which alternatives). The script is set by
    run_all from the module that declares it."""

    key: str
    heading: str
    args: list[str]
    budget: float
    notes: str = ""
    json: bool = True
    render: bool = False
    quick: list[str] = field(default_factory=list)
    script: str = ""
    result: dict = field(default_factory=dict)


class Targets(list):
    """Rows of the Targets table: ``[target, measured, met]``; a target whose
    label ends in "(no target)" is a comparison, listed after the targets."""

    def row(self, target: str, measured: str, met: str) -> None:
        self.append([target, measured, met])

    def missing(self, target: str) -> None:
        self.row(target, "not measured in this run", "-")


def yes(ok: bool) -> str:
    return "**yes**" if ok else "**no**"


def command(script: str, argv: Sequence[str]) -> str:
    """The command line shown in RESULTS.md (without ``--json FILE``: where
    one run's numbers went is nobody's business)."""
    given = list(argv)
    if "--json" in given:
        i = given.index("--json")
        del given[i:i + 2]
    return shlex.join(["python", f"benchmarks/{script}", *given])


def write_section(heading: str, script: str, argv: Sequence[str] | None, body: str,
                  *notes: str, dated: bool = False) -> None:
    """A script's own section of RESULTS.md (its ``--write``): the heading, the
    command, the table and notes, in place of the section of that heading."""
    cmd = command(script, sys.argv[1:] if argv is None else argv)
    when = f" ({time.strftime('%Y-%m-%d')})" if dated else ""
    replace_section(heading, "\n\n".join([heading, f"Command: `{cmd}`{when}", body, *notes])
                    + "\n")


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
