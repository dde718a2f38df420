"""A CPU-heavy binary tree of @coroutine calls (leaves spin a few ms of pure Python) with inline on,
on 1 worker versus 2 workers (the speedup work stealing gives), versus inline off on 2 workers and
sequential Python of the same tree.

Run: python benchmarks/bench_steal.py [--depth 9] [--leaf-ms 4] [--repeat 3] [--quick]
Worker processes x 1 thread each. The leaf's work is a fixed number of loop
iterations, calibrated in this process to --leaf-ms (not a timed spin, which
would finish on time even without a core of its own). Rounds interleave the
alternatives, a fresh cluster for each (warmed up with a depth-2 tree), one
timed run each; medians of --repeat rounds. Prints a Markdown table and notes.
"""

from __future__ import annotations

import sys

import _bench as B

from dask_coro import coroutine

MOD = 1_000_003


def spin(iters):
    """Pure-Python CPU work: holds the GIL, releases nothing."""
    x = 0
    for i in range(iters):
        x = (x + i * i) % MOD
    return x


@coroutine
def tree(depth, iters):
    if depth == 0:
        return spin(iters)
    a, b = yield [tree(depth - 1, iters), tree(depth - 1, iters)]
    return (a + b) % MOD


def seq_tree(depth, iters):
    if depth == 0:
        return spin(iters)
    return (seq_tree(depth - 1, iters) + seq_tree(depth - 1, iters)) % MOD


def calibrate(leaf_ms: float) -> int:
    """Iterations of ``spin`` that take about ``leaf_ms`` here."""
    iters = 10_000
    for _ in range(3):
        took, _ = B.median_of(lambda k=iters: spin(k), 7)
        iters = max(1000, int(iters * leaf_ms / 1000 / took))
    return iters


def run_tree(client, depth, iters):
    return client.compute(tree(depth, iters)).result()


ALTS = {
    "on2": B.Alt("dask_coro, inline on (default), 2 workers", run_tree, True, 2),
    "on1": B.Alt("dask_coro, inline on (default), 1 worker", run_tree, True, 1),
    "off2": B.Alt("dask_coro, inline off (every call a task), 2 workers", run_tree, False, 2),
}


def one_run(alt: str, depth: int, iters: int, expect: int) -> dict:
    a = ALTS[alt]
    with B.cluster(inline=a.inline, n_workers=a.workers) as client:
        assert a.run(client, 2, 10) == seq_tree(2, 10)
        procs = list(B.worker_processes(client).values())
        cpu0 = [sum(p.cpu_times()[:2]) for p in procs]
        B.tasks_done(client, reset=True)
        wall, value = B.timed(lambda: a.run(client, depth, iters))
        cpu = [sum(p.cpu_times()[:2]) - c for p, c in zip(procs, cpu0)]
        assert value == expect, value
        tasks = B.tasks_done(client)
    B.log(f"{alt}: {wall:.2f} s, {tasks} tasks, worker CPU {', '.join(f'{c:.2f}' for c in cpu)} s")
    return {"wall": wall, "tasks": tasks, "cpu": cpu}


def main(argv=None) -> int:
    p = B.parser(__doc__)
    p.add_argument("--depth", type=int, default=9, help="2**depth leaves")
    p.add_argument("--leaf-ms", type=float, default=4.0, help="work of one leaf, ms")
    args = B.parse(p, argv, quick={"depth": 4, "leaf_ms": 1.0, "repeat": 1})
    depth, leaves = args.depth, 2 ** args.depth
    iters = calibrate(args.leaf_ms)
    expect = seq_tree(depth, iters)
    _, seqs = B.median_of(lambda: seq_tree(depth, iters), args.repeat)
    B.log(f"sequential: {B.median(seqs):.2f} s ({iters} iterations a leaf)")
    res: dict[str, list[dict]] = {a: [] for a in ALTS}
    for alt in B.interleaved(ALTS, args.repeat):
        res[alt].append(one_run(alt, depth, iters, expect))
    # sequential again at the end: the machine's speed may have changed meanwhile
    seqs += B.median_of(lambda: seq_tree(depth, iters), args.repeat)[1]
    seq_s = B.median(seqs)
    med = {a: B.median([x["wall"] for x in runs]) for a, runs in res.items()}
    rows = [["sequential Python, one process", *B.wall_cells(seqs), "-", "-",
             "1.00", B.ratio(med["on1"], seq_s)]]
    for alt, a in ALTS.items():
        runs = res[alt]
        cpu = [B.median([x["cpu"][i] for x in runs]) for i in range(len(runs[0]["cpu"]))]
        rows.append([a.label, *B.wall_cells([x["wall"] for x in runs]),
                     B.counts([x["tasks"] for x in runs]),
                     " + ".join(f"{c:.2f}" for c in cpu),
                     B.ratio(med[alt], seq_s), B.ratio(med["on1"], med[alt])])
    speedup = med["on1"] / med["on2"]
    B.report([f"tree of depth {depth}: {leaves} leaves x {args.leaf_ms:g} ms, "
              f"{2 * leaves - 1} calls", *B.wall_header(args.repeat),
              "tasks run per run (counted)", "CPU s of each worker process (median)",
              "/ sequential", "speedup over inline on, 1 worker"], rows, B.fill(
        f"Every call of the tree is a `@coroutine` call (a node yields its two children as "
        f"one list, a leaf runs `spin({iters})`, {seq_s / leaves * 1000:.1f} ms of pure "
        f"Python in this process). With inline on, the root's worker runs the calls inline "
        f"and hands unstarted ones out as tasks while the scheduler reports idle threads "
        f"(pushed by the scheduler, `coro.inline.stealing`): 2 workers are {speedup:.2f} x as fast "
        f"as 1 here. Inline off, each of the {2 * leaves - 1} calls is a task. Wall time: from "
        "`client.compute` to the value on the client. CPU: user + system time of each worker "
        "process during the run (psutil). The 2 cores are shared with the scheduler (in the "
        "client process) and the rest of the machine, so 2.0 x is out of reach."))
    B.write_json(args.json, {"depth": depth, "leaf_ms": args.leaf_ms, "iters": iters,
                             "seq_s": seq_s, "seqs": seqs, "runs": res, "median": med,
                             "speedup": speedup})
    return 0


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("steal", "A CPU-heavy tree of coroutines: 2 workers versus 1 (inline on), inline off, "
               "sequential", ["--depth", "9", "--leaf-ms", "4", "--repeat", "3"],
               150),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("steal")
    if d:
        m = d["median"]
        rows.row("CPU-heavy tree: 2 workers >= 1.6 x faster than 1 (inline on)",
                 f"**{d['speedup']:.2f} x** ({m['on1']:.2f} s on 1 worker, {m['on2']:.2f} s on 2); "
                 f"inline off on 2 workers {m['off2']:.2f} s; sequential Python {d['seq_s']:.2f} s",
                 B.yes(d["speedup"] >= 1.6))
    else:
        rows.missing("CPU-heavy tree: 2 workers >= 1.6 x faster than 1")
    return rows


if __name__ == "__main__":
    sys.exit(main())
