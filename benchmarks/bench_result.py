"""Waiting from plain code: fib(n) written with `dask_coro.result()` in a plain helper versus the
generator version versus sequential Python (inline on), and the per-wait latency of a task child,
`result()` from a helper versus `yield`, versus a worker_client loop.

Run: python benchmarks/bench_result.py [--n 22] [--waits 300] [--repeat 3] [--quick]
fib: --repeat runs of each version on one cluster (2 worker processes x 1 thread, inline on),
and the same two through the engine in this process (sync scheduler, nothing handed out);
sequential Python: median of --repeat x 5 runs here. Per wait: a loop of --waits sequential
waits on one task child each (`@coroutine(inline=False)`), inline on, --repeat timed loops.
"""

from __future__ import annotations

import sys

import _bench as B
from bench_yield_loop import wc_loop  # the same worker_client loop

from dask_coro import coroutine, result
from dask_coro.examples import fib as gen_fib


@coroutine
def rfib(i):
    """fib written with result() in a plain helper: no yield anywhere."""
    if i < 2:
        return i
    return _both(i)


def _both(i):
    a, b = result([rfib(i - 1), rfib(i - 2)])
    return a + b


@coroutine(inline=False)
def inc_task(x):
    return x + 1


@coroutine
def yield_loop(n):
    total = 0
    for i in range(n):
        total += yield inc_task(i)
    return total


@coroutine
def result_loop(n):
    return _result_loop(n)


def _result_loop(n):
    total = 0
    for i in range(n):
        total += _one(i)  # two plain frames deep
    return total


def _one(i):
    return result(inc_task(i))


def _local(fn, n):
    return fn(n).compute(scheduler="sync")


def main(argv=None) -> int:
    p = B.parser(__doc__)
    p.add_argument("--n", type=int, default=22)
    p.add_argument("--waits", type=int, default=300)
    args = B.parse(p, argv, quick={"n": 12, "waits": 20, "repeat": 1})
    n, waits, repeat = args.n, args.waits, args.repeat
    expect = B.seq_fib(n)
    seq_s, _ = B.median_of(lambda: B.seq_fib(n), repeat * 5, warm=True)

    fib_walls = {}
    wait_walls = {}
    with B.cluster(inline=True) as client:
        for key, fn in (("gen", gen_fib), ("result", rfib)):
            assert client.compute(fn(8)).result() == 21
            fib_walls[key], _ = B.timed_runs(
                client, lambda fn=fn: client.compute(fn(n)).result(), repeat, expect,
                f"fib({n}) {key}")
        expect_loop = sum(range(1, waits + 1))
        loops = {
            "yield": lambda: client.compute(yield_loop(waits)).result(),
            "result": lambda: client.compute(result_loop(waits)).result(),
            "wc": lambda: client.submit(wc_loop, waits, pure=False).result(),
        }
        for key, run in loops.items():
            run()  # warm
            wait_walls[key], _ = B.timed_runs(client, run, repeat, expect_loop,
                                              f"{waits} waits {key}")
    local = {key: B.median_of(lambda fn=fn: _local(fn, n), repeat, warm=True)
             for key, fn in (("gen", gen_fib), ("result", rfib))}

    calls = B.fib_calls(n)
    med = {k: B.median(w) for k, w in fib_walls.items()}
    rows = [
        [f"sequential Python fib({n})", B.fmt_s(seq_s), "-", "-", "-", 1],
        [f"generator `@coroutine` fib({n}) (`yield [...]`), 2 workers", *B.wall_cells(fib_walls["gen"]),
         f"{med['gen'] / calls * 1e6:.2f}", "1", B.ratio(med["gen"], seq_s)],
        [f"plain `@coroutine` fib({n}), `result([...])` in a helper, 2 workers",
         *B.wall_cells(fib_walls["result"]), f"{med['result'] / calls * 1e6:.2f}",
         B.ratio(med["result"], med["gen"]), B.ratio(med["result"], seq_s)],
        [f"generator fib({n}) in this process (sync scheduler)", *B.wall_cells(local["gen"][1]),
         f"{local['gen'][0] / calls * 1e6:.2f}", "1", B.ratio(local["gen"][0], seq_s)],
        [f"`result()` fib({n}) in this process (sync scheduler)",
         *B.wall_cells(local["result"][1]), f"{local['result'][0] / calls * 1e6:.2f}",
         B.ratio(local["result"][0], local["gen"][0]), B.ratio(local["result"][0], seq_s)],
    ]
    B.report([f"fib({n}), {calls:,} calls, inline on", *B.wall_header(repeat),
              "us a call", "/ generator version (same place)", "/ sequential"], rows, FIB_NOTES)
    print()
    wmed = {k: B.median(w) for k, w in wait_walls.items()}
    labels = {"yield": "`yield inc_task(i)` in the body",
              "result": "`result(inc_task(i))`, two plain frames deep",
              "wc": "worker_client: `submit(inc, i).result()`"}
    wrows = [[labels[k], waits, *B.wall_cells(wait_walls[k]), f"{wmed[k] / waits * 1000:.2f}",
              B.ratio(wmed[k], wmed["yield"])] for k in labels]
    B.report(["sequential waits on one task child", "waits", *B.wall_header(repeat, "total"),
              "ms a wait", "/ yield"], wrows, WAIT_NOTES)
    B.write_json(args.json, {"n": n, "waits": waits, "sequential": seq_s, "fib": fib_walls,
                             "fib_local": {k: v[1] for k, v in local.items()},
                             "waits_walls": wait_walls, "median": med, "wait_median": wmed})
    return 0


FIB_NOTES = """\
Both versions compute the same tree with every call a `@coroutine` call with
plain arguments, so every call runs inline (work is handed to the idle
worker as tasks). The `result()` version has no generator at all: each call
that waits parks its stack in a greenlet (dask_coro/core/engine.py), the loop
goes on in another greenlet from a per-thread pool and hands back when the
children are done. Per call that is a frame made where `result()` was
called, two greenlet switches and one internal exception; a generator
call needs none of these. The in-process rows are the engine alone."""

WAIT_NOTES = """\
Each wait is on one task child (`@coroutine(inline=False)`): one
`update-graph` message, the child run by the scheduler, its result back to
the waiting coroutine's worker. With `result()` the body waits two plain
frames deep: while it waits its stack is parked in a greenlet and the worker
thread is free; every step of a run with a parked body runs on the worker's
lane thread that parked it (a greenlet resumes only on its own thread),
holding a thread of the worker's pool meanwhile."""


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("result", "Waiting from plain code: `result()` in a helper versus `yield`, versus "
               "sequential Python",
               ["--n", "22", "--waits", "300", "--repeat", "3"], 120),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("result")
    if d and "median" in d:
        m, w = d["median"], d["wait_median"]
        r = m["result"] / m["gen"]
        rows.row(f"fib({d['n']}) with `result()` in a plain helper <= 2 x the generator version "
                 "(inline on)",
                 f"**{r:.2f} x** ({m['result'] * 1000:.0f} ms vs {m['gen'] * 1000:.0f} ms, 2 workers)",
                 B.yes(r <= 2))
        rw = w["result"] / w["yield"]
        rows.row("one wait on a task child: `result()` <= 1.1 x `yield`",
                 f"**{rw:.2f} x** ({w['result'] / d['waits'] * 1000:.1f} ms vs "
                 f"{w['yield'] / d['waits'] * 1000:.1f} ms a wait)", B.yes(rw <= 1.1))
    else:
        rows.missing("fib(22) with `result()` in a plain helper <= 2 x the generator version")
    return rows


if __name__ == "__main__":
    sys.exit(main())
