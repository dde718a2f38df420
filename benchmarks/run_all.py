"""Runs every benchmark scenario with its defaults, each in its own process with a time budget, and writes benchmarks/RESULTS.md: one section per scenario and a table of the targets, measured against the alternatives of the same run.

Run: python benchmarks/run_all.py [--only fib fanout ...] [--total-budget 1500] [--output benchmarks/RESULTS.md]
Each scenario runs `python benchmarks/<script> <args>` (the command shown in
its section), with a per-scenario budget and a total one: a scenario past its
budget is killed, with its process tree, and reported as such; one that would
start after the total budget is used up is skipped. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclass
class Scenario:
    key: str
    heading: str
    script: str
    args: list[str]
    budget: float  # seconds
    notes: str = ""
    json: bool = True
    result: dict = field(default_factory=dict)


SCENARIOS = [
    Scenario("fib", "fib(n), every call a task: dask_coro versus worker_client() versus Ray nested tasks",
             "bench_fib.py", ["--n", "12", "14", "16", "--repeat", "3"], 480),
    Scenario("fanout", "One yield of 10,000 children versus client.map of the same 10,000",
             "bench_fanout.py", ["--n", "10000", "--repeat", "3"], 330),
    Scenario("suspended", "10,000 coroutines suspended at once",
             "bench_suspended.py", ["--n", "10000", "--wc-n", "2000", "--repeat", "3"], 450,
             notes="worker_client is measured with 2,000 waiters to keep the suite "
                   "bounded: with 10,000 (`--wc-n 10000`, one thread each) getting them "
                   "all suspended takes minutes on this machine (a trial had about 9,400 "
                   "suspended after 200 s)."),
    Scenario("suspended_memory", "Where the memory of a suspended coroutine goes (tracemalloc)",
             "bench_suspended.py", ["--tracemalloc", "2000", "--top", "20"], 90),
    Scenario("process_all", "The seed's process_all over a list of 1,000 versus worker_client",
             "bench_process_all.py", ["--n", "1000", "--repeat", "3"], 150),
    Scenario("yield_loop", "Per-yield latency: a loop of 1,000 sequential yields of one trivial child",
             "bench_yield_loop.py", ["--n", "1000", "--repeat", "3"], 240),
    Scenario("profile", "Where the time goes per child task: fib(14) under py-spy",
             "profile_fib.py", ["--n", "14", "--repeat", "3"], 120),
    Scenario("fib_seq", "fib(25), every call a coroutine, versus sequential Python",
             "bench_fib_seq.py", ["--n", "25", "--timeout", "180", "--small", "16", "--repeat", "3"], 330),
    Scenario("promises", "10,000 pending promises on a 1-thread worker",
             "bench_promises.py", ["--n", "10000"], 120, json=False,
             notes="All were parked on the scheduler (no worker thread, slot or coroutine) while "
                   "their dependent waited, and the sum was right. One resolve is one vetting "
                   "round trip plus two messages on the client's batched stream."),
    Scenario("shm", "One large array read by tasks on two workers: shared memory versus plain Dask transfer",
             "bench_shm.py", [], 150, json=False),
]


# -- running ----------------------------------------------------------------


def _busy_cpu() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


class TreeCPU:
    """CPU time used by a process and everything it starts, sampled every
    ``interval`` s (the last value seen of each process counts, so a process
    that lived less than one interval is missed)."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.root = pid
        self.interval = interval
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _sample(self) -> None:
        try:
            root = psutil.Process(self.root)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                self.cpu[(p.pid, p.create_time())] = t.user + t.system

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> float:
        self._sample()
        self._stop.set()
        self._t.join()
        return sum(self.cpu.values())


def run(s: Scenario, timeout: float) -> None:
    cmd = [sys.executable, os.path.join(HERE, s.script), *s.args]
    fd, json_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    if s.json:
        cmd += ["--json", json_path]
    with tempfile.TemporaryFile(mode="w+") as log_f:
        _run(s, cmd, json_path, log_f, timeout)


def _run(s: Scenario, cmd: list[str], json_path: str, log_f, timeout: float) -> None:
    busy0, start = _busy_cpu(), time.monotonic()
    load0 = os.getloadavg()[0]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log_f, text=True,
                            start_new_session=True)
    ours = TreeCPU(proc.pid)
    status = "ok"
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        status = "timeout"
        _kill_tree(proc)
        out, _ = proc.communicate()
    elapsed = time.monotonic() - start
    if status == "ok" and proc.returncode != 0:
        status = f"exit {proc.returncode}"
    other = max(0.0, (_busy_cpu() - busy0) - ours.stop())
    log_f.seek(0)
    err = log_f.read()
    data = {}
    if s.json and status == "ok":
        with contextlib.suppress(Exception), open(json_path) as f:
            data = json.load(f)
    os.unlink(json_path)
    s.result = {"status": status, "stdout": out, "stderr_tail": _tail(err), "elapsed": elapsed,
                "other_cpu": other, "load0": load0, "data": data, "timeout": timeout}


def _kill_tree(proc: subprocess.Popen) -> None:
    """The scenario's process and everything it started (worker processes, Ray's
    daemons), by process id."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        tree = []
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree, timeout=10)


def _tail(err: str, lines: int = 6) -> str:
    """The last lines of a scenario's stderr that say something, without this
    machine's paths."""
    keep = [ln for ln in err.splitlines()
            if ln.strip() and "Warning" not in ln and "warnings.warn" not in ln]
    text = "\n".join(keep[-lines:])
    return re.sub(r"(/[\w.+-]+)+/([\w.+-]+)", r"\2", text)


# -- writing ----------------------------------------------------------------


def _cmd(s: Scenario) -> str:
    return shlex.join(["python", f"benchmarks/{s.script}", *s.args])


def section(s: Scenario) -> str:
    r = s.result
    head = [f"## {s.heading}", "", f"Command: `{_cmd(s)}`", ""]
    if not r:
        return "\n".join(head + ["Not run (the suite's total budget was used up).", ""])
    load = (f"Took {r['elapsed']:.0f} s (budget {r['timeout']:.0f} s). Load from other "
            f"processes on the machine meanwhile: {r['other_cpu']:.0f} CPU-s "
            f"({r['other_cpu'] / max(r['elapsed'], 1):.2f} cores on average; 1-min load average "
            f"{r['load0']:.1f} at the start).")
    if r["status"] != "ok":
        what = (f"Did not finish within its budget of {r['timeout']:.0f} s and was stopped."
                if r["status"] == "timeout" else f"Failed ({r['status']}).")
        body = [what, "", "Last lines of its log:", "", "```", r["stderr_tail"], "```"]
        if r["stdout"].strip():
            body = [r["stdout"].strip(), "", *body]
    else:
        body = [r["stdout"].strip()]
    if s.notes:
        body += ["", textwrap.fill(s.notes, 79)]
    return "\n".join(head + body + ["", load, ""])


def targets(by: dict[str, Scenario]) -> str:
    rows = []

    def data(key):
        s = by.get(key)
        return s.result.get("data") if s and s.result else None

    def row(target, measured, met):
        rows.append(f"| {target} | {measured} | {met} |")

    d = data("fib")
    if d and "16" in d["results"] and {"coro", "wc"} <= d["results"]["16"].keys():
        c, w = d["results"]["16"]["coro"], d["results"]["16"]["wc"]
        r = c["wall"] / w["wall"]
        row("fib(16): dask_coro wall <= 0.2 x worker_client",
            f"{r:.2f} x ({c['wall']:.2f} s vs {w['wall']:.2f} s)", _yes(r <= 0.2))
        limit = 1 + 10
        row("fib(16): peak worker threads <= nthreads + 10 (1 + 10 per worker process)",
            f"{c['peak_threads_max']} OS threads in the busiest worker process "
            f"(worker_client: {w['peak_threads_max']})", _yes(c["peak_threads_max"] <= limit))
        if "ray" in d["results"]["16"]:
            y = d["results"]["16"]["ray"]
            row("fib(16) against Ray nested tasks (no target)",
                f"dask_coro {c['wall'] / y['wall']:.2f} x Ray's wall time; Ray peaked at "
                f"{y['peak_procs']} worker processes, {y['peak_threads_total']} threads", "-")
    else:
        row("fib(16) <= 0.2 x worker_client, threads <= nthreads + 10", "not measured", "-")
    d = data("fanout")
    if d:
        m = d["median"]
        r = m["delayed"] / m["map"]
        row("one yield of 10,000 children <= 1.2 x client.map",
            f"{r:.2f} x ({m['delayed']:.1f} s vs {m['map']:.1f} s; with @coroutine children "
            f"{m['coro'] / m['map']:.2f} x)", _yes(r <= 1.2))
    else:
        row("one yield of 10,000 children <= 1.2 x client.map", "not measured", "-")
    d = data("suspended")
    c = d and d["summary"].get("coro")
    if c:
        kib = c["bytes_each"] / 1024
        done = c["completed"]
        row("10,000 suspended coroutines complete, <= 10 KiB of worker memory each",
            f"completed in {done} of {done + (1 if 'coro' in d['errors'] else 0)} runs; "
            f"{kib:.1f} KiB each (RSS); peak {c['threads_peak']} OS threads in the busiest worker",
            _yes(kib <= 10 and "coro" not in d["errors"]))
    else:
        err = d and d["errors"].get("coro")
        row("10,000 suspended coroutines complete, <= 10 KiB each",
            f"did not complete: {err}" if err else "not measured", "no" if err else "-")
    d = data("process_all")
    if d:
        m = d["median"]
        r = m["coro"] / m["wc"]
        row("process_all (1,000) <= 1.0 x worker_client",
            f"{r:.2f} x ({m['coro']:.2f} s vs {m['wc']:.2f} s); summed by one task instead of "
            f"the seed's chain of adds: {m['coro_sum'] / m['wc']:.2f} x", _yes(r <= 1.0))
    else:
        row("process_all (1,000) <= 1.0 x worker_client", "not measured", "-")
    d = data("yield_loop")
    if d:
        m, n = d["median"], d["n"]
        row("per-yield latency (no target)",
            f"{m['coro'] / n * 1000:.1f} ms per yield (`@coroutine` child), "
            f"{m['delayed'] / n * 1000:.1f} ms (`dask.delayed` child); worker_client "
            f"submit().result(): {m['wc'] / n * 1000:.1f} ms", "-")
    d = data("fib_seq")
    if d:
        a = d["attempt"]
        slow = d["tasks"] * a["elapsed"] / a["done"] if a["done"] else float("nan")
        got = (f"{d['coro_s']:.0f} s" if not d["extrapolated"]
               else f"did not finish in {d['timeout']:.0f} s ({a['done']} of {d['tasks']} tasks); "
                    f"~{d['coro_s']:.0f} s extrapolated from fib({d['small']}), "
                    f"~{slow:.0f} s at the attempt's own rate")
        row(f"fib({d['n']}) all coroutines vs sequential Python (no target)",
            f"{got} vs {d['seq_s'] * 1000:.0f} ms: ~{d['coro_s'] / d['seq_s']:,.0f} x", "-")
    return "\n".join(["| target | measured | met? |", "|---|---|---|", *rows])


def profile_summary(by: dict[str, Scenario]) -> str:
    """The profile's buckets, per child task, in the issue's terms."""
    s = by.get("profile")
    d = s.result.get("data") if s and s.result else None
    if not d or "buckets" not in d:
        return "No profile in this run (py-spy missing, or the scenario did not run)."
    children = d["children"]
    w = d["buckets"]["workers (both)"]
    c = d["buckets"]["client + scheduler"]

    def pick(b: dict, *prefixes: str) -> float:
        return sum(v for k, v in b["by"].items() if k.startswith(prefixes))

    groups = [
        ("dask_coro driver: the body's steps on the thread pool, incl. building the children's Delayed",
         "workers", pick(w, "driver")),
        ("dask_coro plan: Structure, classify, plan_yield, result cache", "workers", pick(w, "plan")),
        ("dask_coro runner: handing each step to the thread pool (`run_in_executor`)", "workers",
         pick(w, "runner: handing")),
        ("dask_coro runner: the rest (waiting, cancellation watch, releases)", "workers",
         pick(w, "runner: the rest", "dask_coro lifetimes")),
        ("submission: `client.get` on the worker, graph to futures, pickling", "workers",
         pick(w, "submission")),
        ("results back: reports to the worker's client, `client.gather`, `get_data`", "workers",
         pick(w, "results back")),
        ("worker state machine (executing, seceding, finishing tasks)", "workers",
         pick(w, "worker state machine")),
        ("comm on the workers: TCP, batched sends, (de)serialization", "workers", pick(w, "comm")),
        ("event loop on the workers (asyncio, tornado), other", "workers",
         pick(w, "event loop", "other", "unattributed")),
        ("scheduler: update_graph (incl. dask.order)", "client + scheduler",
         pick(c, "scheduler: update_graph")),
        ("scheduler: transitions, worker messages, other bookkeeping, dask_coro plugins",
         "client + scheduler", pick(c, "scheduler: transitions", "scheduler: other", "dask_coro")),
        ("comm in the scheduler process: TCP, batched sends, (de)serialization", "client + scheduler",
         pick(c, "comm")),
        ("event loop in the scheduler process, other", "client + scheduler",
         pick(c, "event loop", "other", "unattributed", "the benchmark")),
    ]
    total = w["cpu_s"] + c["cpu_s"]
    rows = [f"| {name} | {where} | {secs / children * 1e6:.0f} | {secs / total:.0%} |"
            for name, where, secs in groups]
    rows.append(f"| **all** | | **{total / children * 1e6:.0f}** | 100% |")
    return "\n".join([
        textwrap.fill(
            f"From the py-spy profile of {d['repeat']} runs of fib({d['n']}) below ({children} "
            f"child tasks, {d['wall']:.2f} s wall: {d['wall'] / children * 1e6:.0f} us of wall "
            "time per child on 2 cores): CPU time per child task, by where it went.", 79), "",
        "| where | process | us of CPU per child | share |", "|---|---|---|---|", *rows])


def _yes(ok: bool) -> str:
    return "**yes**" if ok else "**no**"


def _code_version() -> str:
    """The commit of the code measured, and whether dask_coro/ differed from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "dask_coro"], cwd=ROOT,
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes in dask_coro/" if dirty else "")


def _versions() -> str:
    out = []
    for dist in ("dask", "distributed", "ray", "py-spy", "psutil"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out.append(f"{dist} {importlib.metadata.version(dist)}")
    return ", ".join(out)


def document(scenarios: list[Scenario], elapsed: float, argv: list[str], code: tuple[str, str]) -> str:
    by = {s.key: s for s in scenarios}
    mem = psutil.virtual_memory().total / 2**30
    ran = [s for s in scenarios if s.result]
    other = sum(s.result["other_cpu"] for s in ran)
    head = f"""\
# Benchmark results

Command: `{shlex.join(['python', 'benchmarks/run_all.py', *argv])}` ({elapsed / 60:.1f} minutes,
{datetime.date.today().isoformat()}), dask_coro at commit {code[0]}{'' if code[0] == code[1] else
f' when the suite started, {code[1]} when it ended'}.
Machine: {psutil.cpu_count()} cores, {mem:.0f} GiB, shared with other work (numbers are
noisy; ratios from the same run are what count). Python {platform.python_version()},
{_versions()}.
Every scenario runs on an embedded `LocalCluster(n_workers=2, threads_per_worker=1,
processes=True)` (Ray: `ray.init(num_cpus=2)`), all alternatives of a scenario in
the same run, medians of 3 runs unless a section says otherwise. Other
processes on the machine used {other:.0f} CPU-s during the suite (from
/proc/stat, less what the suite's own processes used; each section gives its
share).

## Targets

{targets(by)}

## Where the time goes per child task (summary)

{profile_summary(by)}
"""
    return head + "\n" + "\n".join(section(s) for s in scenarios)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="+", choices=[s.key for s in SCENARIOS],
                   help="run only these scenarios (the others are listed as not run)")
    p.add_argument("--total-budget", type=float, default=1500.0, help="seconds for the whole suite")
    p.add_argument("--output", default=os.path.join(HERE, "RESULTS.md"))
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    chosen = [s for s in SCENARIOS if not args.only or s.key in args.only]
    code_start = _code_version()
    start = time.monotonic()
    deadline = start + args.total_budget
    for s in chosen:
        left = deadline - time.monotonic()
        if left < 30:
            print(f"[{s.key}] skipped: total budget used up", file=sys.stderr, flush=True)
            continue
        timeout = min(s.budget, left)
        print(f"[{s.key}] {_cmd(s)} (budget {timeout:.0f} s)", file=sys.stderr, flush=True)
        run(s, timeout)
        print(f"[{s.key}] {s.result['status']} in {s.result['elapsed']:.0f} s", file=sys.stderr,
              flush=True)
    elapsed = time.monotonic() - start
    text = document(chosen, elapsed, argv, (code_start, _code_version()))
    with open(args.output, "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(args.output)} after {elapsed / 60:.1f} minutes", file=sys.stderr)
    return 0 if all(s.result.get("status") == "ok" for s in chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
