"""The seed's process_all over a list of 1,000 (two yields: its length, then every item incremented and summed) as a dask_coro coroutine, with inline on and off, versus the same steps written with worker_client(), wall time.

Run: python benchmarks/bench_process_all.py [--n 1000] [--repeat 3]
2 worker processes x 1 thread; a fresh cluster per alternative (with
`coro.inline.enabled` set before it starts), warmed up with n = 10, then
--repeat timed runs. Prints a Markdown table and notes.
"""

from __future__ import annotations

import argparse
import operator
import sys

import _bench as B
import dask
from distributed import worker_client

from dask_coro import coroutine
from dask_coro.examples import inc, my_len  # the seed's, as in examples.process_all


@coroutine
def generate_data(n):
    return list(range(n))  # the seed's returns a list of random length


@coroutine
def process_all(n):
    """dask_coro.examples.process_all, word for word but for the list's length."""
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
ONE_SUM = "1 + 1 + n getitem + n inc + 1 sum"
# key: (label, tasks, function, coro.inline.enabled on the cluster; None: the default)
ALTS = {
    "wc": ("worker_client: submit/result in one task", ONE_SUM, run_wc, None),
    "coro": ("dask_coro: the seed's process_all, inline on (default)", SEED, run_seed, True),
    "coro_off": ("dask_coro: the seed's process_all, inline off", SEED, run_seed, False),
    "coro_sum": ("dask_coro: process_all with `dask.delayed(sum)`, inline on (default)", ONE_SUM,
                 run_sum, True),
    "coro_sum_off": ("dask_coro: process_all with `dask.delayed(sum)`, inline off", ONE_SUM,
                     run_sum, False),
}


def measure(alt: str, n: int, repeat: int) -> tuple[list[float], int]:
    fn, inline = ALTS[alt][2], ALTS[alt][3]
    with B.cluster(inline=inline) as client:
        assert fn(client, 10) == sum(range(1, 11))
        walls, tasks = [], []
        for _ in range(repeat):
            B.tasks_done(client, reset=True)
            wall, total = B.timed(lambda: fn(client, n))
            assert total == sum(range(1, n + 1)), total
            walls.append(wall)
            tasks.append(B.tasks_done(client))
            B.log(f"process_all {n} {alt}: {wall:.2f} s, {tasks[-1]} tasks")
    return walls, max(tasks)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    res = {alt: measure(alt, args.n, args.repeat) for alt in ALTS}
    med = {alt: B.median(w) for alt, (w, _) in res.items()}
    rows = [[label, shape, res[alt][1], B.fmt_s(med[alt]), B.runs(res[alt][0]),
             B.ratio(med[alt], med["wc"])] for alt, (label, shape, _, _) in ALTS.items()]
    print(B.table([f"process_all, list of {args.n}", "tasks", "tasks run (counted)",
                   f"wall s, median of {args.repeat}", "runs s", "/ worker_client"], rows))
    print()
    print("""\
Wall time: from submitting the root to its total on the client. "Tasks run"
counts transitions to memory on the scheduler during one run (the root
included; the worker_client version's `len` and sum are tasks too). The seed's
`yield sum(processed)` is Python's `sum` over lazy values, which builds a chain
of n `add` tasks, each waiting for the one before: the second dask_coro row
sums in one task, as the worker_client version does. Children of a
`worker_client` are submitted one `submit` at a time (the client batches the
messages); a coroutine's children of one yield go in one `update-graph`.
Every child here has a lazy argument (`L`, `L[i]`, the running sum), so none
can run inline: with `coro.inline.enabled` on or off they are the same tasks,
and the two settings differ only by noise and the inline machinery's
bookkeeping.""")
    B.write_json(args.json, {"n": args.n, "walls": {a: w for a, (w, _) in res.items()},
                             "tasks": {a: t for a, (_, t) in res.items()}, "median": med})
    return 0


if __name__ == "__main__":
    sys.exit(main())
