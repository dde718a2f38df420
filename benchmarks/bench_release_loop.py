"""Worker release for a coroutine's children: a loop of N sequential yields,
each child returning an array of --kb KB, with coro.durability.hold-children
off (children released once the coroutine resumed) and worker release off
(plain: the scheduler's free-keys) or on (the worker lets go at resume).

Run: python benchmarks/bench_release_loop.py [--n 10000] [--kb 100] [--delay-n 2000]
     [--delay 0.02] [--quick]
1 worker process x 1 thread, so the children run beside their coroutine. Two
loads: none (N yields) and delay (--delay-n yields, the scheduler's
task-finished handler sleeping --delay s a message). Reported: wall, the most
keys alive on the scheduler and results in the worker's memory (sampled
every 10 ms), peak worker RSS above idle, and how many children went early.
"""

from __future__ import annotations

import sys
import threading
import time

import _bench as B
import numpy as np

from dask_coro import coroutine
from dask_coro.release.scheduler import NAME


@coroutine(inline=False)
def child(i, n):
    return np.full(n, float(i))


@coroutine
def loop(count, n):
    total = 0.0
    for i in range(count):
        total += (yield child(i, n))[0]
    return total


def _tasks(dask_scheduler=None) -> int:
    return len(dask_scheduler.tasks)


def _early(dask_scheduler=None) -> int:
    p = dask_scheduler.plugins.get(NAME)
    return 0 if p is None else p.released_early


def _in_memory(dask_worker=None) -> int:
    return len(dask_worker.data)


def run(enabled: bool, count: int, delay: float, args) -> dict:
    settings = {"coro.worker-release.enabled": enabled, "coro.durability.hold-children": False}
    with B.cluster(n_workers=1, config=settings) as client:
        if enabled:
            B.release_plugin(client, 1)
        client.run_on_scheduler(B.slow_task_finished, delay)
        n = args.kb * 1024 // 8
        procs = list(B.worker_processes(client).values())
        base = sum(p.memory_info().rss for p in procs)
        peaks = {"keys": 0, "data": 0}
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                peaks["keys"] = max(peaks["keys"], client.run_on_scheduler(_tasks))
                peaks["data"] = max(peaks["data"], max(client.run(_in_memory).values()))
                stop.wait(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        with B.ProcSampler(lambda: procs, 0.01) as sampler:
            watcher.start()
            t0 = time.perf_counter()
            got = client.compute(loop(count, n)).result()
            wall = time.perf_counter() - t0
            stop.set()
            watcher.join()
        assert got == float(sum(range(count))), got
        return {"wall": wall, "keys": peaks["keys"], "data": peaks["data"],
                "rss": sampler.peak["rss"] - base, "early": client.run_on_scheduler(_early)}


def main(argv=None) -> dict:
    p = B.parser(__doc__, repeat=None)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--kb", type=int, default=100)
    p.add_argument("--delay-n", type=int, default=2_000)
    p.add_argument("--delay", type=float, default=0.02)
    args = B.parse(p, argv, {"n": 200, "delay_n": 50})
    rows, out = [], {}
    for load, count, delay in (("none", args.n, 0.0), ("delay", args.delay_n, args.delay)):
        res = {}
        for enabled in (False, True):
            B.log(f"{load}: {count} yields, worker release {'on' if enabled else 'off'}")
            res[enabled] = run(enabled, count, delay, args)
            r = res[enabled]
            rows.append([load, count, "on" if enabled else "off (plain)", B.fmt_s(r["wall"]), r["keys"],
                         r["data"], B.mib(r["rss"]), r["early"]])
        out[load] = {"off": res[False], "on": res[True]}
        rows.append([load, count, "**on / off**", B.ratio(res[True]["wall"], res[False]["wall"]),
                     B.ratio(res[True]["keys"], res[False]["keys"]),
                     B.ratio(res[True]["data"], res[False]["data"]),
                     B.ratio(res[True]["rss"], res[False]["rss"]), ""])
    B.report(["load", "yields", "worker release", "wall (s)", "most keys on the scheduler",
              "most results in worker memory", "peak worker RSS (MiB)", "children released early"],
             rows,
             B.fill(f"A loop of sequential yields, each child a {args.kb} KB array, "
                    "coro.durability.hold-children off, 1 worker x 1 thread; one run per row. "
                    f"Delay load: {args.delay * 1000:.0f} ms of sleep in the scheduler's "
                    "task-finished handler."))
    B.write_json(args.json, out)
    return out


SCENARIOS = [  # its section of RESULTS.md, run by run_all.py
    B.Scenario("release_loop", "Worker release for a coroutine's children: a 2,000-yield loop",
               ["--n", "2000", "--delay-n", "500"], 300,
               notes="The 10,000-yield loop (the defaults, about 6 minutes) has a section of its own."),
]


if __name__ == "__main__":
    sys.exit(main() and 0)
