"""Worker release (coro.worker-release.enabled) against plain Dask: a tree
reduction with large leaves, the scheduler loaded or not.

Run: python benchmarks/bench_release.py [--leaves 256] [--mb 16] [--delay 0.05]
     [--load none delay tiny] [--saturation 1.1 inf] [--repeat 3] [--results] [--quick]
2 worker processes x 1 thread, a fresh cluster per (load, setting). The leaves
are NumPy arrays of --mb MB; each inner node adds two. Loads:
  none   the scheduler does nothing else;
  delay  the scheduler's handler of task-finished sleeps --delay s per message
         (a measured, artificial stand-in for a busy scheduler: every
         message after it waits too);
  tiny   a second client keeps 2,000 tiny tasks queued on the same cluster.
Saturation: distributed.scheduler.worker-saturation; 1.1 (distributed's
default) queues root tasks on the scheduler, inf hands every ready task to the
workers at once (no queuing). Worker memory is the RSS of the worker processes, sampled every 20 ms (peak
and mean over the run). "early" counts keys a worker released on its own;
"by the scheduler" every other release of a result.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

import _bench as B
import dask
import numpy as np
from distributed import Client, SchedulerPlugin

from dask_coro.release.scheduler import NAME, ReleasePlugin

ENV = "DASK_CORO__WORKER_RELEASE__ENABLED"


def leaf(i: int, n: int) -> np.ndarray:
    return np.full(n, float(i))


def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return x + y


def tree(leaves: int, n: int):
    level = [dask.delayed(leaf, pure=True)(i, n) for i in range(leaves)]
    while len(level) > 1:
        level = [dask.delayed(add, pure=True)(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return dask.delayed(lambda a: float(a[0]))(level[0])


class CountReleased(SchedulerPlugin):
    name = "bench-count-released"

    def __init__(self) -> None:
        self.released = 0

    def transition(self, key, start, finish, *args, **kwargs):
        if start == "memory" and finish == "released":
            self.released += 1


def _install_load(delay: float, dask_scheduler=None) -> None:
    dask_scheduler.add_plugin(CountReleased(), idempotent=True)
    B.slow_task_finished(delay, dask_scheduler=dask_scheduler)


def _counts(dask_scheduler=None) -> tuple[int, int]:
    early = dask_scheduler.plugins[NAME].released_early if NAME in dask_scheduler.plugins else 0
    return dask_scheduler.plugins["bench-count-released"].released, early


class MemSampler(B.ProcSampler):
    """Also keeps every RSS sample, for the mean."""

    def __init__(self, procs, interval: float):
        super().__init__(procs, interval)
        self.rss: list[int] = []

    def sample(self):
        out = super().sample()
        self.rss.append(out["rss"])
        return out


def _tiny_load(address: str, stop: threading.Event) -> None:
    with Client(address, set_as_default=False) as other:
        while not stop.is_set():
            futs = other.map(lambda x: x, range(2000), pure=False)
            other.gather(futs)
            del futs


def run(load: str, enabled: bool, args, saturation: str) -> dict:
    os.environ[ENV] = str(enabled)
    settings: dict = {"coro.worker-release.enabled": enabled,
                      "distributed.scheduler.worker-saturation": float(saturation)}
    with dask.config.set(settings), B.cluster() as client:
        if enabled:
            client.register_plugin(ReleasePlugin())
            B.log("  waiting for the worker plugins")
            deadline = time.monotonic() + 30
            while len(client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins[NAME].ready)) < 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        client.run_on_scheduler(_install_load, args.delay if load == "delay" else 0.0)
        n = args.mb * 1024 * 1024 // 8
        expect = float(sum(range(args.leaves)))
        base = sum(p.memory_info().rss for p in B.worker_processes(client).values())
        stop = threading.Event()
        loader = None
        if load == "tiny":
            loader = threading.Thread(target=_tiny_load, args=(client.scheduler.address, stop), daemon=True)
            loader.start()
            time.sleep(1.0)
        walls, peaks, means = [], [], []
        for _ in range(args.repeat):
            procs = list(B.worker_processes(client).values())
            sampler = MemSampler(lambda: procs, 0.02)
            with sampler:
                t0 = time.perf_counter()
                got = client.compute(tree(args.leaves, n)).result()
                walls.append(time.perf_counter() - t0)
            assert got == expect, (got, expect)
            peaks.append(sampler.peak["rss"] - base)
            means.append(statistics.fmean(sampler.rss) - base)
        stop.set()
        if loader is not None:
            loader.join()
        released, early = client.run_on_scheduler(_counts)
    os.environ.pop(ENV, None)
    return {"wall": B.median(walls), "walls": walls, "peak": B.median(peaks), "mean": B.median(means),
            "early": early, "by_scheduler": released - early}


def main(argv=None) -> dict:
    p = B.parser(__doc__, repeat=3)
    p.add_argument("--leaves", type=int, default=256)
    p.add_argument("--mb", type=int, default=16)
    p.add_argument("--delay", type=float, default=0.05)
    p.add_argument("--load", nargs="+", default=["none", "delay", "tiny"])
    p.add_argument("--saturation", nargs="+", default=["1.1", "inf"],
                   help="distributed.scheduler.worker-saturation values (1.1: distributed's default; inf: no queuing)")
    p.add_argument("--results", action="store_true", help="write the section of RESULTS.md")
    args = B.parse(p, argv, {"leaves": 16, "mb": 1, "load": ["none", "delay"], "repeat": 1})
    rows, out = [], {}
    for sat in args.saturation:
        for load in args.load:
            res = {}
            for enabled in (False, True):
                B.log(f"saturation {sat}, {load}: worker release {'on' if enabled else 'off'}")
                res[enabled] = run(load, enabled, args, sat)
            off, on = res[False], res[True]
            out[f"{sat}/{load}"] = {"off": off, "on": on}
            for enabled, r in ((False, off), (True, on)):
                rows.append([
                    sat, load, "on" if enabled else "off (plain Dask)", B.fmt_s(r["wall"]),
                    B.mib(r["peak"]), B.mib(r["mean"]), r["early"], r["by_scheduler"],
                ])
            rows.append([
                sat, load, "**on / off**", B.ratio(on["wall"], off["wall"]),
                B.ratio(on["peak"], off["peak"]), B.ratio(on["mean"], off["mean"]), "", "",
            ])
    header = ["saturation", "load", "worker release", "wall (s)", "peak worker RSS (MiB)",
              "mean worker RSS (MiB)", "released early", "by the scheduler"]
    note = B.fill(
        f"{args.leaves} leaves of {args.mb} MB summed pairwise, 2 workers x 1 thread, "
        f"medians of {args.repeat} run(s) per row; RSS of the worker processes above "
        f"their idle RSS, sampled every 20 ms. Delay load: {args.delay * 1000:.0f} ms of "
        "sleep in the scheduler's task-finished handler. Released early or by the "
        f"scheduler: releases of results over the {args.repeat} run(s) of a row (511 per run)."
    )
    B.report(header, rows, note)
    if args.results:
        command = "python benchmarks/bench_release.py " + " ".join(argv if argv is not None else sys.argv[1:])
        body = B.table(header, rows)
        B.replace_section(HEADING, f"{HEADING}\n\nCommand: `{command.strip()}`\n\n{body}\n\n{note}\n")
    B.write_json(args.json, out)
    return out


HEADING = "## Worker release: a tree reduction of large leaves, the scheduler loaded or not"


if __name__ == "__main__":
    sys.exit(main() and 0)
