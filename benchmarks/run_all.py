"""Runs every benchmark scenario with its defaults, each in its own process with a time budget,
and writes benchmarks/RESULTS.md: one section per scenario and a table of the targets, measured
against the alternatives of the same run.

Run: python benchmarks/run_all.py [--only fib fanout ...] [--total-budget 1200]
                                  [--output benchmarks/RESULTS.md] [--quick]
With --quick every script runs with its own --quick (tiny sizes, one run): a smoke
test of the suite, not a measurement; write it elsewhere than RESULTS.md.
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

import _bench as B
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
    render: bool = False  # the script can print its table from a partial JSON (--render)
    quick: list[str] = field(default_factory=list)  # args kept with --quick (which alternatives)
    result: dict = field(default_factory=dict)


SCENARIOS = [
    Scenario("fib", "fib(n), every call a coroutine: dask_coro inline on and off versus "
             "worker_client() versus Ray nested tasks",
             "bench_fib.py", ["--n", "12", "14", "16", "--repeat", "3"], 480, render=True),
    Scenario("fib_seq", "fib(25), every call a coroutine, versus sequential Python",
             "bench_fib_seq.py", ["--n", "25", "--repeat", "3", "--small", "14"], 120,
             notes="Inline off, fib(25) is 242,785 tasks: minutes on this machine, too long "
                   "for the suite, so it is extrapolated from fib(14)'s rate, which flatters "
                   "it: an earlier suite's attempt at fib(25) itself (`--timeout 180`) had done "
                   "17% of the tasks after 180 s, the rate falling as the tree of suspended "
                   "coroutines grew (~1,100 s at that rate)."),
    Scenario("steal", "A CPU-heavy tree of coroutines: 2 workers versus 1 (inline on), inline off, "
             "sequential", "bench_steal.py", ["--depth", "9", "--leaf-ms", "4", "--repeat", "3"],
             150),
    Scenario("scale", "Work stealing on 1 to 8 workers: the scheduler pushing idle threads "
             "versus polling", "bench_scale.py",
             ["--workers", "1", "2", "4", "8", "--depth", "10", "--leaf-ms", "10", "--repeat", "2"],
             300,
             notes="Leaves sleep, so the 8 worker processes need little CPU of the 2 cores: the "
                   "speed-up measures how well work is handed out. Push is the default "
                   "(`coro.inline.stealing`); poll is the design it replaced, in the same run."),
    Scenario("profile",
             "Where the time goes per child: fib(14) as tasks under py-spy, fib(22) inline",
             "profile_fib.py", ["--n", "14", "--repeat", "3", "--inline-n", "22"], 120),
    Scenario("fanout", "One yield of 10,000 children versus client.map of the same 10,000",
             "bench_fanout.py",
             ["--n", "10000", "--repeat", "3", "--alt", "map", "inline", "tasks"], 300,
             quick=["--alt", "map", "inline", "tasks"],
             notes="`dask.delayed` children (`--alt delayed`, tasks with inline on or off) "
                   "are left out of the suite to keep it within 15 minutes; earlier suites "
                   "measured them at 1.05-1.08 x client.map."),
    Scenario("process_all", "process_all as dask/distributed #1663 writes it, over a list of 1,000, versus worker_client",
             "bench_process_all.py", ["--n", "1000", "--repeat", "3"], 180),
    Scenario("suspended", "10,000 coroutines suspended at once",
             "bench_suspended.py", ["--n", "10000", "--wc-n", "1000", "--repeat", "3",
                                    "--timeout", "90", "--alt", "coro", "wc"], 330,
             quick=["--alt", "coro", "wc"],
             notes="Inline off only, as the target measures suspended coroutines: "
                   "with inline on (the default) a waiter whose child were a `@coroutine` "
                   "call with plain arguments would run it inline and never suspend; this "
                   "waiter's child is a `Future`, which is never run inline, so inline on it "
                   "suspends all the same, through the same runner (`--alt coro_inline` "
                   "measures it: a trial with 2,000 waiters gave 30.4 KiB each inline on "
                   "against 30.5 KiB off). It is left out of the suite to keep it within 15 "
                   "minutes. worker_client is measured with 1,000 waiters for the same "
                   "reason: with 10,000 (`--wc-n 10000`, one thread each) getting them "
                   "all suspended takes minutes on this machine (a trial had about 9,400 "
                   "suspended after 200 s, and one run of 2,000 timed out at 180 s)."),
    Scenario("suspended_floor",
             "10,000 waiting tasks at once with no dask_coro code: distributed's own floor",
             "bench_suspended.py", ["--n", "10000", "--repeat", "1", "--timeout", "90",
                                    "--alt", "floor", "bare"], 300,
             quick=["--alt", "floor", "bare"],
             notes="One run each (a floor, not a comparison of medians): what a waiting "
                   "task costs a worker in distributed itself, with the same child future "
                   "as dask_coro's waiter, and with no child at all."),
    Scenario("suspended_memory",
             "Where the memory of a suspended coroutine goes (tracemalloc, inline off)",
             "bench_suspended.py", ["--tracemalloc", "1000", "--top", "15"], 60,
             quick=["--tracemalloc", "100", "--top", "5"]),
    Scenario("yield_loop", "Per-yield latency: a loop of sequential yields of one trivial child",
             "bench_yield_loop.py", ["--n", "300", "--repeat", "3"], 120),
    Scenario("result", "Waiting from plain code: `result()` in a helper versus `yield`, versus "
             "sequential Python",
             "bench_result.py", ["--n", "22", "--waits", "300", "--repeat", "3"], 120),
    Scenario("promises", "2,000 pending promises on a 1-thread worker",
             "bench_promises.py", ["--n", "2000"], 60, json=False,
             notes="All were parked on the scheduler (no worker thread, slot or coroutine) while "
                   "their dependent waited, and the sum was right. One resolve is one vetting "
                   "round trip plus two messages on the client's batched stream. (2,000 rather "
                   "than the 10,000 of earlier suites, to keep this suite within 15 minutes; "
                   "the time per resolve does not depend on the number.)"),
    Scenario("release", "Worker release: a tree reduction of large leaves, the scheduler loaded "
             "or not", "bench_release.py", ["--repeat", "1"], 420, quick=["--repeat", "1"],
             notes="One run per row to keep the suite within 15 minutes; "
                   "`python benchmarks/bench_release.py --results` (3 runs a row, ~12 minutes) "
                   "gave the medians quoted in README.md."),
    Scenario("scheduler_cost", "The scheduler's bookkeeping per ended coroutine (1,000 to 10,000 "
             "roots waiting) and per dependent under worker release (1,000 to 8,000 dependents)",
             "bench_scheduler_cost.py",
             ["--roots", "1000", "4000", "10000", "--dependents", "1000", "4000", "8000"], 600,
             notes="CPU time of dask_coro's scheduler plugins' hooks (the scheduler runs in "
                   "the benchmark's process, its hooks wrapped with a thread_time timer): flat "
                   "per root and per dependent means linear in the work. Before the books were "
                   "indexed (same script, same machine): 85 and 338 us per root in the "
                   "durability hook with 1,000 and 4,000 roots waiting (10,000 did not finish: "
                   "the scheduler lost a worker meanwhile), 145 and 228 us per dependent in the "
                   "release hook with 1,000 and 2,000 dependents; the pure books alone "
                   "(`--books`) 71, 419 and 1,179 us per parent for 1,000, 4,000 and 10,000, "
                   "and 46, 192 and 371 us per dependent for 1,000, 4,000 and 8,000."),
    Scenario("shm", "One large array read by tasks on two workers: shared memory versus plain "
             "Dask transfer",
             "bench_shm.py", [], 60, json=False),
    Scenario("hold", "Holding children for a re-run, bounded: a streaming loop's peak memory "
             "(default budget, hold off, plain worker_client) and children run again after a kill "
             "(default budget, unbounded)",
             "bench_hold.py", [], 300),
    Scenario("chaos", "Chaos at a larger size: a streaming loop and waiting parents under kills",
             "bench_chaos.py", ["--runs", "3", "--size", "large", "--kills", "5"], 420,
             quick=["--kills", "5"],
             notes="3 Nanny workers, not the 2 of the other scenarios (the chaos test's "
                   "cluster: the killer always leaves one running). Rounds under random "
                   "kills take as long as the kills make them: the wall times measure "
                   "recovery on a loaded machine, not speed."),
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
    code = _code_version()  # the tree may change while the suite runs
    cmd = [sys.executable, os.path.join(HERE, s.script), *s.args]
    fd, json_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    if s.json:
        cmd += ["--json", json_path]
    with tempfile.TemporaryFile(mode="w+") as log_f:
        _run(s, cmd, json_path, log_f, timeout)
    s.result["code"] = code


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
    if s.json:
        with contextlib.suppress(Exception), open(json_path) as f:
            data = json.load(f)  # a script that writes as it goes leaves something if stopped
    if status == "timeout" and s.render and data:
        with contextlib.suppress(Exception):
            out = subprocess.run([sys.executable, os.path.join(HERE, s.script), "--render",
                                  json_path], cwd=ROOT, capture_output=True, text=True,
                                 timeout=60, check=False).stdout
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
    err = re.sub(r"\x1b\[[0-9;]*m", "", err)  # colours (Ray's)
    keep = [ln for ln in err.splitlines()
            if ln.strip() and "Warning" not in ln and "warnings.warn" not in ln
            and "(raylet)" not in ln]
    text = "\n".join(keep[-lines:])
    return re.sub(r"(/[\w.+-]+)+/([\w.+-]+)", r"\2", text)


# -- writing ----------------------------------------------------------------


def _cmd(s: Scenario) -> str:
    return shlex.join(["python", f"benchmarks/{s.script}", *s.args])


def section(s: Scenario) -> str:
    r = s.result
    head = [f"## {s.heading}", "", f"Command: `{_cmd(s)}`", ""]
    if not r:
        return "\n".join([*head, "Not run (the suite's total budget was used up).", ""])
    load = (f"dask_coro at commit {r.get('code', '?')}. "
            f"Took {r['elapsed']:.0f} s (budget {r['timeout']:.0f} s). Load from other "
            f"processes on the machine meanwhile: {r['other_cpu']:.0f} CPU-s "
            f"({r['other_cpu'] / max(r['elapsed'], 1):.2f} cores on average; 1-min load average "
            f"{r['load0']:.1f} at the start).")
    if _disturbed(r):
        load = ("**Disturbed:** other processes took a sizeable share of the 2 cores during this "
                "scenario, so its times are longer than on a quiet machine (ratios within it "
                "are less affected). " + load)
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


DISTURBED = 0.25  # cores used by other processes, on average, that we flag


def _disturbed(r: dict) -> bool:
    # Short scenarios: a few CPU-s of "other" are the sampler missing our own
    # short-lived processes, not load.
    return r["other_cpu"] / max(r["elapsed"], 1) > DISTURBED and r["other_cpu"] > 5


def _data(by: dict[str, Scenario], key: str) -> dict | None:
    s = by.get(key)
    return s.result.get("data") if s and s.result else None


def targets(by: dict[str, Scenario]) -> str:
    """The targets, each with its number from this run; then the
    comparisons that have no target."""
    rows = []

    def row(target, measured, met):
        rows.append([target, measured, met])

    def missing(target):
        row(target, "not measured in this run", "-")

    d = _data(by, "fib")
    r16 = d and d["results"].get("16", {})
    if r16 and {"inline", "wc"} <= r16.keys():
        c, w = r16["inline"], r16["wc"]
        r = c["wall"] / w["wall"]
        off = r16.get("tasks")
        row("fib(16) <= 0.2 x worker_client's wall time",
            f"**{r:.4f} x** with inline on, the default ({c['wall'] * 1000:.0f} ms vs "
            f"{w['wall']:.2f} s)"
            + (f"; inline off (every call a task): {off['wall'] / w['wall']:.2f} x "
                                     f"({off['wall']:.2f} s)" if off else ""),
            _yes(r <= 0.2))
        if off:
            ro = off["wall"] / w["wall"]
            fl = r16.get("floor")
            row("fib(16), inline off (every call a task) <= 0.25 x worker_client's wall time",
                f"**{ro:.2f} x** ({off['wall']:.2f} s vs {w['wall']:.2f} s)"
                + (f"; distributed's own floor for such a task (an async task awaiting its "
                   f"children, no dask_coro): {fl['wall'] / w['wall']:.2f} x" if fl else "")
                + "; see \"Where the time goes per child task\"", _yes(ro <= 0.25))
        else:
            missing("fib(16), inline off (every call a task) <= 0.25 x worker_client")
        limit = 1 + 10
        row("fib(16): peak worker threads <= nthreads + 10 (1 + 10 per worker process)",
            f"{c['peak_threads_max']} OS threads in the busiest worker process with inline on"
            + (f", {off['peak_threads_max']} inline off" if off else "")
            + f" (worker_client: {w['peak_threads_max']})",
            _yes(c["peak_threads_max"] <= limit and (not off or off["peak_threads_max"] <= limit)))
    else:
        missing("fib(16) <= 0.2 x worker_client, threads <= nthreads + 10")

    d = _data(by, "fanout")
    if d and "map" in d["median"]:
        m = d["median"]
        task_rows = {k: m[k] / m["map"] for k in ("delayed", "tasks") if k in m}
        worst = max(task_rows.values()) if task_rows else None
        parts = []
        if "delayed" in m:
            parts.append(f"`dask.delayed` children (tasks) **{m['delayed'] / m['map']:.2f} x** "
                         f"({m['delayed']:.1f} s vs {m['map']:.1f} s)")
        if "tasks" in m:
            parts.append(f"`@coroutine` children, inline off (tasks) {m['tasks'] / m['map']:.2f} x")
        if "inline" in m:
            parts.append(f"`@coroutine` children, inline on (run inline, no tasks) "
                         f"{m['inline'] / m['map']:.3f} x ({m['inline'] * 1000:.0f} ms)")
        row("one yield of 10,000 children <= 1.2 x client.map (met: every row whose children "
            "are tasks)", "; ".join(parts), _yes(worst is not None and worst <= 1.2))
    else:
        missing("one yield of 10,000 children <= 1.2 x client.map")

    d = _data(by, "suspended")
    summ = (d or {}).get("summary", {})
    errs = (d or {}).get("errors", {})
    c = summ.get("coro")
    if c:
        kib = c["bytes_each"] / 1024
        on = summ.get("coro_inline")
        done = c["completed"]
        row("10,000 suspended coroutines complete, <= 10 KiB of worker memory each "
            "(inline off: every waiter a suspended task)",
            f"completed in {done} of {done + (1 if 'coro' in errs else 0)} runs; **{kib:.1f} KiB** "
            f"each (RSS); peak {c['threads_peak']} OS threads in the busiest worker"
            + (f". Inline on (the waiter's child is a `Future`, so it suspends too): "
               f"{on['bytes_each'] / 1024:.1f} KiB each, completed in {on['completed']} runs"
               if on else "")
            + _floors(_data(by, "suspended_floor")),
            _yes(kib <= 10 and "coro" not in errs))
    else:
        err = errs.get("coro")
        row("10,000 suspended coroutines complete, <= 10 KiB each",
            f"did not complete: {err}" if err else "not measured in this run",
            "**no**" if err else "-")

    d = _data(by, "process_all")
    if d and {"coro", "wc"} <= d["median"].keys():
        m = d["median"]
        r = m["coro"] / m["wc"]
        extra = []
        if "coro_off" in m:
            extra.append(f"inline off {m['coro_off'] / m['wc']:.2f} x")
        if "coro_sum" in m:
            extra.append(f"summed by one task instead of #1663's chain of adds: "
                         f"{m['coro_sum'] / m['wc']:.2f} x"
                         + (f" (inline off {m['coro_sum_off'] / m['wc']:.2f} x)"
                            if "coro_sum_off" in m else ""))
        row("process_all (1,000), as #1663 writes it, <= 0.2 x worker_client",
            f"**{r:.2f} x** with inline on ({m['coro']:.2f} s vs {m['wc']:.2f} s); "
            + "; ".join(extra), _yes(r <= 0.2))
    else:
        missing("process_all (1,000), as #1663 writes it, <= 0.2 x worker_client")

    d = _data(by, "fib_seq")
    if d and "inline2" in d:
        r = d["inline2"]["wall"] / d["seq_s"]
        row(f"fib({d['n']}), every call a coroutine, no cutoff, <= 20 x sequential Python",
            f"**{r:.0f} x** ({d['inline2']['wall'] * 1000:.0f} ms vs {d['seq_s'] * 1000:.1f} ms) "
            f"inline on, 2 workers; {d['inline1']['wall'] / d['seq_s']:.0f} x on 1 worker; inline "
            f"off ~{d['tasks_s']:.0f} s, ~{d['tasks_s'] / d['seq_s']:,.0f} x "
            f"({'extrapolated' if d['tasks_extrapolated'] else 'measured'})",
            _yes(r <= 20))
    else:
        missing("fib(25) <= 20 x sequential Python")

    d = _data(by, "steal")
    if d:
        m = d["median"]
        row("CPU-heavy tree: 2 workers >= 1.6 x faster than 1 (inline on)",
            f"**{d['speedup']:.2f} x** ({m['on1']:.2f} s on 1 worker, {m['on2']:.2f} s on 2); "
            f"inline off on 2 workers {m['off2']:.2f} s; sequential Python {d['seq_s']:.2f} s",
            _yes(d["speedup"] >= 1.6))
    else:
        missing("CPU-heavy tree: 2 workers >= 1.6 x faster than 1")

    d = _data(by, "scale")
    push = d and d["summary"].get("push", {})
    if push and {"1", "4", "8"} <= push.keys():
        p4, p8 = push["4"], push["8"]
        poll = d["summary"].get("poll", {})
        ns = sorted(push, key=int)
        # Flat: what stealing costs per idle event it serves (a stolen task)
        # does not grow with the workers; messages a second grow only with
        # the steals themselves (none while no thread is idle).
        flat = bool(p8["per_steal"] and p4["per_steal"]
                    and p8["per_steal"] <= 1.25 * p4["per_steal"])
        text = (f"**{p8['speedup']:.2f} x** on 8 workers ({push['1']['wall']:.2f} s on 1, "
                f"{p8['wall']:.2f} s on 8); pushing: "
                + ", ".join(f"{push[n]['rate']:.0f}" for n in ns)
                + f" messages/s on {', '.join(ns)} workers, "
                + ", ".join("-" if push[n]["per_steal"] is None else f"{push[n]['per_steal']:.1f}"
                            for n in ns)
                + " per stolen task")
        if poll:
            pn = sorted(poll, key=int)
            text += ("; polling: " + ", ".join(f"{poll[n]['rate']:.0f}" for n in pn)
                     + " messages/s")
            if "8" in poll:
                text += f", speed-up on 8 {poll['8']['speedup']:.2f} x"
        scale = d.get("at_scale")
        if scale:
            text += (f"; 1,000 workers: ~{scale['push']:,.0f} messages/s pushing at the "
                     f"measured steal rate versus {scale['poll']:,.0f} polling")
        row("stealing: speed-up on 8 workers >= 6 x, stealing messages/s flat (push: messages "
            "per stolen task, 8 workers <= 1.25 x 4 workers)", text,
            _yes(p8["speedup"] >= 6 and flat))
    else:
        missing("stealing: speed-up on 8 workers >= 6 x, stealing messages/s flat")

    # -- no target --
    d = _data(by, "fib")
    r16 = d and d["results"].get("16", {})
    if r16 and {"inline", "ray"} <= r16.keys():
        y, c = r16["ray"], r16["inline"]
        off = r16.get("tasks")
        row("fib(16) against Ray nested tasks (no target)",
            f"dask_coro {c['wall'] / y['wall']:.4f} x Ray's wall time inline on"
            + (f", {off['wall'] / y['wall']:.2f} x inline off" if off else "")
            + f"; Ray peaked at {y['peak_procs']} worker processes, "
            f"{y['peak_threads_total']} threads",
            "-")
    d = _data(by, "yield_loop")
    if d and "per_yield" in d:
        q = d["per_yield"]

        def ms(k):
            if k not in q:
                return "-"
            return f"{q[k] * 1e6:.1f} us" if q[k] < 1e-4 else f"{q[k] * 1000:.1f} ms"

        row("per-yield latency (no target)",
            f"`@coroutine` child: {ms('coro')} inline on, {ms('coro_off')} inline off; "
            f"`dask.delayed` child: {ms('delayed')}; worker_client submit().result(): {ms('wc')}",
            "-")
    d = _data(by, "result")
    if d and "median" in d:
        m, w = d["median"], d["wait_median"]
        r = m["result"] / m["gen"]
        row(f"fib({d['n']}) with `result()` in a plain helper <= 2 x the generator version "
            "(inline on)",
            f"**{r:.2f} x** ({m['result'] * 1000:.0f} ms vs {m['gen'] * 1000:.0f} ms, 2 workers)",
            _yes(r <= 2))
        rw = w["result"] / w["yield"]
        row("one wait on a task child: `result()` <= 1.1 x `yield`",
            f"**{rw:.2f} x** ({w['result'] / d['waits'] * 1000:.1f} ms vs "
            f"{w['yield'] / d['waits'] * 1000:.1f} ms a wait)", _yes(rw <= 1.1))
    else:
        missing("fib(22) with `result()` in a plain helper <= 2 x the generator version")
    d = _data(by, "release")
    if d and "inf/delay" in d:
        target = ("worker release, tree reduction of large leaves, scheduler loaded: peak worker "
                  "memory >= 30% lower, wall not worse")

        def pair(k):
            on, off = d[k]["on"], d[k]["off"]
            return on["peak"] / off["peak"], on["wall"] / off["wall"]

        pq, wq = pair("inf/delay")
        text = f"**{pq:.2f} x** peak, {wq:.2f} x wall without root-task queuing"
        if "1.1/delay" in d:
            p1, w1 = pair("1.1/delay")
            text += f"; {p1:.2f} x peak, {w1:.2f} x wall with distributed's default queuing"
        row(target, text, _yes(pq <= 0.7 and wq <= 1.1) + " (no queuing)")
    else:
        missing("worker release: peak worker memory >= 30% lower under scheduler load")
    d = _data(by, "chaos")
    if d:
        row("chaos at a larger size: every answer right under random worker kills",
            f"**{d['wrong']} wrong** in {d['runs']} workload runs, {d['kills']} kills "
            f"(size `{d['size']}`)", _yes(d["wrong"] == 0))
    else:
        missing("chaos at a larger size: every answer right under random worker kills")
    return B.table(["target", "measured", "met?"], rows)


def profile_summary(by: dict[str, Scenario]) -> str:
    """Per child task (inline off) and per inline call, in the targets' terms."""
    d = _data(by, "profile")
    if not d:
        return "No profile in this run (the scenario did not run)."
    out = []
    if "buckets" in d:
        out.append(_task_summary(d))
    inl = d.get("inline")
    if inl:
        out.append(_inline_summary(inl, d if "buckets" in d else None))
    return "\n\n".join(out)


def _task_summary(d: dict) -> str:
    children = d["children"]
    w = d["buckets"]["workers (both)"]
    c = d["buckets"]["client + scheduler"]

    def pick(b: dict, *prefixes: str) -> float:
        return sum(v for k, v in b["by"].items() if k.startswith(prefixes))

    groups = [
        (("dask_coro driver: the body's steps on the thread pool (through the trampoline, "
          "`core/engine.py`), incl. building the children's Delayed"),
         "workers", pick(w, "driver")),
        ("dask_coro plan: Structure, classify, plan_yield, result cache", "workers",
         pick(w, "plan")),
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
        ("comm in the scheduler process: TCP, batched sends, (de)serialization",
         "client + scheduler",
         pick(c, "comm")),
        ("event loop in the scheduler process, other", "client + scheduler",
         pick(c, "event loop", "other", "unattributed", "the benchmark")),
    ]
    total = w["cpu_s"] + c["cpu_s"]
    rows = [f"| {name} | {where} | {secs / children * 1e6:.0f} | {secs / total:.0%} |"
            for name, where, secs in groups]
    rows.append(f"| **all** | | **{total / children * 1e6:.0f}** | 100% |")
    return "\n".join([
        "### Per child task (inline off: every call a task)", "",
        textwrap.fill(
            f"From the py-spy profile of {d['repeat']} runs of fib({d['n']}) with "
            f"`coro.inline.enabled` off ({children} child tasks, {d['wall']:.2f} s wall: "
            f"{d['wall'] / children * 1e6:.0f} us of wall time per child on 2 cores): CPU time "
            "per child task, by where it went.", 79), "",
        "| where | process | us of CPU per child | share |", "|---|---|---|---|", *rows])


def _inline_summary(inl: dict, tasks: dict | None) -> str:
    per = inl["per_call_us"] * 1000  # ns
    seq = inl["seq_s"] / inl["calls"] * 1e9
    floor = inl["floor_s"] / inl["calls"] * 1e9
    lines = ["### Per inline call (inline on, the default)", ""]
    text = (f"fib({inl['n']}) run by `dask_coro.core.engine.Trampoline` in one process, as a "
            f"worker runs it inline: {per:.0f} ns per call, {inl['tramp_s'] / inl['seq_s']:.0f} x "
            f"sequential Python's {seq:.0f} ns; the least a generator trampoline does in "
            f"CPython takes {floor:.0f} ns ({inl['floor_s'] / inl['seq_s']:.0f} x).")
    if tasks and "buckets" in tasks:
        w = tasks["buckets"]["workers (both)"]["cpu_s"]
        c = tasks["buckets"]["client + scheduler"]["cpu_s"]
        per_task = (w + c) / tasks["children"] * 1e9
        text += (f" A child task costs {per_task / 1000:.0f} us of CPU (above), "
                 f"{per_task / per:,.0f} x an inline call.")
    lines.append(textwrap.fill(text, 79, break_on_hyphens=False))
    b = inl.get("buckets")
    if b:
        names = {
            "call": "making the call: `fib(i - 1)` -> `CoroutineFunction.__call__` (a "
                    "`CoroutineCall`, its slots, the plain-arguments check)",
            "body": "the body's own code between yields (fib's test, the yielded list, `a + b`)",
            "start": "starting a body: calling the generator function (creates the generator)",
            "send": "generator send: the trampoline resuming a body",
            "return": "a body's return: `StopIteration` raised, caught, its value taken",
            "tramp": "trampoline bookkeeping: the stack, a `Frame` per body that yields, "
                     "results (recorded by the engine itself)",
            "slots": "reading and writing the call objects' slots in the trampoline (each "
                     "read goes through `Delayed.__getattr__`'s slow attribute path)",
            "other": "other",
        }
        rows = [f"| {names.get(k, k)} | {v * per:.0f} | {v:.0%} |" for k, v in b.items()]
        rows.append(f"| **all** | **{per:.0f}** | 100% |")
        lines += ["", "| where (py-spy, innermost frame) | ns per inline call | share |",
                  "|---|---|---|", *rows]
    return "\n".join(lines)


def _floors(d) -> str:
    """distributed's own memory per waiting task, from the suspended_floor run."""
    summ = (d or {}).get("summary", {})
    parts = [f"{summ[a]['bytes_each'] / 1024:.1f} KiB {what}"
             for a, what in (("floor", "with the same child future"), ("bare", "with no child"))
             if a in summ]
    if not parts:
        return ""
    return (". distributed alone, a seceded async task waiting (no dask_coro): "
            + ", ".join(parts))


def _yes(ok: bool) -> str:
    return "**yes**" if ok else "**no**"


def _disturbed_note(ran: list[Scenario]) -> str:
    bad = [s.key for s in ran if _disturbed(s.result)]
    if not bad:
        return (f"No scenario had other processes using more than {DISTURBED} cores on "
                "average (and 5 CPU-s): the machine was quiet enough.")
    return (f"**Disturbed** (other processes used more than {DISTURBED} cores on average, "
            "and more than 5 CPU-s): "
            + ", ".join(f"`{k}`" for k in bad) + "; their times are inflated.")


def _tree_hash() -> str:
    """A hash of dask_coro/'s files as measured (the work tree, committed or not)."""
    import hashlib

    h = hashlib.sha1()
    pkg = os.path.join(ROOT, "dask_coro")
    for top, dirs, files in os.walk(pkg):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".py", ".yaml")):
                rel = os.path.relpath(os.path.join(top, name), pkg)
                with open(os.path.join(top, name), "rb") as f:
                    h.update(rel.encode() + b"\0" + f.read())
    return h.hexdigest()[:10]


def _code_version() -> str:
    """The commit of the code measured, and whether dask_coro/ differed from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "dask_coro"], cwd=ROOT,
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (f" with uncommitted changes in dask_coro/ (files hash {_tree_hash()})"
                   if dirty else "")


def _versions() -> str:
    out = []
    for dist in ("dask", "distributed", "ray", "py-spy", "psutil"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out.append(f"{dist} {importlib.metadata.version(dist)}")
    return ", ".join(out)


def document(scenarios: list[Scenario], elapsed: float, argv: list[str],
             code: tuple[str, str]) -> str:
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
processes=True)` (the CPU-heavy tree also on 1 worker, the stealing scenario on 1 to 8; Ray: `ray.init(num_cpus=2)`),
all alternatives of a scenario in the same run, medians of 3 runs unless a
section says otherwise. dask_coro runs coroutine calls with plain arguments
inline by default (`coro.inline.enabled`, work handed out to idle workers as
tasks when the scheduler pushes idle threads, `coro.inline.stealing`); "inline off" rows run every
coroutine call as a task. The setting is made before each cluster starts
(`dask.config.set` and `DASK_CORO__INLINE__ENABLED`) and checked on every
worker. Other processes on the machine used {other:.0f} CPU-s during the suite
(from /proc/stat, less what the suite's own processes used; each section
gives its share). {_disturbed_note(ran)}

## Targets

{targets(by)}

## Where the time goes per child (summary)

{profile_summary(by)}
"""
    return head + "\n" + "\n".join(section(s) for s in scenarios)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="+", choices=[s.key for s in SCENARIOS],
                   help="run only these scenarios (the others are listed as not run)")
    p.add_argument("--total-budget", type=float, default=1200.0,
                   help="seconds for the whole suite (it takes about 15 minutes on 2 cores)")
    p.add_argument("--output", default=B.RESULTS)
    p.add_argument("--quick", action="store_true",
                   help="every script with its --quick (tiny sizes): a smoke test of the suite")
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    chosen = [s for s in SCENARIOS if not args.only or s.key in args.only]
    if args.quick:
        for s in chosen:
            s.args = [*s.quick, "--quick"]
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
    with open(args.output + ".runs.json", "w") as f:  # kept if rendering fails
        json.dump({s.key: s.result for s in chosen}, f, default=str)
    text = document(chosen, elapsed, argv, (code_start, _code_version()))
    os.remove(args.output + ".runs.json")
    with open(args.output, "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(args.output)} after {elapsed / 60:.1f} minutes", file=sys.stderr)
    return 0 if all(s.result.get("status") == "ok" for s in chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
