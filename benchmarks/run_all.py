"""Runs every benchmark scenario with its defaults, each in its own process with a time budget,
and writes benchmarks/RESULTS.md: one section per scenario and a table of the targets, measured
against the alternatives of the same run. The scenarios are declared by the scripts themselves
(their SCENARIOS, targets and summarize; MODULES lists the scripts); the sections of RESULTS.md
that no scenario writes (analyses written by hand, a script's own --write) are kept.

Run: python benchmarks/run_all.py [--only fib fanout ...] [--total-budget 2400]
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
import importlib
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
import types

import _bench as B
import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# The scripts run_all.py runs, in this order. Each declares its sections of
# RESULTS.md (SCENARIOS, a list of _bench.Scenario), and may give rows of the
# Targets table (targets(data)) and a summary near the top (SUMMARY, summarize(data)).
# A new scenario: a script with SCENARIOS, and its name here.
MODULES = [
    "bench_fib", "bench_fib_seq", "bench_fib_scaling", "bench_engine", "bench_steal", "bench_scale",
    "profile_fib", "bench_fanout", "bench_process_all", "bench_suspended", "bench_yield_loop",
    "bench_result", "bench_promises", "bench_release", "bench_release_loop",
    "bench_scheduler_cost", "bench_shm", "bench_multihost", "bench_hold", "bench_lend_overhead",
    "bench_collections", "bench_groups", "bench_fairness", "bench_streams", "bench_durable", "bench_chaos",
]

# Scripts in benchmarks/ that MODULES does not list, and why
# (tests/project/test_packaging.py checks that every other bench_*.py and profile_*.py is listed).
NOT_RUN: dict[str, str] = {}


def load() -> tuple[list[types.ModuleType], list[B.Scenario]]:
    """The scripts, imported (this process's environment and path as they were
    before: a script may set them for its worker processes), and their scenarios."""
    env, path = dict(os.environ), list(sys.path)
    try:
        modules = [importlib.import_module(name) for name in MODULES]
    finally:
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
    scenarios = []
    for m in modules:
        for s in m.SCENARIOS:
            s.script = os.path.basename(m.__file__)
            scenarios.append(s)
    return modules, scenarios


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


def run(s: B.Scenario, timeout: float) -> None:
    code = _code_version()  # the tree may change while the suite runs
    cmd = [sys.executable, os.path.join(HERE, s.script), *s.args]
    fd, json_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    if s.json:
        cmd += ["--json", json_path]
    with tempfile.TemporaryFile(mode="w+") as log_f:
        _run(s, cmd, json_path, log_f, timeout)
    s.result["code"] = code


def _run(s: B.Scenario, cmd: list[str], json_path: str, log_f, timeout: float) -> None:
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


def _cmd(s: B.Scenario) -> str:
    return shlex.join(["python", f"benchmarks/{s.script}", *s.args])


def section(s: B.Scenario) -> str:
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


def _data(by: dict[str, B.Scenario], key: str) -> dict | None:
    s = by.get(key)
    return s.result.get("data") if s and s.result else None


def targets(modules: list[types.ModuleType], by: dict[str, B.Scenario]) -> str:
    """The targets, each with its number from this run (every script's
    ``targets``); then the comparisons that have no target."""
    rows = [r for m in modules if hasattr(m, "targets")
            for r in m.targets(lambda key: _data(by, key))]
    rows.sort(key=lambda r: r[0].endswith("(no target)"))  # stable: the scripts' order
    return B.table(["target", "measured", "met?"], rows)


def summaries(modules: list[types.ModuleType], by: dict[str, B.Scenario]) -> str:
    return "\n".join(f"{m.SUMMARY}\n\n{m.summarize(lambda key: _data(by, key))}\n"
                     for m in modules if hasattr(m, "summarize"))


def _disturbed_note(ran: list[B.Scenario]) -> str:
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


def document(modules: list[types.ModuleType], scenarios: list[B.Scenario], elapsed: float,
             argv: list[str], code: tuple[str, str]) -> str:
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

{targets(modules, by)}

{summaries(modules, by)}"""
    return head + "\n" + "\n".join(section(s) for s in scenarios)


def _blocks(text: str) -> list[tuple[str, str]]:
    """(heading, text) of each ``## `` section; the text before the first one
    has the heading ""."""
    parts = ("\n" + text).split("\n## ")
    out = [("", parts[0].lstrip("\n"))]
    for part in parts[1:]:
        out.append(("## " + part.split("\n", 1)[0], "## " + part))
    return out


def write(path: str, text: str) -> None:
    """``text`` into ``path``; where the file is there, each section of
    ``text`` replaces the one of the same heading, in its place, and the
    sections of the file that this run does not write (an analysis written by
    hand, a script's own ``--write``) stay."""
    new = _blocks(text)
    if os.path.exists(path):
        with open(path) as f:
            old = _blocks(f.read())
        fresh = dict(new)
        merged = [(h, fresh.pop(h, t)) for h, t in old]
        merged += [(h, t) for h, t in new if h in fresh]
        new = merged
    with open(path, "w") as f:
        f.write("\n".join(t.rstrip("\n") + "\n" for _, t in new))


def main(argv=None) -> int:
    modules, scenarios = load()
    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="+", choices=[s.key for s in scenarios],
                   help="run only these scenarios (the others are listed as not run)")
    p.add_argument("--total-budget", type=float, default=2400.0,
                   help="seconds for the whole suite (it took about 15 minutes on 2 cores before "
                        "the groups, streams, collections and engine scenarios joined it)")
    p.add_argument("--output", default=B.RESULTS)
    p.add_argument("--quick", action="store_true",
                   help="every script with its --quick (tiny sizes): a smoke test of the suite")
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    chosen = [s for s in scenarios if not args.only or s.key in args.only]
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
    text = document(modules, chosen, elapsed, argv, (code_start, _code_version()))
    write(args.output, text)
    os.remove(args.output + ".runs.json")
    print(f"wrote {os.path.relpath(args.output)} after {elapsed / 60:.1f} minutes", file=sys.stderr)
    return 0 if all(s.result.get("status") == "ok" for s in chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
