"""Where fib(25) on 2 workers loses against 1 worker: a breakdown of the run.

Run: python benchmarks/bench_fib_scaling.py [--n 25] [--repeat 5] [--layout local|apart] [--quick]
For each of 1 and 2 worker processes x 1 thread (the defaults: inline on,
push stealing), --repeat timed runs of ``dask_coro.examples.fib(n)`` after a
warm-up; medians per figure. ``--layout local`` (the default) is the suite's
embedded LocalCluster, whose scheduler runs in the client's process (its CPU
is then the process's less its main thread, where the client blocks in
``result()``); ``--layout apart`` starts the scheduler and each worker as
processes of their own, so the client's and the scheduler's CPU are apart.

Per run it records, from a worker plugin and a scheduler plugin (wall clock,
same machine): when each task went executing and left it on which worker
(a seceded task frees its thread: ``long-running``), so each worker's
*busy* time (a thread running Python), its idle time before its first task
(the start), between tasks (the middle) and after its last (the tail); the
tasks handed out and pushes of idle threads; the messages the scheduler
received by op; and the CPU seconds (psutil ``cpu_times``) of every worker,
the scheduler and the client over the run. Prints a Markdown table and the
2-worker run's capacity (2 workers x wall), term by term.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import _bench as B
import psutil
from distributed import Client, SchedulerPlugin, WorkerPlugin

from dask_coro.examples import fib as coro_fib


class Spans(WorkerPlugin):
    """Each task's executing spans on this worker, wall clock."""

    name = "bench-spans"
    idempotent = True

    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.open: dict[Any, float] = {}
        self.spans: list[tuple[float, float, str]] = []
        self.events: list[tuple[float, str]] = []  # pushes received, calls handed out
        self.hooked = False

    def hook(self) -> None:
        """Records when the key watcher (made by the first coroutine here)
        hears of idle threads and when a run hands calls out."""
        w = self.worker.plugins.get("dask-coro-key-watcher")
        if w is None or self.hooked:
            return
        self.hooked = True
        pushed, handed = w._pushed, w.handed

        def _pushed(n: int) -> None:
            self.events.append((time.time(), f"push n={n} received"))
            pushed(n)

        def _handed(n: int) -> None:
            self.events.append((time.time(), f"handed {n} out"))
            handed(n)
        w._pushed, w.handed = _pushed, _handed

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        now = time.time()
        if finish == "executing":
            self.open[key] = now
        elif start == "executing":
            t = self.open.pop(key, None)
            if t is not None:
                self.spans.append((t, now, str(key)))


def _take_spans(dask_worker: Any) -> dict[str, Any]:
    p = dask_worker.plugins["bench-spans"]
    p.hook()
    spans, p.spans = p.spans, []
    events, p.events = p.events, []
    w = dask_worker.plugins.get("dask-coro-key-watcher")
    return {"spans": spans, "events": events, "open": list(p.open.values()),
            "pushes": getattr(w, "pushes", 0)}


class Ops(SchedulerPlugin):
    """The scheduler's received stream messages by op, and tasks that ran."""

    name = "bench-ops"

    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.done = 0
        self.events: list[tuple[float, str]] = []
        self.scheduler: Any = None
        self.hooked = False

    def hook(self) -> None:
        inline = self.scheduler.plugins.get("dask-coro-inline")
        if inline is None or self.hooked:
            return
        self.hooked = True
        push = inline._push

        def _push(n: int) -> int:
            sent = push(n)
            self.events.append((time.time(), f"scheduler: {n} idle, pushed to {sent}"))
            return sent
        inline._push = _push

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        # Workers' and clients' stream messages share one table (Scheduler.__init__).
        table = scheduler.stream_handlers
        for op, h in list(table.items()):
            table[op] = self._counting(op, h)

    def _counting(self, op: str, h: Any) -> Any:
        if inspect.iscoroutinefunction(h):  # core.Server.handle_stream awaits these
            async def acounted(*args: Any, **kwargs: Any) -> Any:
                self.ops[op] += 1
                self.events.append((time.time(), f"scheduler: {op} received"))
                return await h(*args, **kwargs)
            return acounted

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.ops[op] += 1
            self.events.append((time.time(), f"scheduler: {op} received"))
            return h(*args, **kwargs)
        return counted

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "memory" and start == "processing":
            self.done += 1
        if finish == "processing":
            ts = self.scheduler.tasks.get(key)
            ws = getattr(ts, "processing_on", None)
            self.events.append((time.time(), f"scheduler: {key} -> {getattr(ws, 'name', '?')}"))


async def _install_ops(dask_scheduler: Any) -> None:
    if "bench-ops" not in dask_scheduler.plugins:
        plugin = Ops()
        dask_scheduler.add_plugin(plugin)
        await plugin.start(dask_scheduler)  # add_plugin does not start it


def _take_ops(dask_scheduler: Any) -> dict[str, Any]:
    p = dask_scheduler.plugins["bench-ops"]
    p.hook()
    events, p.events = p.events, []
    ops, p.ops = dict(p.ops), collections.Counter()
    done, p.done = p.done, 0
    inline = dask_scheduler.plugins.get("dask-coro-inline")
    counts = dict(inline.counts) if inline is not None else {}
    return {"ops": ops, "done": done, "inline": counts, "events": events}


def _graph_updates(t0: float, t1: float, dask_scheduler: Any = None) -> list[dict[str, float]]:
    """The scheduler's own timing of each update-graph handled in [t0, t1]
    (``Scheduler.update_graph`` logs it as an event): the whole handler, and
    its two steps offloaded to a thread (materializing the graph, ordering
    it), each a thread hop. The ordering and state figures are logged as
    differences in the wrong order; their size is what counts."""
    out = []
    for t, msg in dask_scheduler.get_events("scheduler"):
        if not (t0 <= t <= t1) or not isinstance(msg, dict):
            continue
        if msg.get("action") != "update-graph" or "metrics" not in msg:
            continue
        m = msg["metrics"]
        out.append({"total": m["duration_seconds"],
                    "materialize": m["materialization_duration_seconds"],
                    "order": abs(m["ordering_duration_seconds"]),
                    "state": abs(m["state_initialization_duration_seconds"])})
    return out


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _thread_cpu(p: psutil.Process, tid: int) -> float:
    for t in p.threads():
        if t.id == tid:
            return t.user_time + t.system_time
    return 0.0


@contextlib.contextmanager
def apart(n_workers: int):
    """A scheduler and ``n_workers`` worker processes of their own (no
    nanny), each x 1 thread; a client in this process."""
    env = dict(os.environ)
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as d:
        sf = os.path.join(d, "scheduler.json")
        try:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
                 "--dashboard-address", ":0", "--scheduler-file", sf],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            B.wait_for(lambda: os.path.exists(sf), 60, "the scheduler's file", interval=0.1)
            time.sleep(0.2)
            for _ in range(n_workers):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", sf,
                     "--nthreads", "1", "--no-nanny", "--dashboard-address", ":0"],
                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            with Client(scheduler_file=sf) as client:
                client.wait_for_workers(n_workers)
                yield client, psutil.Process(procs[0].pid)
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


@contextlib.contextmanager
def local(n_workers: int):
    with B.cluster(inline=True, n_workers=n_workers) as client:
        yield client, None


def one_layout(layout: str, n_workers: int, n: int, repeat: int,
               timeline: bool = False) -> list[dict[str, Any]]:
    make = apart if layout == "apart" else local
    expect = B.seq_fib(n)
    runs = []
    with make(n_workers) as (client, sched_proc):
        client.register_plugin(Spans())
        client.run_on_scheduler(_install_ops)
        assert client.compute(coro_fib(12)).result() == B.seq_fib(12)
        workers = B.worker_processes(client)
        me = psutil.Process()
        main_tid = threading.get_native_id()
        for _ in range(repeat + 1):  # the first is a warm-up, not kept
            client.run(_take_spans)
            client.run_on_scheduler(_take_ops)
            wcpu0 = {a: _cpu(p) for a, p in workers.items()}
            s0 = _cpu(sched_proc) if sched_proc else None
            c0, m0 = _cpu(me), _thread_cpu(me, main_tid)
            t0 = time.time()
            value = client.compute(coro_fib(n)).result()
            t1 = time.time()
            c1, m1 = _cpu(me), _thread_cpu(me, main_tid)
            s1 = _cpu(sched_proc) if sched_proc else None
            wcpu1 = {a: _cpu(p) for a, p in workers.items()}
            assert value == expect, value
            spans = client.run(_take_spans)
            ops = client.run_on_scheduler(_take_ops)
            ops["graphs"] = client.run_on_scheduler(_graph_updates, t0, t1)
            run = {"wall": t1 - t0, "t0": t0, "t1": t1, "ops": ops,
                   "worker_cpu": {a: wcpu1[a] - wcpu0[a] for a in workers},
                   "workers": {}}
            if sched_proc is not None:
                run["sched_cpu"] = s1 - s0
                run["client_cpu"] = c1 - c0
            else:  # the scheduler runs on this process's event loop thread
                run["client_cpu"] = m1 - m0
                run["sched_cpu"] = (c1 - c0) - (m1 - m0)
            for a, s in spans.items():
                run["workers"][a] = _worker_figures(s["spans"], t0, t1) | {"pushes": s["pushes"]}
            runs.append(run)
            if timeline:
                ev = [(t, "  " + e) for t, e in ops["events"]]
                for i, s in enumerate(spans.values()):
                    ev += [(t, f"w{i}: {e}") for t, e in s["events"]]
                    ev += [(a, f"w{i}: {k[:20]} executing") for a, _, k in s["spans"]]
                    ev += [(b, f"w{i}: {k[:20]} leaves executing") for _, b, k in s["spans"]]
                for t, e in sorted(ev):
                    if t0 - 0.01 <= t <= t1 + 0.01:
                        B.log(f"    {(t - t0) * 1e3:7.1f} ms {e}")
            B.log(f"{layout} {n_workers} worker(s): {run['wall']:.3f} s, "
                  f"{ops['done']} tasks, cpu w={[round(v, 3) for v in run['worker_cpu'].values()]} "
                  f"sched={run['sched_cpu']:.3f} client={run['client_cpu']:.3f}, "
                  + ", ".join(f"start {w['start']*1e3:.0f} ms idle {w['middle']*1e3:.0f} "
                              f"tail {w['tail']*1e3:.0f} busy {w['busy']*1e3:.0f}"
                              for w in run["workers"].values()))
    return runs[1:]


def _worker_figures(spans: list[tuple[float, float, str]], t0: float, t1: float
                    ) -> dict[str, float]:
    """Busy (union of executing spans, within the run) and idle: before the
    first span, between spans, after the last."""
    iv = sorted((max(a, t0), min(b, t1)) for a, b, _ in spans if b > t0 and a < t1)
    merged: list[list[float]] = []
    for a, b in iv:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    if not merged:
        return {"busy": 0.0, "start": t1 - t0, "middle": 0.0, "tail": 0.0, "spans": 0}
    busy = sum(b - a for a, b in merged)
    start = merged[0][0] - t0
    tail = t1 - merged[-1][1]
    middle = (t1 - t0) - busy - start - tail
    return {"busy": busy, "start": start, "middle": middle, "tail": tail, "spans": len(spans)}


def _med(runs: list[dict[str, Any]], f) -> float:
    return B.median([f(r) for r in runs])


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    def per_worker(r, k, pick):
        ws = sorted(r["workers"].values(), key=lambda w: w["start"])
        return ws[pick][k] if len(ws) > abs(pick) else 0.0

    return {
        "wall": _med(runs, lambda r: r["wall"]),
        "tasks": _med(runs, lambda r: r["ops"]["done"]),
        "pushes": _med(runs, lambda r: r["ops"]["inline"].get("push", 0)),
        "checks": _med(runs, lambda r: r["ops"]["inline"].get("check", 0)),
        "events": _med(runs, lambda r: r["ops"]["inline"].get("event", 0)),
        "msgs": _med(runs, lambda r: sum(r["ops"]["ops"].values())),
        "worker_cpu": _med(runs, lambda r: sum(r["worker_cpu"].values())),
        "sched_cpu": _med(runs, lambda r: r["sched_cpu"]),
        "client_cpu": _med(runs, lambda r: r["client_cpu"]),
        "busy": _med(runs, lambda r: sum(w["busy"] for w in r["workers"].values())),
        "first_start": _med(runs, lambda r: per_worker(r, "start", 0)),
        "second_start": _med(runs, lambda r: per_worker(r, "start", -1)),
        "middle": _med(runs, lambda r: sum(w["middle"] for w in r["workers"].values())),
        "tail": _med(runs, lambda r: max(w["tail"] for w in r["workers"].values())),
        "tail_sum": _med(runs, lambda r: sum(w["tail"] for w in r["workers"].values())),
        "graph_total": B.median([g["total"] for r in runs for g in r["ops"]["graphs"]] or [0]),
        "graph_hops": B.median([g["materialize"] + g["order"] for r in runs
                                for g in r["ops"]["graphs"]] or [0]),
    }


def main(argv=None) -> int:
    p = B.parser(__doc__, repeat=5)
    p.add_argument("--n", type=int, default=25)
    p.add_argument("--layout", choices=("local", "apart"), default="local")
    p.add_argument("--timeline", action="store_true",
                   help="log each 2-worker run's events (stderr)")
    args = B.parse(p, argv, quick={"n": 14, "repeat": 1})
    seq_s, _ = B.median_of(lambda: B.seq_fib(args.n), 15)
    one = one_layout(args.layout, 1, args.n, args.repeat)
    two = one_layout(args.layout, 2, args.n, args.repeat, args.timeline)
    s1, s2 = summary(one), summary(two)
    ms = lambda x: f"{x * 1e3:.0f} ms"  # noqa: E731
    rows = [
        ["wall (median)", ms(s1["wall"]), ms(s2["wall"])],
        ["/ sequential Python", f"{s1['wall'] / seq_s:.1f} x", f"{s2['wall'] / seq_s:.1f} x"],
        ["speedup over 1 worker", "1", f"{s1['wall'] / s2['wall']:.2f} x"],
        ["tasks run (root + handed out)", f"{s1['tasks']:.0f}", f"{s2['tasks']:.0f}"],
        ["pushes of idle threads (scheduler -> worker)", f"{s1['pushes']:.0f}",
         f"{s2['pushes']:.0f}"],
        ["scheduler looks at idle threads / idle events", f"{s1['checks']:.0f} / {s1['events']:.0f}",
         f"{s2['checks']:.0f} / {s2['events']:.0f}"],
        ["stream messages the scheduler received", f"{s1['msgs']:.0f}", f"{s2['msgs']:.0f}"],
        ["the scheduler's update-graph handler, median (of which its two thread hops)",
         f"{s1['graph_total'] * 1e3:.1f} ms ({s1['graph_hops'] * 1e3:.1f})",
         f"{s2['graph_total'] * 1e3:.1f} ms ({s2['graph_hops'] * 1e3:.1f})"],
        ["workers' CPU, summed", ms(s1["worker_cpu"]), ms(s2["worker_cpu"])],
        ["workers' busy (a task executing), summed", ms(s1["busy"]), ms(s2["busy"])],
        ["scheduler CPU", ms(s1["sched_cpu"]), ms(s2["sched_cpu"])],
        ["client CPU", ms(s1["client_cpu"]), ms(s2["client_cpu"])],
        ["first worker: idle before its first task", ms(s1["first_start"]),
         ms(s2["first_start"])],
        ["second worker: idle before its first task (first handed-out call)", "-",
         ms(s2["second_start"])],
        ["idle between tasks, summed over workers", ms(s1["middle"]), ms(s2["middle"])],
        ["tail: idle after a worker's last task (the longer)", ms(s1["tail"]), ms(s2["tail"])],
    ]
    # The 2-worker run's capacity (2 workers x wall), term by term: the
    # 1-worker run's CPU (the work), the workers' extra CPU, time a worker
    # was running a task but not on a core (the scheduler, the client and the
    # rest of the machine had it), and idle time. What is left is the
    # granularity of the CPU counters (10 ms) and the spans' edges.
    cap = 2 * s2["wall"]
    parts = {
        "the work: the 1-worker run's worker CPU": s1["worker_cpu"],
        "extra worker CPU on 2 workers (hand-outs, their messages, more steps)":
            s2["worker_cpu"] - s1["worker_cpu"],
        "a task running but not on a core (busy less CPU: the machine's other processes)":
            s2["busy"] - s2["worker_cpu"],
        "idle at the start (both workers, before their first task)":
            s2["first_start"] + s2["second_start"],
        "idle in the middle (between a worker's tasks)": s2["middle"],
        "idle at the end (after each worker's last task)": s2["tail_sum"],
    }
    rows2 = [[k, ms(v), f"{v / cap:.0%}"] for k, v in parts.items()]
    rows2.append(["capacity: 2 workers x wall", ms(cap), "100%"])
    machine = s2["sched_cpu"] + s2["client_cpu"]
    idle = s2["first_start"] + s2["second_start"] + s2["middle"] + s2["tail_sum"]
    quiet = (s2["worker_cpu"] + machine + idle) / 2
    quiet1 = s1["worker_cpu"] + s1["first_start"] + s1["tail"]
    note = (
        f"Sequential Python fib({args.n}): {seq_s * 1e3:.1f} ms. Layout {args.layout}; "
        f"medians of {args.repeat} runs. On 2 workers the scheduler and client used "
        f"{ms(machine)} of CPU in a {ms(s2['wall'])} run on 2 cores "
        f"({machine / cap:.0%} of the machine); on 1 worker a task ran "
        f"{ms(s1['busy'] - s1['worker_cpu'])} off a core, on 2 "
        f"{ms(s2['busy'] - s2['worker_cpu'])}. With no core lost to other processes, "
        f"the same CPU and idle times give about {ms(quiet)} on 2 workers (their CPU and "
        f"the scheduler's and client's, split over 2 cores, plus half the idle time) "
        f"against {ms(quiet1)} on 1 (its CPU, its start and its end): {quiet1 / quiet:.2f} x.")
    B.report(["", "1 worker", "2 workers"], rows)
    print()
    B.report(["where the 2-worker run's time goes", "time", "of 2 x wall"], rows2, note)
    B.write_json(args.json, {"seq_s": seq_s, "one": s1, "two": s2, "runs1": one, "runs2": two})
    return 0


SCENARIOS = [  # its section of RESULTS.md, run by run_all.py
    B.Scenario("fib_scaling", "fib(25) on 2 workers versus 1: the run's time, term by term",
               ["--repeat", "3"], 300,
               notes="The analysis of these terms, from `--repeat 7` and `--timeline`: the "
                     "section \"fib(25) on 2 workers versus 1: where the second worker's time goes\"."),
]


if __name__ == "__main__":
    sys.exit(main())
