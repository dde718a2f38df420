"""ns per inline call of fib(n) in one process: sequential Python, the pure-Python
engine (profile_fib's drivers) and the C prototype, each the median over fresh
processes; with --callgrind, machine instructions per call under valgrind.

Run (from the repository root, after building the prototype, see README.md):
    python benchmarks/prototypes/ccall/bench.py [--n 20] [--rounds 5] [--json F]
    python benchmarks/prototypes/ccall/bench.py --callgrind [--n 18] [--hi 3] [--drivers worker ccall]
    python benchmarks/prototypes/ccall/bench.py --driver ccall --times 3 --n 18

Drivers: seq (``def fib``), floor (profile_fib's least generator trampoline,
calls as tuples), tramp (the bare ``Trampoline``), worker (the ``Trampoline``
wired as a worker wires a run: counting, a ``cancelled()`` callback, an
``Idle``), ccall (the prototype wired the same way: counting, a ``cancelled()``
callback every 256 calls, the stop flag and ``Idle.n`` read before each call,
the annotations contextvar read at each call as ``CoroutineFunction.__call__``
reads it and at each yield as the ``Trampoline`` does), ccall_bare (the
prototype without the callback, the ``Idle`` and the contextvar), ccall_delayed
(as ccall, each call an instance of a ``dask.delayed.Delayed`` subclass made in
C). make_py and
make_c: making one call object (``fib(3)`` in a loop less the empty loop).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, BENCH]

import _ccall  # noqa: E402  (built in place: see README.md)
import fibc  # noqa: E402
import profile_fib as P  # noqa: E402

from dask_coro._internals.dask_private import annotations_in_effect  # noqa: E402
from dask_coro.examples import fib as pyfib  # noqa: E402


def _ccall_worker(n: int) -> int:
    _ccall.set_annotations_var(annotations_in_effect)
    try:
        return fibc.run(n)
    finally:
        _ccall.set_annotations_var(None)


def _ccall_bare(n: int) -> int:
    return _ccall.Trampoline().run(fibc.fib(n))


def _ccall_delayed(n: int) -> int:
    from dask_coro.core.engine import Idle

    _ccall.set_annotations_var(annotations_in_effect)
    try:
        t = _ccall.Trampoline(cancelled=lambda: False, idle=Idle(0))
        return t.run(fibc.fibd(n))
    finally:
        _ccall.set_annotations_var(None)


DRIVERS = {
    "seq": P.DRIVERS["seq"],
    "floor": P.DRIVERS["floor"],
    "tramp": P.DRIVERS["tramp"],
    "worker": P.DRIVERS["worker"],
    "ccall": _ccall_worker,
    "ccall_bare": _ccall_bare,
    "ccall_delayed": _ccall_delayed,
}


def child(n: int, path: str) -> int:
    calls = P.B.fib_calls(n)
    expect = P.B.seq_fib(n)
    for fn in DRIVERS.values():
        assert fn(n) == expect
    best = {k: float("inf") for k in DRIVERS}
    for _ in range(9):  # interleaved, the fastest of 9 each
        for k, fn in DRIVERS.items():
            t0 = time.perf_counter()
            fn(n)
            best[k] = min(best[k], time.perf_counter() - t0)
    ns = {k: v / calls * 1e9 for k, v in best.items()}
    _ccall.set_annotations_var(annotations_in_effect)
    ns["make_c"] = P.B.ns_making_calls(fibc.fib, calls)
    _ccall.set_annotations_var(None)
    ns["make_py"] = P.B.ns_making_calls(pyfib, calls)
    with open(path, "w") as f:
        json.dump({"n": n, "calls": calls, "ns": ns}, f)
    return 0


ROWS = [
    ("sequential Python (`def fib`)", "seq"),
    ("pure floor: least generator trampoline, calls as tuples (`_floor_run`)", "floor"),
    ("dask_coro's engine (the one in use: `DASK_CORO_PURE=1` for the pure one): bare `Trampoline`", "tramp"),
    ("dask_coro's engine: `Trampoline` as a worker wires it", "worker"),
    ("C prototype, wired as a worker (counting, `cancelled()`, stop flag, `Idle.n`, "
     "annotations read)", "ccall"),
    ("C prototype, bare (counting and the stop flag only)", "ccall_bare"),
    ("C prototype wired as a worker, each call a `Delayed` subclass made in C", "ccall_delayed"),
    ("making one call object, dask_coro (`fib(3)` in a loop less the loop)", "make_py"),
    ("making one call object, C prototype", "make_c"),
]


def timings(args) -> int:
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            out = os.path.join(tmp, f"{r}.json")
            subprocess.run([sys.executable, os.path.abspath(__file__), "--child", out,
                            "--n", str(args.n)], check=True)
            with open(out) as f:
                runs.append(json.load(f)["ns"])
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    calls = P.B.fib_calls(args.n)
    print(f"fib({args.n}), {calls} calls, ns per call: median over {args.rounds} fresh "
          "processes (each the fastest of 9 interleaved runs per driver)")
    print()
    print("| driver | ns per call | / sequential | runs |")
    print("|---|---|---|---|")
    for label, k in ROWS:
        each = " ".join(f"{r[k]:.0f}" for r in runs)
        print(f"| {label} | {med[k]:.0f} | {med[k] / med['seq']:.1f} x | {each} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "calls": calls, "median": med, "runs": runs}, f, indent=1)
    return 0


def _instructions(driver: str, n: int, times: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
             sys.executable, os.path.abspath(__file__), "--driver", driver, "--times",
             str(times), "--n", str(n)],
            capture_output=True, text=True, check=True,
            env=dict(os.environ, PYTHONHASHSEED="0"))
    m = re.search(r"Collected : (\d+)", proc.stderr)
    assert m, proc.stderr[-500:]
    return int(m.group(1))


def callgrind(args) -> int:
    calls = P.B.fib_calls(args.n)
    hi = args.hi
    print(f"instructions per call, fib({args.n}) ({calls} calls): (Ir at --times {hi} less "
          f"at --times 1) / ({hi - 1} x calls), PYTHONHASHSEED=0")
    print()
    print("| driver | instructions per call |")
    print("|---|---|")
    for d in args.drivers:
        one, more = _instructions(d, args.n, 1), _instructions(d, args.n, hi)
        print(f"| {d} | {(more - one) / ((hi - 1) * calls):,.0f} |", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--driver", choices=sorted(DRIVERS))
    p.add_argument("--times", type=int, default=1)
    p.add_argument("--callgrind", action="store_true")
    p.add_argument("--hi", type=int, default=3,
                   help="with --callgrind: runs of the longer count (more: less noise from "
                   "the start, slower under valgrind)")
    p.add_argument("--drivers", nargs="+", default=["worker", "ccall", "ccall_bare"])
    args = p.parse_args()
    if args.child:
        return child(args.n, args.child)
    if args.driver:
        fn, expect = DRIVERS[args.driver], P.B.seq_fib(args.n)
        for _ in range(args.times + 1):  # once first: imports, caches
            assert fn(args.n) == expect
        return 0
    if args.callgrind:
        return callgrind(args)
    return timings(args)


if __name__ == "__main__":
    sys.exit(main())
