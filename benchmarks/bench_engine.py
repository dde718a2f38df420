"""The compiled engine against the pure one, in one run: an inline call in one
process, and fib(25) with every call a coroutine on 1 and 2 workers, against
sequential Python.

Run: python benchmarks/bench_engine.py [--n 25] [--repeat 5] [--ns-n 20] [--rounds 5] [--quick]
     python benchmarks/bench_engine.py --callgrind [--ns-n 16]   (needs valgrind)

ns per inline call: fib(--ns-n) through ``Trampoline`` wired as a worker wires
a run (counting calls, a ``cancelled()`` callback, an ``Idle``), and making one
call object (``fib(3)`` in a loop, less the empty loop); the fastest of 9
interleaved runs in each of --rounds fresh processes per engine, alternating
(``DASK_CORO_PURE=1`` for the pure one), the median of those.
fib(--n) on a cluster: 2 worker processes x 1 thread, then 1, each engine in
turn on a fresh cluster (the workers import dask_coro with or without
``DASK_CORO_PURE``, checked on each), --repeat runs each, in two passes (the
second in the opposite order); sequential Python fib(--n) timed in this
process before and after.
With --callgrind: machine instructions an inline call of the compiled engine
(fib(--ns-n) once through the trampoline wired as a worker, under valgrind's
callgrind, counting inside ``_cengine.steps`` only, which runs every call and
body: the same count run after run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _bench as B

from dask_coro.examples import fib as coro_fib

ENGINES = ("compiled", "pure")


# -- ns per inline call, one process ------------------------------------------


def _child_ns(n: int, path: str) -> None:
    from dask_coro.core import accel
    from dask_coro.core.engine import Done, Idle
    from dask_coro.runtime.call import trampoline

    def worker_run(k: int) -> int:
        t = trampoline("fib", inline=True, count=True, idle=Idle(0), cancelled=lambda: False, awaits=False)
        out = t.start(coro_fib.__wrapped__, (k,), {})
        assert type(out) is Done
        return out.step.value

    calls = B.fib_calls(n)
    assert worker_run(n) == B.seq_fib(n)
    best = {"seq": float("inf"), "call": float("inf")}
    for _ in range(9):
        for k, fn in (("seq", B.seq_fib), ("call", worker_run)):
            t0 = time.perf_counter()
            fn(n)
            best[k] = min(best[k], time.perf_counter() - t0)
    ns = {k: v / calls * 1e9 for k, v in best.items()}
    ns["make"] = B.ns_making_calls(coro_fib, calls)
    with open(path, "w") as f:
        json.dump({"engine": accel.ENGINE, "ns": ns}, f)


def per_call(n: int, rounds: int) -> dict:
    runs: dict[str, list[dict]] = {e: [] for e in ENGINES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for engine in ENGINES if r % 2 == 0 else reversed(ENGINES):
                out = os.path.join(tmp, f"{engine}-{r}.json")
                env = dict(os.environ, DASK_CORO_PURE="1" if engine == "pure" else "")
                subprocess.run([sys.executable, os.path.abspath(__file__), "--child-ns", out,
                                "--ns-n", str(n)], check=True, env=env)
                with open(out) as f:
                    got = json.load(f)
                assert got["engine"] == engine, (got["engine"], engine)
                runs[engine].append(got["ns"])
    return {e: {k: statistics.median(r[k] for r in runs[e]) for k in runs[e][0]} | {"runs": runs[e]}
            for e in ENGINES}


def _child_fib(n: int) -> None:
    from dask_coro.core.engine import Idle
    from dask_coro.runtime.call import trampoline

    t = trampoline("fib", inline=True, count=True, idle=Idle(0), cancelled=lambda: False, awaits=False)
    assert t.start(coro_fib.__wrapped__, (n,), {}).step.value == B.seq_fib(n)


def callgrind(n: int) -> int:
    import re

    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--toggle-collect=steps", f"--callgrind-out-file={tmp}/cg",
             sys.executable, os.path.abspath(__file__), "--child-fib", str(n)],
            capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONHASHSEED="0"))
    m = re.search(r"Collected : (\d+)", proc.stderr)
    assert m, proc.stderr[-500:]
    calls = B.fib_calls(n) - 1  # the root is not an inline call
    print(f"compiled engine, fib({n}): {int(m.group(1)) / calls:,.0f} instructions an inline call "
          "(inside _cengine.steps: the loop, making calls, the bodies)")
    return 0


# -- fib(n) on a cluster -------------------------------------------------------


def _engine_here() -> str:
    import dask_coro

    return dask_coro.engine


def on_cluster(n: int, repeat: int, n_workers: int, engine: str) -> list[float]:
    os.environ["DASK_CORO_PURE"] = "1" if engine == "pure" else ""
    try:
        with B.cluster(inline=True, n_workers=n_workers) as client:
            seen = set(client.run(_engine_here).values())
            assert seen == {engine}, f"workers run {seen}, not {engine}"
            assert client.compute(coro_fib(5)).result() == 5
            walls = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                assert client.compute(coro_fib(n)).result() == B.seq_fib(n)
                walls.append(time.perf_counter() - t0)
            return walls
    finally:
        os.environ.pop("DASK_CORO_PURE", None)


def seq_wall(n: int, k: int = 15) -> float:
    walls = []
    for _ in range(k):
        t0 = time.perf_counter()
        B.seq_fib(n)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def main(argv=None) -> int:
    p = B.parser(__doc__, repeat=5)
    p.add_argument("--n", type=int, default=25)
    p.add_argument("--ns-n", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--child-ns", help=argparse.SUPPRESS)
    p.add_argument("--child-fib", type=int, help=argparse.SUPPRESS)
    p.add_argument("--callgrind", action="store_true")
    args = B.parse(p, argv, quick={"n": 18, "ns_n": 15, "rounds": 2, "repeat": 2})
    if args.child_ns:
        _child_ns(args.ns_n, args.child_ns)
        return 0
    if args.child_fib:
        _child_fib(args.child_fib)
        return 0
    if args.callgrind:
        return callgrind(args.ns_n)
    data: dict = {"n": args.n}
    ns = per_call(args.ns_n, args.rounds)
    data["ns"] = ns
    seq_before = seq_wall(args.n)
    walls: dict[tuple[str, int], list[float]] = {}
    order = [(e, w) for w in (2, 1) for e in ENGINES]
    for pass_ in (order, list(reversed(order))):
        for engine, workers in pass_:
            walls.setdefault((engine, workers), []).extend(on_cluster(args.n, args.repeat, workers, engine))
    seq = min(seq_before, seq_wall(args.n))
    data["seq"] = seq
    data["walls"] = {f"{e}/{w}": v for (e, w), v in walls.items()}
    med = {k: statistics.median(v) for k, v in walls.items()}
    calls = B.fib_calls(args.ns_n)
    print(f"An inline call in one process: fib({args.ns_n}) ({calls} calls) through `Trampoline` "
          f"wired as a worker wires it; median of {args.rounds} fresh processes per engine.\n")
    print("| ns per call | compiled | pure | pure / compiled |")
    print("|---|---|---|---|")
    for label, k in (("sequential Python (`def fib`)", "seq"),
                     ("an inline call (`Trampoline` as a worker wires it)", "call"),
                     ("making one call object (`fib(3)`)", "make")):
        c, q = ns["compiled"][k], ns["pure"][k]
        print(f"| {label} | {c:.0f} | {q:.0f} | {q / c:.2f} x |")
    sq = min(ns["compiled"]["seq"], ns["pure"]["seq"])
    print(f"| an inline call / sequential | {ns['compiled']['call'] / sq:.1f} x | "
          f"{ns['pure']['call'] / sq:.1f} x | |")
    print(f"\nfib({args.n}) with every call a coroutine (`dask_coro.examples.fib`), inline on, "
          f"{args.repeat} runs x 2 passes per row; sequential Python fib({args.n}): "
          f"{seq * 1e3:.1f} ms (median of 15, the faster of before and after).\n")
    print("| fib(n) on a cluster | wall (median) | runs | / sequential | 2 workers / 1 |")
    print("|---|---|---|---|---|")
    for engine in ENGINES:
        for workers in (2, 1):
            m = med[(engine, workers)]
            each = ", ".join(f"{w:.3f}" for w in walls[(engine, workers)])
            speed = f"{med[(engine, 1)] / m:.2f} x" if workers == 2 else "1"
            print(f"| {engine}, {workers} worker{'s' if workers > 1 else ''} | {m * 1e3:.0f} ms | "
                  f"{each} | **{m / seq:.1f} x** | {speed} |")
    B.write_json(args.json, data)
    return 0


SCENARIOS = [  # its section of RESULTS.md, run by run_all.py
    B.Scenario("engine", "The compiled engine against the pure one: an inline call, and fib(25) on "
               "1 and 2 workers", ["--rounds", "3", "--repeat", "3"], 420),
]


if __name__ == "__main__":
    sys.exit(main())
