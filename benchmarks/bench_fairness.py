"""Fair progress between trees: a small sieve tree submitted just before a large trial-division
tree, its time in the race against its time alone, round by round, on one LocalCluster.

Run: python benchmarks/bench_fairness.py [--small 1000000] [--big 1500000] [--rounds 20]
Each round times the small tree alone, then the race (the small tree's root
submitted first, the big tree's right after; the small tree's time is until
its own result is in), so a round's ratio compares two runs made moments
apart. Both trees are binary trees of @coroutine calls with plain arguments
(inline calls, handed out to idle threads); leaves are pure Python. Prints a
Markdown table and how many pauses the workers asked for (docs/running.md,
fair progress between trees).
"""

from __future__ import annotations

import math
import time

from distributed import Client, LocalCluster

from dask_coro import coroutine


def sieve_count(lo, hi):
    """Primes in [lo, hi), by a segmented sieve in pure Python."""
    lim = math.isqrt(hi) + 1
    base = bytearray([1]) * (lim + 1)
    base[0:2] = b"\0\0"
    for i in range(2, math.isqrt(lim) + 1):
        if base[i]:
            base[i * i :: i] = bytearray(len(base[i * i :: i]))
    seg = bytearray([1]) * (hi - lo)
    for p in range(2, lim + 1):
        if base[p]:
            for m in range(max(p * p, (lo + p - 1) // p * p), hi, p):
                seg[m - lo] = 0
    return sum(seg[i - lo] for i in range(max(lo, 2), hi))


def trial_count(lo, hi):
    """Primes in [lo, hi), by trial division."""
    n = 0
    for x in range(max(lo, 2), hi):
        for d in range(2, math.isqrt(x) + 1):
            if x % d == 0:
                break
        else:
            n += 1
    return n


@coroutine
def sieve(lo, hi, leaf):
    if hi - lo <= leaf:
        return sieve_count(lo, hi)
    mid = (lo + hi) // 2
    a, b = yield [sieve(lo, mid, leaf), sieve(mid, hi, leaf)]
    return a + b


@coroutine
def trial(lo, hi, leaf):
    if hi - lo <= leaf:
        return trial_count(lo, hi)
    mid = (lo + hi) // 2
    a, b = yield [trial(lo, mid, leaf), trial(mid, hi, leaf)]
    return a + b


def _pauses(dask_worker):
    watcher = dask_worker.plugins.get("dask-coro-key-watcher")
    lanes = getattr(watcher, "lanes", None)
    seats = getattr(lanes, "seats", None)  # absent before the fair seats
    return getattr(seats, "pauses", 0)


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", type=int, default=1_000_000)
    p.add_argument("--big", type=int, default=1_500_000)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    small = (0, args.small, 25_000)
    big = (0, args.big, 20_000)
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as lc, Client(lc) as c:
        c.compute(sieve(0, 100_000, 25_000)).result()  # warm up: plugins, lanes
        rows = []
        for r in range(args.rounds):
            t = time.perf_counter()
            c.compute(sieve(*small)).result()
            solo = time.perf_counter() - t
            t = time.perf_counter()
            fs = c.compute(sieve(*small))
            fb = c.compute(trial(*big))
            fs.result()
            raced = time.perf_counter() - t
            fb.result()
            both = time.perf_counter() - t
            rows.append((r, solo, raced, both))
            print(f"round {r}: small alone {solo:.3f} s, in the race {raced:.3f} s "
                  f"({raced / solo:.1f} x), big {both:.2f} s", flush=True)
        pauses = sum(c.run(_pauses).values())
    ratios = sorted(raced / solo for _, solo, raced, _ in rows)
    print()
    print("| round | small alone (s) | small in the race (s) | ratio | big tree ends (s) |")
    print("|---|---|---|---|---|")
    for r, solo, raced, both in rows:
        print(f"| {r} | {solo:.3f} | {raced:.3f} | {raced / solo:.1f} x | {both:.2f} |")
    print()
    print(f"ratio: median {ratios[len(ratios) // 2]:.1f} x, worst {ratios[-1]:.1f} x; "
          f"rounds within 3 x: {sum(x <= 3 for x in ratios)} of {len(ratios)}; pauses asked: {pauses}")


if __name__ == "__main__":
    main()
