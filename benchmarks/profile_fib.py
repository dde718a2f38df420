"""Where the time goes per child of dask_coro's fib(n): per child task (inline off) from py-spy
samples of both worker processes and of the client process (which runs the LocalCluster
scheduler), in driver, plan, submission, scheduler, transfer and event-loop buckets; per inline
call from timings and py-spy samples of dask_coro.core.engine.Trampoline running fib(--inline-n)
in one process, against sequential Python.

Run: python benchmarks/profile_fib.py [--n 14] [--repeat 3] [--rate 250] [--top 12] [--inline-n 22]
                                      [--quick]
     python benchmarks/profile_fib.py --stages [--rev main | --tree DIR] [--rounds 5]
                                      [--inline-n 20]

--stages: nanoseconds per inline call by stage (body and generators, call object, result
delivery, trampoline step, bookkeeping for progress, cancellation and stealing), each the
difference of two timed runs of fib(--inline-n) in one process; no py-spy needed. With --rev,
the same for that git revision (extracted with `git archive` into a temporary directory), the
two trees measured in turn, --rounds times each, in fresh processes: the medians, before and
after.
Needs py-spy (`pip install py-spy`) and the right to attach to a process
(root, or ptrace_scope 0). Tasks: 2 worker processes x 1 thread with
`coro.inline.enabled` off; --repeat runs of fib(n) after a warm-up, in one
recording. Only samples of threads that were busy count, so a bucket's
share of the samples shares out the CPU time the OS counted. Inline: the
trampoline alone (no cluster), timed without a profiler, then sampled by
py-spy in a child process for --inline-seconds.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import types

import _bench as B
import psutil

from dask_coro.examples import fib

# (bucket, regex on one frame "function (file:line)"). "Containing" buckets
# claim a sample when any frame of its stack matches (checked in this order);
# otherwise the innermost frame that matches a "leaf" bucket decides.
WORKER_CONTAINING = [
    ("plan: Structure, classify, plan_yield, result cache",
     r"\(dask_coro/core/(structure|classify|plan|cache)\.py"),
    ("driver: body steps on the thread pool, through the trampoline (incl. Delayed construction)",
     r"\(dask_coro/core/(engine|calls|stealing|counts|greenlets)\.py"),
    ("submission: client.get, graph to futures, pickling the graph",
     r"^(Client\.get|Client\._graph_to_futures|Client\._send_to_scheduler) \("),
    ("runner: handing each step to the thread pool (run_in_executor)", r"^_Run\._in_pool \("),
    ("results back: scheduler reports to the worker's client, client.gather, get_data",
     (r"^(Client\._handle_report|Client\._gather|Client\.gather|gather_from_workers|"
     r"get_data_from_worker|Worker\.get_data|Worker\.gather_dep|_get_data) \(")),
    ("dask_coro lifetimes (hold_segments)", r"\(dask_coro/lifetimes/"),
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
    ("scheduler: other (worker stream handling, heartbeats, bookkeeping)",
     r"\(distributed/scheduler\.py"),
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
            out.append(((tid, name), frames[1:] if m else frames, int(count)))
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
    p = B.parser(__doc__, repeat=None)
    p.add_argument("--n", type=int, default=14)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--repeat", type=int, default=3, help="runs of fib(n) in the one recording")
    p.add_argument("--top", type=int, default=12, help="functions listed per process kind")
    p.add_argument("--keep", help="copy py-spy's raw output files into this directory")
    p.add_argument("--inline-n", type=int, default=22, help="fib(n) run by the trampoline alone")
    p.add_argument("--inline-seconds", type=float, default=4.0, help="s of py-spy sampling of it")
    p.add_argument("--inline-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--stages", action="store_true",
                   help="only the table of ns per inline call by stage (no cluster, no py-spy)")
    p.add_argument("--rev", help="with --stages: also measure this git revision, as 'before'")
    p.add_argument("--tree", help="with --stages: also measure the dask_coro package under "
                   "this directory, as 'before' (instead of --rev)")
    p.add_argument("--rounds", type=int, default=5,
                   help="with --stages: fresh processes per tree, alternating (their median)")
    p.add_argument("--stages-child", help=argparse.SUPPRESS)
    p.add_argument("--driver", choices=sorted(DRIVERS),
                   help="only run fib(--inline-n) by this driver --times times, once first "
                   "(for a count of machine instructions: see RESULTS.md)")
    p.add_argument("--times", type=int, default=1)
    args = B.parse(p, argv, quick={"n": 8, "repeat": 1, "inline_n": 12, "inline_seconds": 1.0,
                                   "top": 5, "rounds": 1})
    if args.inline_child is not None:
        return inline_child(args.inline_child, args.inline_seconds, args.json)
    if args.stages_child:
        return stages_child(args.inline_n, args.stages_child)
    if args.driver:
        fn = DRIVERS[args.driver]
        expect = _fib(args.inline_n)
        for _ in range(args.times + 1):
            assert fn(args.inline_n) == expect
        return 0
    if args.stages:
        text, data = profile_stages(args)
        print(text)
        B.write_json(args.json, data)
        return 0
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        print("py-spy is not installed (`pip install py-spy`): no profile of tasks.")
        print()
        text, inline = profile_inline(None, args)
        print(text)
        B.write_json(args.json, {"skipped": "py-spy not installed", "inline": inline})
        return 0
    tasks = B.fib_calls(args.n)
    children = (tasks - 1) * args.repeat
    with tempfile.TemporaryDirectory() as tmp, B.cluster(inline=False) as client:
        assert client.compute(fib(8)).result() == 21  # warm-up
        pids = sorted(client.run(os.getpid).values())
        targets = {f"worker {i}": pid for i, pid in enumerate(pids)}
        targets["client + scheduler"] = os.getpid()
        spies = {}
        for name, pid in targets.items():
            out = os.path.join(tmp, f"{pid}.txt")
            spies[name] = (out, subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--format", "raw", "--threads", "--gil",
                 "--idle", "--nonblocking",
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
    lines.append(f"### Where the time goes per child task: fib({args.n}), inline off, under py-spy")
    lines.append("")
    lines.append(
        f"fib({args.n}) {args.repeat} times in one recording, `coro.inline.enabled` off (every "
        f"call a task): {tasks} tasks a run, {children} "
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
            f"{t} {v / cpu_s:.0%}" for t, v in per_thread.most_common() if v / cpu_s >= 0.005)
            + ".")
        lines.append("")
        lines.append(f"Innermost Python function of the busy samples, {kind} (top {args.top}, "
                     "share of the CPU):")
        lines.append("")
        lines.append(B.table(["function (file)", "share"],
                             [[f"`{f}`", f"{v / cpu_s:.1%}"] for f, v in fn.most_common(args.top)]))
        lines.append("")
    print("\n".join(lines))
    print(NOTES)
    print()
    text, data["inline"] = profile_inline(spy, args)
    print(text)
    B.write_json(args.json, data)
    return 0


# -- the inline path ----------------------------------------------------------


def _tramp_fib(n: int, count: bool = False) -> int:
    """fib(n) through the trampoline, as a worker runs it inline (no cluster:
    nothing is ever handed out); ``count``: counting the calls per function,
    as a worker does for progress and tree (``coro.tree.enabled``)."""
    from dask_coro.core.engine import Done
    from dask_coro.runtime.call import trampoline

    out = trampoline("fib", inline=True, count=count).start(fib.__wrapped__, (n,), {})
    assert type(out) is Done
    return out.step.value


def _make_calls(k: int, f=fib) -> None:
    """k coroutine calls made and dropped (f=None: the loop alone)."""
    if f is None:
        for _ in range(k):
            pass
        return
    for _ in range(k):
        f(3)


def _floor_body(i):
    if i < 2:
        return i
    a, b = yield [(_floor_body, (i - 1,)), (_floor_body, (i - 2,))]
    return a + b


def _floor_run(func, args):
    """The least a generator trampoline does in CPython: calls are (func, args)
    tuples, a stack of [generator, leaves, results, next]; no dask_coro object.
    The floor for fine-grained recursion written as generators."""
    gen_type = types.GeneratorType
    out = func(*args)
    if type(out) is not gen_type:
        return out
    try:
        y = out.send(None)
    except StopIteration as stop:
        return stop.value
    stack = [[out, y, [], 0]]
    while True:
        top = stack[-1]
        leaves, results, i = top[1], top[2], top[3]
        if i < len(leaves):
            top[3] = i + 1
            f, a = leaves[i]
            o = f(*a)
            if type(o) is gen_type:
                try:
                    y = o.send(None)
                except StopIteration as stop:
                    results.append(stop.value)
                    continue
                stack.append([o, y, [], 0])
                continue
            results.append(o)
            continue
        try:
            y = top[0].send(results)
        except StopIteration as stop:
            stack.pop()
            if not stack:
                return stop.value
            stack[-1][2].append(stop.value)
            continue
        top[1], top[2], top[3] = y, [], 0


def _floor_calls(func, args, deliver: bool = False):
    """``_floor_run`` driving ``@coroutine`` calls as the engine reads them (the
    ``InlineCall`` protocol: ``__dask_coro_inline__``, ``__dask_coro_args__``),
    made by the real body (``fib.__wrapped__``); with ``deliver``, each value
    is also kept on its call, as the engine does (``__dask_coro_value__``)."""
    gen_type = types.GeneratorType
    out = func(*args)
    try:
        y = out.send(None)
    except StopIteration as stop:
        return stop.value
    stack = [[out, y, [], 0]]
    while True:
        top = stack[-1]
        leaves, results, i = top[1], top[2], top[3]
        if i < len(leaves):
            top[3] = i + 1
            leaf = leaves[i]
            o = leaf.__dask_coro_inline__(*leaf.__dask_coro_args__)
            if type(o) is gen_type:
                try:
                    y = o.send(None)
                except StopIteration as stop:
                    results.append(stop.value)
                    if deliver:
                        leaf.__dask_coro_value__ = stop.value
                        leaf.__dask_coro_inline__ = None
                    continue
                stack.append([o, y, [], 0])
                continue
            results.append(o)
            continue
        try:
            y = top[0].send(results)
        except StopIteration as stop:
            stack.pop()
            if not stack:
                return stop.value
            up = stack[-1]
            up[2].append(stop.value)
            if deliver:
                leaf = up[1][up[3] - 1]
                leaf.__dask_coro_value__ = stop.value
                leaf.__dask_coro_inline__ = None
            continue
        top[1], top[2], top[3] = y, [], 0


def _worker_fib(n: int) -> int:
    """fib(n) through the trampoline wired as a worker's runner wires it for
    a run (``runtime.worker``): counting calls per function for progress and
    tree, asking a cancelled() callback every check_every calls, reading
    an ``Idle`` the scheduler's pushes set (0 here: nothing handed out)."""
    from dask_coro.core.engine import Done, Idle
    from dask_coro.runtime.call import trampoline

    tramp = trampoline("fib", inline=True, count=True, idle=Idle(0), cancelled=lambda: False)
    out = tramp.start(fib.__wrapped__, (n,), {})
    assert type(out) is Done
    return out.step.value


# (row, how it is measured): each stage is the difference of two timings.
STAGES = [
    ("body and generators: fib's body with `(func, args)` tuples for calls, driven by the "
     "least generator trampoline (`_floor_run`)", "floor"),
    ("call object: the body makes `@coroutine` calls (`fib(i - 1)`), the driver reads their "
     "`__dask_coro_inline__` and `__dask_coro_args__` (`_floor_calls` less the floor)", "call"),
    ("result delivery: each value also kept on its call (`__dask_coro_value__`), as the engine "
     "keeps it (`_floor_calls(deliver=True)` less the above)", "deliver"),
    ("trampoline step: `Trampoline` itself (stack, `Frame`s, yield checks, annotations, the "
     "per-call stop and idle reads) less the driver above", "step"),
    ("bookkeeping for progress, cancellation and stealing as a worker wires the run "
     "(`count=True`, a `cancelled()` callback, an `Idle`) less the bare `Trampoline`",
     "bookkeeping"),
]


DRIVERS = {
    "seq": lambda n: _fib(n),
    "floor": lambda n: _floor_run(_floor_body, (n,)),
    "calls": lambda n: _floor_calls(fib.__wrapped__, (n,)),
    "deliver": lambda n: _floor_calls(fib.__wrapped__, (n,), True),
    "tramp": lambda n: _tramp_fib(n),
    "worker": lambda n: _worker_fib(n),
}


def stages_child(n: int, path: str) -> int:
    """Times fib(n) by each driver in this process; writes ns per call."""
    import dask_coro

    calls = 2 * _fib(n + 1) - 1
    expect = _fib(n)
    body = fib.__wrapped__
    assert _floor_run(_floor_body, (n,)) == expect
    assert _floor_calls(body, (n,)) == expect
    assert _floor_calls(body, (n,), True) == expect
    assert _tramp_fib(n) == expect and _worker_fib(n) == expect
    runs = {k: functools.partial(fn, n) for k, fn in DRIVERS.items()}
    # Interleaved, the best of 9 each: the machine's load varies less
    # between neighbouring runs than over the whole measurement.
    best = {k: float("inf") for k in runs}
    for _ in range(9):
        for k, fn in runs.items():
            best[k] = min(best[k], B.timed(fn)[0])
    ns = {k: v / calls * 1e9 for k, v in best.items()}
    B.write_json(path, {"n": n, "calls": calls, "ns": ns, "package": dask_coro.__file__})
    return 0


def _stage_rows(ns: dict[str, float]) -> dict[str, float]:
    return {
        "floor": ns["floor"],
        "call": ns["calls"] - ns["floor"],
        "deliver": ns["deliver"] - ns["calls"],
        "step": ns["tramp"] - ns["deliver"],
        "bookkeeping": ns["worker"] - ns["tramp"],
        "tramp": ns["tramp"],
        "worker": ns["worker"],
        "seq": ns["seq"],
    }


def profile_stages(args) -> tuple[str, dict]:
    """The stage table: this tree (and --rev's) in fresh processes, in turn."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"after": here}
    with tempfile.TemporaryDirectory() as tmp:
        if args.tree:
            rev = os.path.basename(os.path.abspath(args.tree))
            trees = {"before": os.path.abspath(args.tree), "after": here}
        elif args.rev:
            before = os.path.join(tmp, "before")
            os.mkdir(before)
            rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=here,
                                 capture_output=True, text=True, check=True).stdout.strip()
            archive = subprocess.run(["git", "archive", args.rev, "dask_coro"], cwd=here,
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
            trees = {"before": before, "after": here}
        got: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
        for r in range(args.rounds):
            # A B, then B A: neither tree always runs right after the other.
            order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
            for name, root in order:
                out = os.path.join(tmp, f"{name}-{r}.json")
                env = dict(os.environ, PYTHONPATH=root)
                subprocess.run([sys.executable, os.path.abspath(__file__), "--stages-child", out,
                                "--inline-n", str(args.inline_n)], env=env, check=True,
                               cwd=here)
                with open(out) as f:
                    child = json.load(f)
                assert child["package"].startswith(root), child["package"]
                got[name].append(_stage_rows(child["ns"]))
    med = {name: {k: B.median(r[k] for r in rows) for k in rows[0]} for name, rows in got.items()}
    n = args.inline_n
    cols = list(trees)
    head = [f"ns per inline call, fib({n}) in one process"] + [
        (f"before ({rev})" if c == "before" else "this tree") for c in cols]
    compare = len(cols) > 1
    if compare:
        head.append("change")

    def row(label: str, key: str, bold: bool = False) -> list[str]:
        cells = [label] + [f"{med[c][key]:.0f}" for c in cols]
        if compare:
            cells.append(f"{med['after'][key] - med['before'][key]:+.0f}")
        if bold:
            cells = [f"**{x}**" for x in cells]
        return cells

    rows = [row(label, key) for label, key in STAGES]
    rows.append(row("all, as a worker runs it (the sum of the above)", "worker", bold=True))
    rows.append(row("the bare `Trampoline` (no counting, no callback)", "tramp"))
    rows.append(row("sequential Python (`def fib`)", "seq"))
    for c in cols:
        med[c]["x_seq"] = med[c]["worker"] / med[c]["seq"]
    rows.append(["as a worker / sequential"] + [f"{med[c]['x_seq']:.1f} x" for c in cols]
                + ([""] if compare else []))
    text = "\n".join([
        f"### An inline call by stage: fib({n}) ({2 * _fib(n + 1) - 1} calls) in one process",
        "",
        B.table(head, rows),
        "",
        B.fill(
            f"Each figure is the median over {args.rounds} fresh processes per tree"
            + (", the two trees in turn (A B, B A, ...)" if compare else "")
            + f"; in each process every driver runs fib({n}) 9 times, interleaved, and the "
            "fastest run counts. A stage is the difference between two drivers that differ "
            "by it alone, so a small stage is rough (noise of a few ns)."),
    ])
    return text, {"n": n, "rev": args.rev, "tree": args.tree, "rounds": args.rounds, "median": med, "runs": got}


def inline_child(n: int, seconds: float, path: str) -> int:
    """Runs fib(n) through the trampoline for ``seconds`` (under py-spy)."""
    expect, runs, start = _fib(n), 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        assert _tramp_fib(n) == expect
        runs += 1
    B.write_json(path, {"runs": runs, "wall": time.perf_counter() - start})
    return 0


def _best(fn, k: int = 7) -> float:
    """Median of k timed calls (one untimed first)."""
    return B.median_of(fn, k, warm=True)[0]


ENGINE = "dask_coro/core/engine.py"  # the trampoline: Trampoline._steps steps every body

# Innermost frame -> bucket. Lines of Trampoline._steps are told apart by their
# source text: the generator sends (``method(arg)``, the one place a body is
# stepped), the StopIteration of a body that returns,
# the call of the body function (which creates the generator), the rest.
INLINE_BUCKETS = [
    (("making each call: `fib(i - 1)` is `CoroutineFunction.__call__` (a `CoroutineCall`, its "
      "slots, the plain-arguments check)"), "call"),
    (("the body's own code: fib's generator between yields (the test, building the yielded "
      "list, `a + b`)"), "body"),
    ("starting a body: `func(*args)` in the trampoline creates the generator", "start"),
    ("generator send: the trampoline resuming a body (`send`)", "send"),
    ("a body's return: its `StopIteration` raised, caught and its value taken", "return"),
    (("reading and writing the call objects' slots in the trampoline (each read goes "
      "through `Delayed.__getattr__`'s slow attribute path)"), "slots"),
    (("trampoline bookkeeping: the stack, a `Frame` per body that yields, results (the "
      "engine records an inline call's result itself)"), "tramp"),
    ("the benchmark's own loop, other", "other"),
]


def _inline_bucket(frame: str) -> str:
    import linecache

    m = re.match(r"^(\S+) \((.+):(\d+)\)$", frame)
    if not m:
        return "other"
    func, path, line = m.group(1), m.group(2), int(m.group(3))
    if path.endswith("dask_coro/runtime/call.py"):
        return "call"
    if path.endswith("dask_coro/examples.py") and func == "fib":
        return "body"
    if path.endswith(ENGINE):
        if func in ("Trampoline._steps", "_steps"):
            import dask_coro.core.engine as engine

            src = linecache.getline(engine.__file__, line)
            if ".send(" in src or "method(arg)" in src:  # a body's send (or throw)
                return "send"
            if "StopIteration" in src or "stop.value" in src:
                return "return"
            if "func(*args" in src:
                return "start"
            if "__dask_coro_" in src:  # a slot of a CoroutineCall (Delayed's __getattr__)
                return "slots"
        return "tramp"
    return "other"


def profile_inline(spy: str | None, args) -> tuple[str, dict]:
    """Timings of fib(--inline-n) run inline by the trampoline against
    sequential Python, and (with py-spy) where the time of an inline call goes."""
    n = args.inline_n
    calls = 2 * _fib(n + 1) - 1
    frames = _fib(n + 1) - 1  # calls that yield (i >= 2): a Frame each
    seq = _best(lambda: _fib(n), 15)
    tramp = _best(lambda: _tramp_fib(n))
    counted = _best(lambda: _tramp_fib(n, count=True))
    floor = _best(lambda: _floor_run(_floor_body, (n,)))
    make = _best(lambda: _make_calls(calls)) - _best(lambda: _make_calls(calls, None))
    per = tramp / calls
    data = {"n": n, "calls": calls, "frames": frames, "seq_s": seq, "tramp_s": tramp,
            "floor_s": floor, "make_s": make, "per_call_us": per * 1e6, "counted_s": counted,
            "buckets": {}}
    lines = [
        f"### Where the time goes per inline call: fib({n}) run by `Trampoline` in one process",
        "",
        B.table([f"fib({n}): {calls} calls, {frames} of them yield", "wall ms (median)",
                 "per call ns", "/ sequential"], [
            ["sequential Python (`def fib`, plain recursion)", f"{seq * 1000:.1f}",
             f"{seq / calls * 1e9:.0f}", "1"],
            [f"dask_coro: `trampoline(...).start(fib.__wrapped__, ({n},), {{}})`, every call "
             "a `@coroutine` call run inline", f"{tramp * 1000:.1f}", f"{per * 1e9:.0f}",
             f"**{tramp / seq:.1f}**"],
            ["the same, counting the inline calls per function (`count=True`, as a worker does "
             f"for progress and tree): {counted / tramp - 1:+.1%}", f"{counted * 1000:.1f}",
             f"{counted / calls * 1e9:.0f}", f"{counted / seq:.1f}"],
            ["floor: a 30-line generator trampoline, calls as `(func, args)` tuples, no "
             "dask_coro object", f"{floor * 1000:.1f}", f"{floor / calls * 1e9:.0f}",
             f"{floor / seq:.1f}"],
            [f"of which: making the {calls} `CoroutineCall` objects alone (`fib(3)` in a loop, "
             "less the empty loop)", f"{make * 1000:.1f}",
             f"{make / calls * 1e9:.0f}", f"{make / seq:.1f}"],
        ]),
        "",
    ]
    if spy is None:
        lines.append("py-spy is not installed: no breakdown of an inline call.")
        return "\n".join(lines), data
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "inline.txt")
        result = os.path.join(tmp, "inline.json")
        proc = subprocess.run(
            [spy, "record", "--format", "raw", "--rate", str(max(args.rate, 500)), "-o", out,
             "--", sys.executable, os.path.abspath(__file__), "--inline-child", str(n),
             "--inline-seconds", str(args.inline_seconds), "--json", result],
            capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)),
            check=False)
        if proc.returncode != 0 or not os.path.exists(out) or not os.path.exists(result):
            lines.append(f"py-spy failed on the inline run: {proc.stderr[-300:]}")
            return "\n".join(lines), data
        with open(result) as f:
            child = json.load(f)
        stacks = read_raw(out)
    by: collections.Counter[str] = collections.Counter()
    lines_: collections.Counter[int] = collections.Counter()
    for _, frames_, k in stacks:
        # Only the timed loop: not the child's imports, nor py-spy's start.
        # The loop runs on a greenlet of its own: its stacks start at _serve.
        if not any(f.startswith(("inline_child ", "_serve (")) for f in frames_):
            continue
        bucket = _inline_bucket(frames_[-1])
        by[bucket] += k
        m = re.match(r"^(Trampoline\.)?_steps \(.*:(\d+)\)$", frames_[-1])
        if m:
            lines_[int(m.group(2))] += k
    total = sum(by.values()) or 1
    rows = []
    for name, key in INLINE_BUCKETS:
        share = by[key] / total
        data["buckets"][key] = share
        rows.append([name, f"{share:.0%}", f"{share * per * 1e9:.0f}"])
    rows.append(["**all** (per call, timed without the profiler)", "100%",
                 f"**{per * 1e9:.0f}**"])
    data["spy_samples"] = total
    data["spy_runs"] = child["runs"]
    import linecache

    import dask_coro.core.engine as engine

    top = [[f"`engine.py:{ln}`", f"`{linecache.getline(engine.__file__, ln).strip()[:80]}`",
            f"{k / total:.1%}", f"{k / total * per * 1e9:.0f}"]
           for ln, k in lines_.most_common(10)]
    data["loop_lines"] = {str(ln): k / total for ln, k in lines_.most_common(20)}
    lines += [
        B.table(["where (innermost Python frame of each py-spy sample)", "share of samples",
                 "ns per call"], rows),
        "",
        "The 10 busiest lines of `Trampoline._steps` (of all samples: "
        f"{sum(lines_.values()) / total:.0%}):",
        "",
        B.table(["line", "source", "share of samples", "ns per call"], top),
        "",
        textwrap.fill(
            f"py-spy sampled a child process running fib({n}) through the trampoline "
            f"{child['runs']} times in {child['wall']:.1f} s ({total} samples at "
            f"{max(args.rate, 500)} Hz in that loop; its imports not counted); each sample "
            "goes to the innermost Python frame, and "
            "the lines of `Trampoline._steps` are told apart by their source (the `send` "
            "lines, the `StopIteration` ones, the one calling the body function). C work "
            "shows under the Python line that asked for it: creating a generator under "
            "`func(*args)`, resuming one under `send` until the body's first line runs. ns "
            "per call = share x the trampoline's time per call measured without the "
            "profiler. The floor row is the same recursion through the least a generator "
            "trampoline can do in CPython: what any coroutine-per-call design pays before "
            "dask_coro adds its call objects and bookkeeping.", 79, break_on_hyphens=False),
    ]
    return "\n".join(lines), data


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


_fib = B.seq_fib


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("profile",
               "Where the time goes per child: fib(14) as tasks under py-spy, fib(22) inline",
               ["--n", "14", "--repeat", "3", "--inline-n", "22"], 120),
]


SUMMARY = "## Where the time goes per child (summary)"


def summarize(data) -> str:
    """run_all.py's summary near the top of RESULTS.md, under ``SUMMARY``: per
    child task (inline off) and per inline call, in the targets' terms."""
    d = data("profile")
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


if __name__ == "__main__":
    sys.exit(main())
