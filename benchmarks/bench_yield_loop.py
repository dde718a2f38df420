"""A coroutine looping over N sequential yields of one trivial child: per-yield latency and the most keys alive on the scheduler, versus a worker_client loop of submit().result().

Run: python benchmarks/bench_yield_loop.py [--n 1000] [--repeat 3]
2 worker processes x 1 thread; a fresh cluster per alternative, warmed up with
N = 10, then --repeat timed loops. Prints a Markdown table and notes.
"""

from __future__ import annotations

import argparse
import sys

import _bench as B
import dask
from distributed import SchedulerPlugin, worker_client

from dask_coro import coroutine


def inc(x):
    return x + 1


@coroutine
def loop(n):
    total = 0
    for i in range(n):
        total += yield coroutine(inc)(i)
    return total


@coroutine
def loop_delayed(n):
    total = 0
    for i in range(n):
        total += yield dask.delayed(inc)(i)
    return total


def wc_loop(n):
    total = 0
    with worker_client() as c:
        for i in range(n):
            total += c.submit(inc, i, pure=False).result()
    return total


class MaxTasks(SchedulerPlugin):
    name = "bench-max-tasks"

    def __init__(self):
        self.max = 0

    async def start(self, scheduler):
        self.scheduler = scheduler

    def transition(self, *args, **kwargs):
        self.max = max(self.max, len(self.scheduler.tasks))


def _reset(dask_scheduler):
    dask_scheduler.plugins["bench-max-tasks"].max = 0


def _max(dask_scheduler):
    return dask_scheduler.plugins["bench-max-tasks"].max


ALTS = {
    "coro": ("dask_coro: `yield coroutine(inc)(i)`", lambda c, n: c.compute(loop(n)).result()),
    "delayed": ("dask_coro: `yield dask.delayed(inc)(i)`",
                lambda c, n: c.compute(loop_delayed(n)).result()),
    "wc": ("worker_client: `submit(inc, i).result()`",
           lambda c, n: c.submit(wc_loop, n, pure=False).result()),
}


def measure(alt: str, n: int, repeat: int) -> tuple[list[float], int]:
    fn = ALTS[alt][1]
    with B.cluster() as client:
        client.register_plugin(MaxTasks())
        assert fn(client, 10) == sum(range(1, 11))
        walls, most = [], 0
        for _ in range(repeat):
            client.run_on_scheduler(_reset)
            wall, total = B.timed(lambda: fn(client, n))
            assert total == sum(range(1, n + 1)), total
            walls.append(wall)
            most = max(most, client.run_on_scheduler(_max))
            B.log(f"yield loop {n} {alt}: {wall:.2f} s")
    return walls, most


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    n = args.n
    res = {alt: measure(alt, n, args.repeat) for alt in ALTS}
    med = {alt: B.median(w) for alt, (w, _) in res.items()}
    rows = [[label, B.fmt_s(med[alt]), B.runs(res[alt][0]), f"{med[alt] / n * 1000:.2f}",
             B.ratio(med[alt], med["wc"]), res[alt][1]]
            for alt, (label, _) in ALTS.items()]
    print(B.table([f"N = {n} sequential yields", f"total s, median of {args.repeat}", "runs s",
                   "per yield ms", "/ worker_client", "most keys on the scheduler"], rows))
    print()
    print("""\
One yield: the body (on the worker's thread pool) yields one child, the
runner plans it and sends one `update-graph`, the scheduler runs the child
(a `@coroutine` plain function is an async task that steps the body on the
thread pool; a `dask.delayed` call is a plain task), the result comes back
to the coroutine's worker, and the body resumes on the thread pool.
"Most keys on the scheduler" is the largest `len(scheduler.tasks)` seen at
any transition during a loop: the root, the child in flight and the one just
released. Results are released as soon as the coroutine has resumed, so the
number does not grow with N.""")
    B.write_json(args.json, {"n": n, "walls": {a: w for a, (w, _) in res.items()},
                             "most_keys": {a: m for a, (_, m) in res.items()}, "median": med})
    return 0


if __name__ == "__main__":
    sys.exit(main())
