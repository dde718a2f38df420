"""One coroutine yielding 10,000 children at once (dask.delayed children; @coroutine children with inline on and with inline off) versus client.map of the same 10,000 from the client, wall time until the sum is on the client.

Run: python benchmarks/bench_fanout.py [--n 10000] [--repeat 3] [--alt map delayed inline tasks]
2 worker processes x 1 thread; a fresh cluster per alternative (with
`coro.inline.enabled` set before it starts), warmed up with n = 100, then
--repeat timed runs. Prints a Markdown table and notes.
"""

from __future__ import annotations

import argparse
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


# key: (label, function, coro.inline.enabled on the cluster; None: the default)
ALTS = {
    "map": ("client.map from the client, then client.gather", run_map, None),
    "delayed": ("dask_coro: one yield of n dask.delayed children (tasks; inline on, the default)",
                run_delayed, True),
    "inline": ("dask_coro: one yield of n @coroutine children, inline on (default)", run_coro, True),
    "tasks": ("dask_coro: one yield of n @coroutine children, inline off (tasks)", run_coro, False),
}


def measure(alt: str, n: int, repeat: int) -> tuple[list[float], list[int]]:
    _, fn, inline = ALTS[alt]
    with B.cluster(inline=inline) as client:
        assert fn(client, 100) == sum(range(1, 101))
        walls, ran = [], []
        B.tasks_done(client, reset=True)
        for _ in range(repeat):
            wall, total = B.timed(lambda: fn(client, n))
            assert total == sum(range(1, n + 1)), total
            walls.append(wall)
            ran.append(B.tasks_done(client, reset=True))
            B.log(f"fan-out {n} {alt}: {wall:.3f} s, {ran[-1]} tasks")
    return walls, ran


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--alt", nargs="+", default=list(ALTS), choices=list(ALTS))
    p.add_argument("--json", help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    out = {alt: measure(alt, args.n, args.repeat) for alt in args.alt}
    res = {alt: w for alt, (w, _) in out.items()}
    med = {alt: B.median(w) for alt, w in res.items()}
    rows = [[ALTS[alt][0], B.fmt_s(med[alt]), B.runs(res[alt]), f"{args.n / med[alt]:.0f}",
             "/".join(str(x) for x in out[alt][1]), B.ratio(med[alt], med.get("map"))]
            for alt in args.alt]
    print(B.table([f"n = {args.n}", f"wall s, median of {args.repeat}", "runs s",
                   "children/s", "tasks run per run (counted)", "/ client.map"], rows))
    print()
    print("""\
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
examples do, when every call is a task.""")
    B.write_json(args.json, {"n": args.n, "walls": res, "median": med,
                             "tasks_run": {a: t for a, (_, t) in out.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
