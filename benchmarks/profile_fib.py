"""Where the time goes per child task of dask_coro's fib(n): py-spy samples of both worker processes and of the client process (which runs the LocalCluster scheduler), grouped into driver, plan, submission, scheduler, transfer and event-loop buckets.

Run: python benchmarks/profile_fib.py [--n 14] [--repeat 3] [--rate 250] [--top 12]
Needs py-spy (`pip install py-spy`) and the right to attach to a process
(root, or ptrace_scope 0). 2 worker processes x 1 thread; --repeat runs of
fib(n) after a warm-up, in one recording. Only samples of threads that were busy count (py-spy without
--idle), so a bucket's samples / rate is CPU time, not wall time.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import _bench as B
import psutil

from dask_coro.examples import fib

# (bucket, regex on one frame "function (file:line)"). "Containing" buckets
# claim a sample when any frame of its stack matches (checked in this order);
# otherwise the innermost frame that matches a "leaf" bucket decides.
WORKER_CONTAINING = [
    ("driver: body steps on the thread pool (incl. Delayed construction)", r"\(dask_coro/_driver\.py"),
    ("plan: Structure, classify, plan_yield, result cache", r"\(dask_coro/_(structure|classify|plan|cache)\.py"),
    ("submission: client.get, graph to futures, pickling the graph",
     r"^(Client\.get|Client\._graph_to_futures|Client\._send_to_scheduler) \("),
    ("runner: handing each step to the thread pool (run_in_executor)", r"^_Run\._in_pool \("),
    ("results back: scheduler reports to the worker's client, client.gather, get_data",
     (r"^(Client\._handle_report|Client\._gather|Client\.gather|gather_from_workers|"
     r"get_data_from_worker|Worker\.get_data|Worker\.gather_dep|_get_data) \(")),
    ("dask_coro lifetimes (hold_segments)", r"\(dask_coro/_lifetimes"),
    ("runner: the rest of the per-yield loop (waiting on gather and on cancellation, releases)",
     r"\(dask_coro/"),
]
WORKER_LEAF = [
    ("worker state machine and task bookkeeping",
     r"\(distributed/(worker_state_machine|worker)\.py|^(Client\._|Future\.|FutureState\.)"),
    ("comm: TCP, batched sends, (de)serialization",
     (r"\(distributed/(comm|protocol)/|\(distributed/batched\.py|\(msgpack|\(pickle|\(cloudpickle|"
     r"\(tornado/iostream\.py")),
    ("event loop (asyncio, tornado)", r"\((asyncio|tornado|selectors|concurrent)/|\(selectors\.py"),
]
SCHED_CONTAINING = [
    ("dask_coro scheduler plugins (tree, promises, lifetimes)", r"\(dask_coro/"),
    ("scheduler: update_graph (graph materialization, new task states)",
     r"^Scheduler\.(update_graph|_materialize_graph|_create_taskstate_from_graph)|\(dask/order\.py"),
    ("scheduler: transitions and worker messages (task-finished, long-running)",
     (r"^(Scheduler|SchedulerState)\.(_?transition|stimulus_|handle_task_finished|handle_long_running|"
     r"_transitions|_remove_from_processing|_add_to_processing|decide_worker|handle_release_data)")),
    ("the benchmark's own client (compute, result)", r"^Client\."),
]
SCHED_LEAF = [
    ("scheduler: other (worker stream handling, heartbeats, bookkeeping)", r"\(distributed/scheduler\.py"),
    ("comm: TCP, batched sends, (de)serialization",
     (r"\(distributed/(comm|protocol)/|\(distributed/batched\.py|\(msgpack|\(pickle|\(cloudpickle|"
     r"\(tornado/iostream\.py")),
    ("event loop (asyncio, tornado)", r"\((asyncio|tornado|selectors|concurrent)/|\(selectors\.py"),
]

# A sample whose innermost frame is one of these is a thread waiting (for I/O,
# for work, for a lock), not running: py-spy records it with --idle and we
# drop it here, so the buckets share the CPU time the OS reports.
IDLE = re.compile(
    r"^(EpollSelector\.select|select|Condition\.wait|Event\.wait|_worker|Thread\.join|"
    r"_wait_for_tstate_lock|sleep|SimpleQueue\.get|Queue\.get|Lock\.acquire|Connection\._recv|"
    r"Popen\.poll|Popen\.wait) \("
)

ROLE = {"worker": (WORKER_CONTAINING, WORKER_LEAF), "scheduler": (SCHED_CONTAINING, SCHED_LEAF)}


def classify(frames: list[str], role: str) -> str:
    containing, leaf = ROLE[role]
    for name, rx in containing:
        r = re.compile(rx)
        if any(r.search(f) for f in frames):
            return name
    for f in reversed(frames):
        for name, rx in leaf:
            if re.search(rx, f):
                return name
    return "other"


def read_raw(path: str) -> list[tuple[tuple[int, str], list[str], int]]:
    """py-spy's raw (collapsed) output: ((thread id, name), frames root first, count)."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            m = re.match(r"^thread \((\w+)\):? ?(.*)$", frames[0])
            tid = int(m.group(1), 0) if m else 0
            name = re.sub(r"^\d+-|-\d+(-\d+)?$", "", m.group(2)) if m else "?"
            out.append(((tid, name), frames[1:], int(count)))
    return out


def is_idle(frames: list[str]) -> bool:
    return not frames or bool(IDLE.search(frames[-1]))


def own_time(stacks, top: int) -> list[tuple[str, int]]:
    """Innermost Python function of each sample, summed: where the CPU was."""
    c: collections.Counter[str] = collections.Counter()
    for _, frames, n in stacks:
        if frames:
            c[re.sub(r":\d+\)$", ")", frames[-1])] += n
    return c.most_common(top)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=14)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--repeat", type=int, default=3, help="runs of fib(n) in the one recording")
    p.add_argument("--top", type=int, default=12, help="functions listed per process kind")
    p.add_argument("--keep", help="copy py-spy's raw output files into this directory")
    p.add_argument("--json", help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        print("py-spy is not installed (`pip install py-spy`): no profile.")
        B.write_json(args.json, {"skipped": "py-spy not installed"})
        return 0
    tasks = 2 * _fib(args.n + 1) - 1
    children = (tasks - 1) * args.repeat
    with tempfile.TemporaryDirectory() as tmp, B.cluster() as client:
        assert client.compute(fib(8)).result() == 21  # warm-up
        targets = {f"worker {i}": pid for i, pid in enumerate(sorted(client.run(os.getpid).values()))}
        targets["client + scheduler"] = os.getpid()
        spies = {}
        for name, pid in targets.items():
            out = os.path.join(tmp, f"{pid}.txt")
            spies[name] = (out, subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--format", "raw", "--threads", "--gil", "--idle",
                 "--nonblocking",
                 "--rate", str(args.rate), "-o", out],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        time.sleep(2)  # py-spy attaches
        for name, (_, proc) in spies.items():
            if proc.poll() is not None:
                print(f"py-spy could not attach to the {name} process: {proc.stderr.read()[-300:]}")
                B.write_json(args.json, {"skipped": "py-spy could not attach"})
                return 0
        procs = {name: psutil.Process(pid) for name, pid in targets.items()}
        cpu0 = {name: _thread_cpu(p) for name, p in procs.items()}
        walls = []
        for _ in range(args.repeat):
            wall, value = B.timed(lambda: client.compute(fib(args.n)).result())
            assert value == _fib(args.n)
            walls.append(wall)
        wall = sum(walls)
        cpu1 = {name: _thread_cpu(p) for name, p in procs.items()}
        # CPU seconds per thread id during the run, from the OS
        tcpu = {name: {t: c - cpu0[name].get(t, 0.0) for t, c in cpu1[name].items()}
                for name in procs}
        cpu = {name: sum(v.values()) for name, v in tcpu.items()}
        assert value == _fib(args.n)
        time.sleep(0.3)
        for _, proc in spies.values():
            proc.send_signal(signal.SIGINT)
        for _, proc in spies.values():
            proc.wait(timeout=60)
        stacks = {name: read_raw(out) for name, (out, _) in spies.items()}
        if args.keep:
            for name, (out, _) in spies.items():
                shutil.copy(out, os.path.join(args.keep, name.replace(" ", "_") + ".txt"))

    lines, data = [], {"n": args.n, "tasks": tasks, "repeat": args.repeat, "children": children,
                       "wall": wall, "walls": walls, "rate": args.rate, "cpu": cpu, "buckets": {}}
    lines.append(
        f"fib({args.n}) {args.repeat} times in one recording: {tasks} tasks a run, {children} "
        f"child tasks in all, {wall:.2f} s wall ({B.runs(walls)}) while sampled (py-spy at "
        f"{args.rate} Hz). CPU used meanwhile (psutil): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in cpu.items()) + ".")
    lines.append("")
    rows = []
    kinds = (("workers (both)", "worker", [k for k in stacks if k.startswith("worker")]),
             ("client + scheduler", "scheduler", ["client + scheduler"]))
    tops = {}
    for kind, role, names in kinds:
        # Each thread's OS CPU time is shared out by its own busy samples.
        by: collections.Counter[str] = collections.Counter()
        per_thread: collections.Counter[str] = collections.Counter()
        fn: collections.Counter[str] = collections.Counter()
        for k in names:
            busy: dict[int, list] = collections.defaultdict(list)
            tname: dict[int, str] = {}
            for (tid, name), frames, n in stacks[k]:
                tname[tid] = name
                if not is_idle(frames):
                    busy[tid].append((frames, n))
            for tid, secs in tcpu[k].items():
                name = tname.get(tid, "a thread py-spy did not see")
                per_thread[name] += secs
                total = sum(n for _, n in busy.get(tid, ()))
                if not total:
                    by[f"unattributed (no busy sample): {name}"] += secs
                    continue
                for frames, n in busy[tid]:
                    by[classify(frames, role)] += secs * n / total
                    fn[re.sub(r":\d+\)$", ")", frames[-1])] += secs * n / total
        cpu_s = sum(cpu[k] for k in names)
        data["buckets"][kind] = {"cpu_s": cpu_s, "by": dict(by), "threads": dict(per_thread)}
        tops[kind] = (cpu_s, per_thread, fn)
        for bucket, secs in by.most_common():
            if secs < 0.005:
                continue
            rows.append([kind, bucket, f"{secs / cpu_s:.0%}", f"{secs:.2f}",
                         f"{secs / children * 1e6:.0f}"])
        rows.append([kind, "**all**", "100%", f"{cpu_s:.2f}", f"**{cpu_s / children * 1e6:.0f}**"])
    lines.append(B.table(["process", "bucket", "share of CPU", "CPU s", "us of CPU per child"],
                         rows))
    lines.append("")
    for kind, (cpu_s, per_thread, fn) in tops.items():
        lines.append(f"CPU by thread, {kind}: " + ", ".join(
            f"{t} {v / cpu_s:.0%}" for t, v in per_thread.most_common() if v / cpu_s >= 0.005) + ".")
        lines.append("")
        lines.append(f"Innermost Python function of the busy samples, {kind} (top {args.top}, "
                     "share of the CPU):")
        lines.append("")
        lines.append(B.table(["function (file)", "share"],
                             [[f"`{f}`", f"{v / cpu_s:.1%}"] for f, v in fn.most_common(args.top)]))
        lines.append("")
    print("\n".join(lines))
    print(NOTES)
    B.write_json(args.json, data)
    return 0


NOTES = """\
How: `py-spy record --format raw --threads --idle --nonblocking` attached to
both worker processes and to the client process (with an embedded
LocalCluster the scheduler runs on the client's event-loop thread, "IO
loop") over consecutive runs of fib(n) after a warm-up. Samples whose innermost frame is a
wait (`select`, `Condition.wait`, a thread pool waiting for work, ...) are
dropped as idle; each busy sample goes to the first bucket one of whose
patterns matches any frame of its stack (driver, plan, submission, transfer;
on the scheduler dask_coro's plugins, update_graph, transitions), else to the
bucket of its innermost frame that matches (runner, state machine, comm,
event loop). The CPU time the OS counted for each thread during the run
(psutil `threads()`, user + system) is shared out among its own busy samples,
so the buckets add up to what the processes really used; per child = CPU /
number of child tasks. Sampling without pausing
the processes (`--nonblocking`) may catch a stack mid-change, and a thread
waiting for the GIL shows where it waits, so small buckets are rough. The
three processes and the samplers share 2 cores."""


def _thread_cpu(p: psutil.Process) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in p.threads()}


def _fib(i: int) -> int:
    return i if i < 2 else _fib(i - 1) + _fib(i - 2)


if __name__ == "__main__":
    sys.exit(main())
