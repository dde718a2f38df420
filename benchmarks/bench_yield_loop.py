"""A coroutine looping over N sequential yields of one trivial child (a @coroutine call with inline
on and off, a dask.delayed call): per-yield latency and the most keys alive on the scheduler, versus
a worker_client loop of submit().result().

Run: python benchmarks/bench_yield_loop.py [--n 1000] [--inline-n 30000] [--repeat 3] [--quick]
2 worker processes x 1 thread; a fresh cluster per alternative (with
`coro.inline.enabled` set before it starts), warmed up with N = 10, then
--repeat timed loops. Prints a Markdown table and notes.
"""

from __future__ import annotations

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


def _local_loop(n: int) -> None:
    from dask_coro.runtime.call import trampoline

    out = trampoline("loop", inline=True).start(loop.__wrapped__, (n,), {})
    assert out.step.value == sum(range(1, n + 1))


def run_coro(c, n):
    return c.compute(loop(n)).result()


ALTS = {
    "coro": B.Alt("dask_coro: `yield coroutine(inc)(i)`, inline on (default)", run_coro, True),
    "coro_off": B.Alt("dask_coro: `yield coroutine(inc)(i)`, inline off (a task each)", run_coro,
                      False),
    "delayed": B.Alt("dask_coro: `yield dask.delayed(inc)(i)` (a task each)",
                     lambda c, n: c.compute(loop_delayed(n)).result(), True),
    "wc": B.Alt("worker_client: `submit(inc, i).result()`",
                lambda c, n: c.submit(wc_loop, n, pure=False).result()),
}


def measure(alt: str, n: int, repeat: int) -> tuple[list[float], int, list[float], list[int]]:
    """Walls of N yields, the most keys on the scheduler, walls of the same
    root with no yield (its own submit and result, subtracted per yield), and
    the tasks run per loop."""
    a = ALTS[alt]
    with B.cluster(inline=a.inline) as client:
        client.register_plugin(MaxTasks())
        assert a.run(client, 10) == sum(range(1, 11))
        empty, most = [], []

        def before():
            empty.append(B.timed(lambda: a.run(client, 0))[0])
            client.run_on_scheduler(_reset)

        walls, ran = B.timed_runs(client, lambda: a.run(client, n), repeat,
                                  sum(range(1, n + 1)), f"yield loop {n} {alt}", before=before,
                                  after=lambda: most.append(client.run_on_scheduler(_max)))
    return walls, max(most), empty, ran


def main(argv=None) -> int:
    p = B.parser(__doc__)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--inline-n", type=int, default=30_000,
                   help="N for the inline row (a yield is microseconds there)")
    args = B.parse(p, argv, quick={"n": 30, "inline_n": 1000, "repeat": 1})
    ns = {alt: args.inline_n if alt == "coro" else args.n for alt in ALTS}
    res = {alt: measure(alt, ns[alt], args.repeat) for alt in ALTS}
    med = {alt: B.median(r[0]) for alt, r in res.items()}
    empty = {alt: B.median(r[2]) for alt, r in res.items()}
    per = {alt: max(0.0, med[alt] - empty[alt]) / ns[alt] for alt in ALTS}
    local_s, local = B.median_of(lambda: _local_loop(args.inline_n), args.repeat)
    per["local"] = local_s / args.inline_n
    rows = [[a.label, ns[alt], *B.wall_cells(res[alt][0]), B.fmt_s(empty[alt]),
             f"{per[alt] * 1000:.4f}", B.ratio(per[alt], per["wc"]), B.counts(res[alt][3]),
             res[alt][1]] for alt, a in ALTS.items()]
    rows.append([("the inline row's loop run by `dask_coro.core.engine.Trampoline` in this "
                  "process (no cluster, nothing handed out)"), args.inline_n,
                 *B.wall_cells(local), "-", f"{per['local'] * 1000:.4f}",
                 B.ratio(per["local"], per["wc"]), "-", "-"])
    B.report(["sequential yields of one child", "N", *B.wall_header(args.repeat, "total"),
              "the root with N = 0, s (median)", "per yield ms: (total - N = 0) / N",
              "/ worker_client", "tasks run per loop (counted)", "most keys on the scheduler"],
             rows, NOTES)
    B.write_json(args.json, {"n": args.n, "ns": ns, "walls": {a: r[0] for a, r in res.items()},
                             "empty": {a: r[2] for a, r in res.items()},
                             "tasks_run": {a: r[3] for a, r in res.items()},
                             "most_keys": {a: r[1] for a, r in res.items()}, "median": med,
                             "per_yield": per})
    return 0


NOTES = """\
With inline on (the default) a `@coroutine` child with plain arguments is a
plain call in the body's own thread-pool step: no task, no message. A task
child (inline off, or a `dask.delayed` call): the body (on the worker's
thread pool) yields one child, the
runner plans it and sends one `update-graph`, the scheduler runs the child
(a `@coroutine` plain function is an async task that steps the body on the
thread pool; a `dask.delayed` call is a plain task), the result comes back
to the coroutine's worker, and the body resumes on the thread pool.
"Most keys on the scheduler" is the largest `len(scheduler.tasks)` seen at
any transition during a loop: the root, the child in flight and the one just
released. With coro.durability.hold-children off, results are released as soon
as the coroutine has resumed, so the number does not grow with N; on (the
default since the durability work), finished children stay held for the root
until it ends, and the number grows with N. Per yield: the median total less the median of
the same root run with N = 0 (its own submission and result), over N.
"Tasks run" counts transitions to memory on the scheduler during a loop (the
root included). Inline on, a child the loop is about to run may still be
handed out as a task when the scheduler tells it the other worker is idle
(at most every `coro.inline.interval`, 20 ms): the loop then waits for that task's
round trip (milliseconds) instead of running the call (microseconds), which
is most of the inline row's time per yield here (compare the last row: the
same loop through the trampoline in one process, where nothing is handed
out)."""


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("yield_loop", "Per-yield latency: a loop of sequential yields of one trivial child",
               ["--n", "300", "--repeat", "3"], 120),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("yield_loop")
    if d and "per_yield" in d:
        q = d["per_yield"]

        def ms(k):
            if k not in q:
                return "-"
            return f"{q[k] * 1e6:.1f} us" if q[k] < 1e-4 else f"{q[k] * 1000:.1f} ms"

        rows.row("per-yield latency (no target)",
                 f"`@coroutine` child: {ms('coro')} inline on, {ms('coro_off')} inline off; "
                 f"`dask.delayed` child: {ms('delayed')}; worker_client submit().result(): {ms('wc')}",
                 "-")
    return rows


if __name__ == "__main__":
    sys.exit(main())
