"""Fair progress between trees: a small sieve tree beside a wide trial-division tree, in three
arrival orders, round by round, on one LocalCluster; the same trees as plain Dask
(``worker_client`` tasks) in the same run.

Run: python benchmarks/bench_fairness.py [--runs 10] [--plain-runs 1] [--ray-runs 1]
                                         [--races 20] [--small 3000000] [--wide 6000000] [--trace]

A run is nine rounds: each of three arrival orders three times, in turn:

* ``together``: both roots in one ``client.compute([small, wide])``;
* ``wide-first``: the wide root first in the list of one ``compute``;
* ``later``: the small root submitted 0.5 s after the wide one started.

The small tree's time is from its submission until its own result is in, against its
best time alone on the same cluster (three runs before the first round). The bound of
issue 45 is 4 x its time alone, or 0.25 s if that is more, in every round. Both trees
are binary trees of ``@coroutine`` calls with plain arguments (inline calls, handed out
to idle threads); the leaves are pure Python (small: 16 leaves of a few ms; wide: 300
leaves of 4-51 ms, recursive halving: the shape of the race in docs/groups.md).
The same trees as plain Dask (``worker_client`` tasks) and as Ray nested tasks (where Ray
imports) run the same rounds after. The races (``--races``): the race of docs/groups.md with
its 2 s deadline, and first-of without one on 1-thread workers, beside plain Dask's
``wait(FIRST_COMPLETED)``. ``--trace`` prints, for the ``later`` rounds, where the small root's first task waited
(the scheduler's and the worker's story: sent to its worker, started there).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import _bench as B
from distributed import Client, LocalCluster, wait, worker_client

import dask_coro
from dask_coro import coroutine

SMALL_LEAF = 200_000
WIDE_LEAF = 20_000
ORDERS = ("together", "wide-first", "later")


def sieve_count(lo: int, hi: int) -> int:
    """Primes in [lo, hi), by a segmented sieve (slice assignment: a few ms)."""
    lim = math.isqrt(hi) + 1
    base = bytearray([1]) * (lim + 1)
    base[0:2] = b"\0\0"
    for i in range(2, math.isqrt(lim) + 1):
        if base[i]:
            base[i * i :: i] = bytearray(len(base[i * i :: i]))
    seg = bytearray([1]) * (hi - lo)
    for p in range(2, lim + 1):
        if base[p]:
            start = max(p * p, (lo + p - 1) // p * p)
            if start < hi:
                seg[start - lo :: p] = bytearray(len(seg[start - lo :: p]))
    if lo < 2:
        seg[: 2 - lo] = bytearray(min(2 - lo, len(seg)))
    return sum(seg)


def trial_count(lo: int, hi: int) -> int:
    """Primes in [lo, hi), by trial division (pure Python: 4-51 ms a leaf of 20,000)."""
    n = 0
    for x in range(max(lo, 2), hi):
        for d in range(2, math.isqrt(x) + 1):
            if x % d == 0:
                break
        else:
            n += 1
    return n


@coroutine
def by_sieve(lo: int, hi: int, leaf: int = SMALL_LEAF):
    if hi - lo <= leaf:
        return sieve_count(lo, hi)
    mid = (lo + hi) // 2
    a, b = yield [by_sieve(lo, mid, leaf), by_sieve(mid, hi, leaf)]
    return a + b


@coroutine
def by_trial(lo: int, hi: int, leaf: int = WIDE_LEAF):
    if hi - lo <= leaf:
        return trial_count(lo, hi)
    mid = (lo + hi) // 2
    a, b = yield [by_trial(lo, mid, leaf), by_trial(mid, hi, leaf)]
    return a + b


def plain_tree(count, lo: int, hi: int, leaf: int) -> int:
    """The same tree as plain Dask: a ``worker_client`` task per inner node."""
    if hi - lo <= leaf:
        return count(lo, hi)
    mid = (lo + hi) // 2
    with worker_client() as c:
        a, b = c.gather([c.submit(plain_tree, count, lo, mid, leaf, pure=False),
                         c.submit(plain_tree, count, mid, hi, leaf, pure=False)])
    return a + b


def _ray_tree(kind: str, lo: int, hi: int, leaf: int) -> int:
    """The same tree as Ray nested tasks (``ray.get`` in a task gives its CPU back)."""
    import ray

    count = sieve_count if kind == "sieve" else trial_count
    if hi - lo <= leaf:
        return count(lo, hi)
    mid = (lo + hi) // 2
    tree = ray.remote(_ray_tree)
    a, b = ray.get([tree.remote(kind, lo, mid, leaf), tree.remote(kind, mid, hi, leaf)])
    return a + b


class _RayClient:
    """What ``one_round`` needs of a client, for Ray: ``submit`` a tree, ``result()`` its ref."""

    def __init__(self) -> None:
        import ray

        self.ray = ray
        self.tree = ray.remote(_ray_tree)

    def tree_of(self, kind: str, args):
        ref = self.tree.remote(kind, *args, SMALL_LEAF if kind == "sieve" else WIDE_LEAF)
        ray = self.ray

        class Ref:
            def result(self) -> int:
                return ray.get(ref)

        return Ref()


def _small(c: Client, args, plain: bool):
    if isinstance(c, _RayClient):
        return c.tree_of("sieve", args)
    if plain:
        return c.submit(plain_tree, sieve_count, *args, SMALL_LEAF, pure=False)
    return c.compute(by_sieve(*args))


def _wide(c: Client, args, plain: bool):
    if isinstance(c, _RayClient):
        return c.tree_of("trial", args)
    if plain:
        return c.submit(plain_tree, trial_count, *args, WIDE_LEAF, pure=False)
    return c.compute(by_trial(*args))


def one_round(c: Client, order: str, small, wide, plain: bool) -> float:
    """The small tree's time in one round (seconds from its submission to its result)."""
    if order == "together":
        t = time.perf_counter()
        fs, fw = _small(c, small, plain), _wide(c, wide, plain)
    elif order == "wide-first":
        fw = _wide(c, wide, plain)
        t = time.perf_counter()
        fs = _small(c, small, plain)
    else:
        fw = _wide(c, wide, plain)
        time.sleep(0.5)
        t = time.perf_counter()
        fs = _small(c, small, plain)
    fs.result()
    took = time.perf_counter() - t
    fw.result()
    return took


def alone(c: Client, small, plain: bool) -> float:
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        _small(c, small, plain).result()
        best = min(best, time.perf_counter() - t)
    return best


def measure(c: Client, runs: int, small, wide, plain: bool) -> tuple[float, list[tuple[int, str, float]]]:
    solo = alone(c, small, plain)
    rows = []
    for run in range(runs):
        for _ in range(3):
            for order in ORDERS:
                rows.append((run, order, one_round(c, order, small, wide, plain)))
    return solo, rows


def report(name: str, solo: float, rows) -> None:
    bound = max(4 * solo, 0.25)
    times = [t for _, _, t in rows]
    within = sum(t <= bound for t in times)
    print(f"\n### {name}: small tree alone {solo:.3f} s; bound {bound:.3f} s")
    print("| order | rounds | median (s) | worst (s) | worst / alone | within the bound |")
    print("|---|---|---|---|---|---|")
    for order in ORDERS:
        ts = [t for _, o, t in rows if o == order]
        print(f"| {order} | {len(ts)} | {statistics.median(ts):.3f} | {max(ts):.3f} | "
              f"{max(ts) / solo:.1f} x | {sum(t <= bound for t in ts)} of {len(ts)} |")
    print(f"| all | {len(times)} | {statistics.median(times):.3f} | {max(times):.3f} | "
          f"{max(times) / solo:.1f} x | **{within} of {len(times)}** |")


def _pauses(dask_worker) -> int:
    watcher = dask_worker.plugins.get("dask-coro-key-watcher")
    seats = getattr(getattr(watcher, "lanes", None), "seats", None)
    return getattr(seats, "pauses", 0)


def trace(c: Client, small, wide) -> None:
    """Where the small root's first task waits: the scheduler's and the worker's story."""
    for r in range(3):
        fw = _wide(c, wide, False)
        time.sleep(0.5)
        t0 = time.time()
        fs = _small(c, small, False)
        fs.result()
        t1 = time.time()
        fw.result()
        story = c.story(fs.key)
        sent = [s[-1] for s in story if s[0] == "scheduler" and s[3] == "processing"]
        began = [s[-1] for s in story if s[0] != "scheduler" and tuple(s[2:4]) == ("ready", "executing")]
        print(f"trace {r}: small tree {t1 - t0:.3f} s; its root sent to a worker after "
              f"{(min(sent) - t0) * 1e3 if sent else float('nan'):.0f} ms, started there after "
              f"{(min(began) - t0) * 1e3 if began else float('nan'):.0f} ms", flush=True)


# -- the race of docs/groups.md ----------------------------------------------


@coroutine
def step(x, seconds):
    time.sleep(seconds)
    return x + 1


@coroutine
def strategy(name, steps, seconds):
    x = 0
    for _ in range(steps):  # a chain of calls (inline, or tasks when handed out)
        x = yield step(x, seconds)
    return name, x


@coroutine
def race(deadline_s):
    with dask_coro.group(timeout=deadline_s) as g:
        g.spawn(strategy("careful", 40, 0.05))  # about 2 s
        g.spawn(strategy("greedy", 5, 0.02))  # about 0.1 s
        try:
            _, (name, _) = yield g.next()
        except TimeoutError:
            return "no answer in time"
        return name


def plain_step(x, seconds):
    time.sleep(seconds)
    return x + 1


def plain_strategy(name, steps, seconds):
    x = 0
    with worker_client() as c:
        for _ in range(steps):
            x = c.submit(plain_step, x, seconds, pure=False).result()
    return name, x


def plain_race() -> str:
    with worker_client() as c:
        fs = [c.submit(plain_strategy, "careful", 40, 0.05, pure=False),
              c.submit(plain_strategy, "greedy", 5, 0.02, pure=False)]
        done, _ = wait(fs, return_when="FIRST_COMPLETED")
        name = next(iter(done)).result()[0]
        c.cancel(fs)
        return name


def races(c: Client, n: int, deadline: float | None, plain: bool = False) -> list[tuple[float, str, int]]:
    """``n`` races one after another: (seconds to the answer, the answer, keys left on the
    scheduler 5 s after it, at most)."""
    rows = []
    for _ in range(n):
        t = time.perf_counter()
        if plain:
            f = c.submit(plain_race, pure=False)
        else:
            f = c.compute(race(deadline) if deadline is not None else first_of())
        answer = f.result()
        took = time.perf_counter() - t
        del f
        left = c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        end = time.monotonic() + 5
        while left and time.monotonic() < end:
            time.sleep(0.05)
            left = c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        rows.append((took, answer, left))
    return rows


@coroutine
def first_of():
    """The race without a deadline (issue 45, item 5)."""
    with dask_coro.group() as g:
        g.spawn(strategy("careful", 40, 0.05))
        g.spawn(strategy("greedy", 5, 0.02))
        _, (name, _) = yield g.next()
        return name


def report_races(name: str, rows, deadline: float | None) -> None:
    times = sorted(t for t, _, _ in rows)
    fast = [t for t, a, _ in rows if a == "greedy"]
    print(f"\n### {name}: {len(rows)} races")
    print("| answered by greedy | median (s) | worst (s) | within 0.3 s | within 0.5 s |"
          + (" within deadline + 0.2 s |" if deadline else "") + " keys left 5 s after |")
    print("|---|---|---|---|---|" + ("---|" if deadline else "") + "---|")
    print(f"| {len(fast)} of {len(rows)} | {statistics.median(times):.3f} | {times[-1]:.3f} | "
          f"{sum(t <= 0.3 for t in times)} of {len(rows)} | {sum(t <= 0.5 for t in times)} of {len(rows)} |"
          + (f" {sum(t <= deadline + 0.2 for t in times)} of {len(rows)} |" if deadline else "")
          + f" {max(k for _, _, k in rows)} at most |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10, help="runs of nine rounds (dask_coro)")
    p.add_argument("--plain-runs", type=int, default=1, help="runs of nine rounds, plain Dask (0: none)")
    p.add_argument("--small", type=int, default=3_000_000)
    p.add_argument("--wide", type=int, default=6_000_000)
    p.add_argument("--trace", action="store_true")
    p.add_argument("--races", type=int, default=20, help="races of each kind (0: none)")
    p.add_argument("--no-trees", action="store_true", help="the races alone")
    p.add_argument("--ray-runs", type=int, default=1, help="runs of nine rounds, Ray (where it imports; 0: none)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round each: a smoke test")
    args = p.parse_args()
    if args.quick:
        args.runs, args.plain_runs, args.ray_runs, args.races = 1, 0, 0, 2
        args.small, args.wide = 400_000, 800_000
    if args.races:
        run_races(args.races)
    if args.no_trees:
        return
    small, wide = (0, args.small), (0, args.wide)
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as lc, Client(lc) as c:
        c.compute(by_sieve(0, 400_000)).result()  # warm up: plugins, lanes
        if args.trace:
            trace(c, small, wide)
        if args.runs:
            solo, rows = measure(c, args.runs, small, wide, plain=False)
            pauses = sum(c.run(_pauses).values())
            report("dask_coro", solo, rows)
            print(f"pauses asked: {pauses}")
        if args.plain_runs:
            psolo, prows = measure(c, args.plain_runs, small, wide, plain=True)
            report("plain Dask (worker_client)", psolo, prows)
    if args.ray_runs:
        try:
            import ray
        except ImportError:
            print("\nRay is not installed: no Ray rows")
            return
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
        try:
            rc = _RayClient()
            rc.tree_of("sieve", (0, 400_000)).result()
            rsolo, rrows = measure(rc, args.ray_runs, small, wide, plain=False)  # type: ignore[arg-type]
            report(f"Ray {ray.__version__} (nested tasks, ray.init(num_cpus=4))", rsolo, rrows)
        finally:
            ray.shutdown()


SCENARIOS = [  # its section of RESULTS.md, run by run_all.py
    B.Scenario("fairness", "Fair progress between trees: a small tree beside a wide one, three arrival "
               "orders, and the races, against plain Dask and Ray, run by run_all.py",
               ["--runs", "2", "--races", "20"], 900, json=False, quick=["--ray-runs", "0"]),
]


def run_races(n: int) -> None:
    """The race of docs/groups.md with its 2 s deadline on 2 workers x 2 threads, and without
    a deadline on 2 workers x 1 thread (issue 45, item 5), beside plain Dask's race
    (``wait(FIRST_COMPLETED)`` in a ``worker_client`` task)."""
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as lc, Client(lc) as c:
        c.compute(race(5)).result()  # warm up
        report_races("race, deadline 2 s, 2 workers x 2 threads", races(c, n, 2.0), 2.0)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as lc, Client(lc) as c:
        c.compute(first_of()).result()
        report_races("first-of, no deadline, 2 workers x 1 thread", races(c, n, None), None)
        report_races("plain Dask, wait(FIRST_COMPLETED), 2 workers x 1 thread", races(c, n, None, plain=True), None)


if __name__ == "__main__":
    main()
