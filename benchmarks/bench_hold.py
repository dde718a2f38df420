"""Holding a coroutine's children for a re-run, bounded: a streaming loop's peak
worker memory with the default coro.durability.hold-bytes versus holding off
versus a plain worker_client loop, and the children a re-run computes again
after its worker is killed, default budget versus unbounded.

Run: python benchmarks/bench_hold.py [--n 150] [--mb 10] [--replay-n 30]
     [--replay-mb 4] [--quick]
2 worker processes x 1 thread. Streaming: a coroutine yields --n children of
--mb MB one at a time and consumes each (`a = yield chunk(i); total += a[0];
del a`); reported: the workers' peak RSS above idle (sampled every 10 ms).
Replay: a coroutine yields --replay-n children of --replay-mb MB one at a time,
then waits on a gate; its worker is SIGKILLed (its Nanny starts a new one),
the re-run waits on the gate again, then the gate opens; reported: children
that ran more than once.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import _bench as B
import numpy as np
from distributed import get_worker, worker_client

from dask_coro import coroutine


@coroutine(inline=False)
def chunk(i, n):
    return np.full(n, float(i))


@coroutine
def stream(count, n):
    total = 0.0
    for i in range(count):
        a = yield chunk(i, n)
        total += a[0]
        del a
    return total


def plain_stream(count, n):
    """The same loop as a plain task: worker_client, one future at a time."""
    total = 0.0
    with worker_client() as client:
        for i in range(count):
            f = client.submit(np.full, n, float(i), pure=False)
            a = f.result()
            total += a[0]
            del a, f
    return total


@coroutine(inline=False)
def logged_chunk(i, n, folder):
    with open(Path(folder, "runs"), "a") as f:
        f.write(f"{i}\n")
    return np.full(n, float(i))


@coroutine(inline=False)
def gate(folder):
    with open(Path(folder, "gates"), "a") as f:
        f.write(f"{get_worker().address}\n")
    while not Path(folder, "go").exists():
        time.sleep(0.02)
    return 0.0


@coroutine
def replayed(count, n, folder):
    with open(Path(folder, "starts"), "a") as f:
        f.write(f"{get_worker().address} {os.getpid()}\n")
    total = 0.0
    for i in range(count):
        a = yield logged_chunk(i, n, folder)
        total += a[0]
        del a
    total += yield gate(folder)
    return total


def _lines(folder: str, name: str) -> list[str]:
    p = Path(folder, name)
    return p.read_text().splitlines() if p.exists() else []


def _gate_asked_again(dask_scheduler=None) -> bool:
    """The re-run parent reached its gate: a worker's client wants it again
    (the first run's gate, still running for the hold, or a new one)."""
    return any(
        str(k).startswith("gate-") and any(cs.client_key.startswith("Client-worker-") for cs in ts.who_wants or ())
        for k, ts in dask_scheduler.tasks.items()
    )


def _settings(mode: str) -> dict:
    if mode == "off":
        return {"coro.durability.hold-children": False}
    if mode == "unbounded":
        return {"coro.durability.hold-children": True, "coro.durability.hold-bytes": None}
    return {"coro.durability.hold-children": True}


def streaming(mode: str, args) -> dict:
    n = args.mb * 2**20 // 8
    with B.cluster(config=_settings(mode)) as client:
        procs = list(B.worker_processes(client).values())
        base = sum(p.memory_info().rss for p in procs)
        with B.ProcSampler(lambda: procs, 0.01) as sampler:
            t0 = time.perf_counter()
            if mode == "plain":
                got = client.submit(plain_stream, args.n, n, pure=False).result()
            else:
                got = client.compute(stream(args.n, n)).result()
            wall = time.perf_counter() - t0
        assert got == float(sum(range(args.n))), got
        return {"wall": wall, "rss": sampler.peak["rss"] - base}


def replay(mode: str, args) -> dict:
    n = args.replay_mb * 2**20 // 8
    folder = tempfile.mkdtemp(prefix="bench-hold-")
    with B.cluster(config=_settings(mode)) as client:
        fut = client.compute(replayed(args.replay_n, n, folder))
        B.wait_for(lambda: _lines(folder, "gates"), 300, "the gate ran")
        (start,) = _lines(folder, "starts")
        os.kill(int(start.split()[1]), signal.SIGKILL)
        B.wait_for(lambda: len(_lines(folder, "starts")) >= 2
                   and client.run_on_scheduler(_gate_asked_again), 300,
                   "a re-run reached the gate")
        Path(folder, "go").touch()
        assert fut.result(timeout=300) == float(sum(range(args.replay_n)))
        runs = _lines(folder, "runs")
        return {"children": args.replay_n, "runs": len(runs),
                "again": len(runs) - len(set(runs))}


def main(argv=None) -> dict:
    p = B.parser(__doc__, repeat=None)
    p.add_argument("--n", type=int, default=150)
    p.add_argument("--mb", type=int, default=10)
    p.add_argument("--replay-n", type=int, default=30)
    p.add_argument("--replay-mb", type=int, default=4)
    args = B.parse(p, argv, {"n": 20, "mb": 2, "replay_n": 10, "replay_mb": 1})
    out: dict = {"streaming": {}, "replay": {}}
    rows = []
    for mode, label in (("default", "held, default budget"), ("off", "hold-children off"),
                        ("plain", "plain worker_client loop")):
        B.log(f"streaming: {mode}")
        r = out["streaming"][mode] = streaming(mode, args)
        rows.append([f"streaming, {args.n} x {args.mb} MB", label, B.fmt_s(r["wall"]), B.mib(r["rss"]), ""])
    for mode, label in (("default", "held, default budget"), ("unbounded", "held, hold-bytes null")):
        B.log(f"replay: {mode}")
        r = out["replay"][mode] = replay(mode, args)
        rows.append([f"replay, {args.replay_n} x {args.replay_mb} MB, one kill", label, "", "",
                     f"{r['again']} of {r['children']}"])
    B.report(["scenario", "hold", "wall (s)", "peak worker RSS above idle (MiB)", "children run again"],
             rows,
             B.fill("2 worker processes x 1 thread, one run per row. The default budget is "
                    "coro.durability.hold-bytes 64 MiB per worker of consumed children; a re-run "
                    "computes again the consumed children the budget let go of."))
    B.write_json(args.json, out)
    return out


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("hold", "Holding children for a re-run, bounded: a streaming loop's peak memory "
               "(default budget, hold off, plain worker_client) and children run again after a kill "
               "(default budget, unbounded)",
               [], 300),
]


if __name__ == "__main__":
    sys.exit(main() and 0)
