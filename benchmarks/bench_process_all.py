"""process_all as dask/distributed #1663 writes it, over a list of 1,000 (two yields: its length, then every item incremented
and summed) as a dask_coro coroutine, with inline on and off, versus the same steps written with
worker_client(), wall time.

Run: python benchmarks/bench_process_all.py [--n 1000] [--repeat 3] [--quick]
2 worker processes x 1 thread; a fresh cluster per alternative (with
`coro.inline.enabled` set before it starts), warmed up with n = 10, then
--repeat timed runs. Prints a Markdown table and notes.
"""

from __future__ import annotations

import operator
import sys

import _bench as B
import dask
from distributed import worker_client

from dask_coro import coroutine
from dask_coro.examples import inc, my_len  # dask/distributed #1663's, as in examples.process_all


@coroutine
def generate_data(n):
    return list(range(n))  # #1663's returns a list of random length


@coroutine
def process_all(n):
    """dask_coro.examples.process_all (dask/distributed #1663's), word for word but for the
    list's length."""
    L = generate_data(n)  # a lazy call, nothing waits
    n = yield my_len(L)
    processed = [inc(L[i]) for i in range(n)]
    total = yield sum(processed)  # Python's sum of lazy values: a chain of n adds
    return total


@coroutine
def process_all_sum_task(n):
    """The same, summed by one task (dask.delayed(sum)) instead of a chain of adds."""
    L = generate_data(n)
    n = yield my_len(L)
    processed = [inc(L[i]) for i in range(n)]
    total = yield dask.delayed(sum)(processed)
    return total


def _generate(n):
    return list(range(n))


def _inc(x):
    return x + 1


def wc_process_all(n):
    """The same steps as tasks a worker_client submits: generate, len, then per
    item getitem and inc, then one sum task."""
    with worker_client() as c:
        L = c.submit(_generate, n, pure=False)
        k = c.submit(len, L, pure=False).result()
        items = [c.submit(operator.getitem, L, i, pure=False) for i in range(k)]
        processed = [c.submit(_inc, x, pure=False) for x in items]
        return c.submit(sum, processed, pure=False).result()


def run_wc(c, n):
    return c.submit(wc_process_all, n, pure=False).result()


def run_seed(c, n):
    return c.compute(process_all(n)).result()


def run_sum(c, n):
    return c.compute(process_all_sum_task(n)).result()


SEED = "1 + 1 + n getitem + n inc + n add"
IN_PLACE = "1 root; the rest computed in place (inline)"
ONE_SUM = "1 + 1 + n getitem + n inc + 1 sum"
ALTS = {
    "wc": B.Alt("worker_client: submit/result in one task", run_wc),
    "coro": B.Alt("dask_coro: #1663's process_all, inline on (default)", run_seed, True),
    "coro_off": B.Alt("dask_coro: #1663's process_all, inline off", run_seed, False),
    "coro_sum": B.Alt("dask_coro: process_all with `dask.delayed(sum)`, inline on (default)",
                      run_sum, True),
    "coro_sum_off": B.Alt("dask_coro: process_all with `dask.delayed(sum)`, inline off",
                          run_sum, False),
}
SHAPE = {"wc": ONE_SUM, "coro": IN_PLACE, "coro_off": SEED, "coro_sum": ONE_SUM,
         "coro_sum_off": ONE_SUM}


def total(n: int) -> int:
    return sum(range(1, n + 1))


def main(argv=None) -> int:
    p = B.parser(__doc__)
    p.add_argument("--n", type=int, default=1000)
    args = B.parse(p, argv, quick={"n": 50, "repeat": 1})
    c = B.compare("process_all", ALTS, args.n, args.repeat, total, 10)
    med = c.median
    rows = [[a.label, SHAPE[alt], max(c.tasks[alt]), *B.wall_cells(c.walls[alt]),
             B.ratio(med[alt], med["wc"])] for alt, a in ALTS.items()]
    B.report([f"process_all, list of {args.n}", "tasks", "tasks run (counted)",
              *B.wall_header(args.repeat), "/ worker_client"], rows, NOTES)
    B.write_json(args.json, {"n": args.n, "walls": c.walls,
                             "tasks": {a: max(t) for a, t in c.tasks.items()}, "median": med})
    return 0


NOTES = """\
Wall time: from submitting the root to its total on the client. "Tasks run"
counts transitions to memory on the scheduler during one run (the root
included; the worker_client version's `len` and sum are tasks too).
dask/distributed #1663's `yield sum(processed)` is Python's `sum` over lazy
values, a chain of n adds. With inline on (the default) both yields are
computed in place (`core.localize`): `my_len(L)` runs `generate_data` and
`my_len` inline, and `sum(inc(L[i]) ...)` is built on `L`, which the
coroutine now holds, through dask's own cheap operators (getitem, add), so
the coroutine evaluates them and runs the `inc` calls inline (handing some
out as tasks while the other worker is idle). Inline off, every call is a
task: 1 + 1 + n getitem + n inc + n add, the chain of adds each waiting for
the one before. The `dask.delayed(sum)` rows sum in one task, as the
worker_client version does: a plain `dask.delayed` function is never
computed in place (its cost is unknown), so its arguments are tasks too.
Children of a `worker_client` are submitted one `submit` at a time (the
client batches the messages); a coroutine's children of one yield go in one
`update-graph`."""


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("process_all", "process_all as dask/distributed #1663 writes it, over a list of 1,000, versus worker_client",
               ["--n", "1000", "--repeat", "3"], 180),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("process_all")
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
        rows.row("process_all (1,000), as #1663 writes it, <= 0.2 x worker_client",
                 f"**{r:.2f} x** with inline on ({m['coro']:.2f} s vs {m['wc']:.2f} s); "
                 + "; ".join(extra), B.yes(r <= 0.2))
    else:
        rows.missing("process_all (1,000), as #1663 writes it, <= 0.2 x worker_client")
    return rows


if __name__ == "__main__":
    sys.exit(main())
