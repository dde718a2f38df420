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

import statistics
import sys
import threading
import time

import _bench as B
import dask
import numpy as np
from distributed import Client, SchedulerPlugin

from dask_coro.release.scheduler import NAME


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
    # The saturation is the scheduler's (in this process) alone; float("inf")
    # has no literal for the workers' environment.
    with dask.config.set({"distributed.scheduler.worker-saturation": float(saturation)}), \
            B.cluster(config={"coro.worker-release.enabled": enabled}) as client:
        if enabled:
            B.release_plugin(client, 2)
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
    return {"wall": B.median(walls), "walls": walls, "peak": B.median(peaks), "mean": B.median(means),
            "early": early, "by_scheduler": released - early}


def main(argv=None) -> dict:
    p = B.parser(__doc__, repeat=3, write=True)
    p.add_argument("--leaves", type=int, default=256)
    p.add_argument("--mb", type=int, default=16)
    p.add_argument("--delay", type=float, default=0.05)
    p.add_argument("--load", nargs="+", default=["none", "delay", "tiny"])
    p.add_argument("--saturation", nargs="+", default=["1.1", "inf"],
                   help="distributed.scheduler.worker-saturation values (1.1: distributed's default; inf: no queuing)")
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
    if args.write:
        B.write_section(HEADING, "bench_release.py", argv, B.table(header, rows), note)
    B.write_json(args.json, out)
    return out


HEADING = "## Worker release: a tree reduction of large leaves, the scheduler loaded or not"


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("release", "Worker release: a tree reduction of large leaves, the scheduler loaded "
               "or not", ["--repeat", "1"], 420, quick=["--repeat", "1"],
               notes="One run per row to keep the suite within 15 minutes; "
                     "`python benchmarks/bench_release.py --results` (3 runs a row, ~12 minutes) "
                     "gave the medians quoted in README.md."),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("release")
    if d and "inf/delay" in d:
        target = ("worker release, tree reduction of large leaves, scheduler loaded: peak worker "
                  "memory >= 30% lower, wall not worse")

        def pair(k):
            on, off = d[k]["on"], d[k]["off"]
            return on["peak"] / off["peak"], on["wall"] / off["wall"]

        pq, wq = pair("inf/delay")
        text = f"**{pq:.2f} x** peak, {wq:.2f} x wall without root-task queuing"
        if "1.1/delay" in d:
            p1, w1 = pair("1.1/delay")
            text += f"; {p1:.2f} x peak, {w1:.2f} x wall with distributed's default queuing"
        rows.row(target, text, B.yes(pq <= 0.7 and wq <= 1.1) + " (no queuing)")
    else:
        rows.missing("worker release: peak worker memory >= 30% lower under scheduler load")
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
