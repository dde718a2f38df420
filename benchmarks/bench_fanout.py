"""One coroutine yielding 10,000 children at once versus client.map of the same 10,000 from the client, wall time until the sum is on the client.

Run: python benchmarks/bench_fanout.py [--n 10000] [--repeat 3]
2 worker processes x 1 thread; a fresh cluster per alternative, warmed up with
n = 100, then --repeat timed runs. Prints a Markdown table and notes.
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


ALTS = {
    "map": ("client.map from the client, then client.gather", run_map),
    "delayed": ("dask_coro: one yield of n dask.delayed children",
                lambda c, n: c.compute(fan_delayed(n)).result()),
    "coro": ("dask_coro: one yield of n @coroutine children",
             lambda c, n: c.compute(fan_coro(n)).result()),
}


def measure(alt: str, n: int, repeat: int) -> list[float]:
    fn = ALTS[alt][1]
    with B.cluster() as client:
        assert fn(client, 100) == sum(range(1, 101))
        walls = []
        for _ in range(repeat):
            wall, total = B.timed(lambda: fn(client, n))
            assert total == sum(range(1, n + 1)), total
            walls.append(wall)
            B.log(f"fan-out {n} {alt}: {wall:.2f} s")
    return walls


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    res = {alt: measure(alt, args.n, args.repeat) for alt in ALTS}
    med = {alt: B.median(w) for alt, w in res.items()}
    rows = [[label, B.fmt_s(med[alt]), B.runs(res[alt]), f"{args.n / med[alt]:.0f}",
             B.ratio(med[alt], med["map"])] for alt, (label, _) in ALTS.items()]
    print(B.table([f"n = {args.n}", f"wall s, median of {args.repeat}", "runs s",
                   "children/s", "/ client.map"], rows))
    print()
    print("""\
Wall time: from submitting to the sum of the n results (`inc(i)` for i < n) on
the client. client.map sends n tasks from the client and gathers n results to
it; the coroutine sends the same n tasks from a worker in one `update-graph`
message (its keys derived from its own), gathers the n results on its worker
and returns their sum. The `@coroutine` row gives each child dask_coro's
task wrapper (an async task whose body steps on the thread pool): the cost of
writing children as coroutine functions, as the README's examples do.""")
    B.write_json(args.json, {"n": args.n, "walls": res, "median": med})
    return 0


if __name__ == "__main__":
    sys.exit(main())
