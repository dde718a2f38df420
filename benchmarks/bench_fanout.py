"""One coroutine yielding 10,000 children at once (dask.delayed children; @coroutine children with
inline on and with inline off) versus client.map of the same 10,000 from the client, wall time until
the sum is on the client.

Run: python benchmarks/bench_fanout.py [--n 10000] [--repeat 3] [--alt map delayed inline tasks]
     [--quick]
2 worker processes x 1 thread; a fresh cluster per alternative (with
`coro.inline.enabled` set before it starts), warmed up with n = 100, then
--repeat timed runs. Prints a Markdown table and notes.
"""

from __future__ import annotations

import sys

import _bench as B
import dask

from dask_coro import coroutine


def inc(x):
    return x + 1


@coroutine
def fan_delayed(n):
    """Children are dask.delayed calls: plain tasks on the workers' thread pools."""
    results = yield [dask.delayed(inc)(i) for i in range(n)]
    return sum(results)


coro_inc = coroutine(inc, name="inc")


@coroutine
def fan_coro(n):
    """Children are @coroutine plain functions (as examples.inc): async tasks
    that step the body on the thread pool."""
    results = yield [coro_inc(i) for i in range(n)]
    return sum(results)


def run_map(client, n):
    futures = client.map(inc, range(n))
    return sum(client.gather(futures))


def run_delayed(client, n):
    return client.compute(fan_delayed(n)).result()


def run_coro(client, n):
    return client.compute(fan_coro(n)).result()


ALTS = {
    "map": B.Alt("client.map from the client, then client.gather", run_map),
    "delayed": B.Alt("dask_coro: one yield of n dask.delayed children (tasks; inline on, the "
                     "default)", run_delayed, True),
    "inline": B.Alt("dask_coro: one yield of n @coroutine children, inline on (default)",
                    run_coro, True),
    "tasks": B.Alt("dask_coro: one yield of n @coroutine children, inline off (tasks)",
                   run_coro, False),
}


def total(n: int) -> int:
    return sum(range(1, n + 1))


def main(argv=None) -> int:
    p = B.parser(__doc__)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--alt", nargs="+", default=list(ALTS), choices=list(ALTS))
    args = B.parse(p, argv, quick={"n": 200, "repeat": 1})
    c = B.compare("fan-out", {alt: ALTS[alt] for alt in args.alt}, args.n, args.repeat, total,
                  100)
    med = c.median
    rows = [[ALTS[alt].label, *B.wall_cells(c.walls[alt]), f"{args.n / med[alt]:.0f}",
             B.counts(c.tasks[alt]), B.ratio(med[alt], med.get("map"))]
            for alt in args.alt]
    B.report([f"n = {args.n}", *B.wall_header(args.repeat), "children/s",
              "tasks run per run (counted)", "/ client.map"], rows, NOTES)
    B.write_json(args.json, {"n": args.n, "walls": c.walls, "median": med,
                             "tasks_run": c.tasks})
    return 0


NOTES = """\
Wall time: from submitting to the sum of the n results (`inc(i)` for i < n) on
the client. client.map sends n tasks from the client and gathers n results to
it; the coroutine sends the same n tasks from a worker in one `update-graph`
message (its keys derived from its own), gathers the n results on its worker
and returns their sum. `@coroutine` children (plain functions, as
`examples.inc`) with plain arguments run inline by default: the parent's
thread-pool step calls them one after the other, and hands some out as tasks
when the scheduler reports an idle thread (the other worker); "tasks run"
counts transitions to memory on the scheduler, the root included. Inline off,
each is dask_coro's task wrapper (an async task whose body steps on the thread
pool): the cost of writing children as coroutine functions, as the README's
examples do, when every call is a task."""


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("fanout", "One yield of 10,000 children versus client.map of the same 10,000",
               ["--n", "10000", "--repeat", "3", "--alt", "map", "inline", "tasks"], 300,
               quick=["--alt", "map", "inline", "tasks"],
               notes="`dask.delayed` children (`--alt delayed`, tasks with inline on or off) "
                     "are left out of the suite to keep it within 15 minutes; earlier suites "
                     "measured them at 1.05-1.08 x client.map."),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("fanout")
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
        rows.row("one yield of 10,000 children <= 1.2 x client.map (met: every row whose children "
                 "are tasks)", "; ".join(parts), B.yes(worst is not None and worst <= 1.2))
    else:
        rows.missing("one yield of 10,000 children <= 1.2 x client.map")
    return rows


if __name__ == "__main__":
    sys.exit(main())
