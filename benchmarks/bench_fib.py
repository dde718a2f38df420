"""fib(n) with every call a task: dask_coro versus worker_client() versus Ray nested tasks (when Ray is installed), wall time, tasks per second, peak OS threads and processes on the workers.

Run: python benchmarks/bench_fib.py [--n 12 14 16] [--repeat 3] [--alt coro wc ray]
2 worker processes x 1 thread (Ray: ray.init(num_cpus=2)); a fresh cluster per
(n, alternative), one untimed fib(5) to warm it up, then --repeat timed runs.
Prints a Markdown table and notes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import _bench as B
import psutil
from distributed import worker_client

from dask_coro.examples import fib as coro_fib

ray = None  # imported by _import_ray() in the client process only: worker
# processes import this script too (as __mp_main__), and should not load Ray.


def wc_fib(i):
    if i < 2:
        return i
    with worker_client() as c:
        a, b = c.gather([c.submit(wc_fib, i - 1, pure=False), c.submit(wc_fib, i - 2, pure=False)])
    return a + b


def _ray_fib(i):
    if i < 2:
        return i
    a, b = ray.get([ray_fib.remote(i - 1), ray_fib.remote(i - 2)])  # blocks in the task
    return a + b


def _import_ray() -> bool:
    """Imports Ray (an optional extra) and makes ``ray_fib`` a remote function."""
    global ray, ray_fib
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray as _ray
    except ImportError:
        return False
    ray = _ray
    ray_fib = ray.remote(_ray_fib)
    return True


def _fib(i: int) -> int:
    return i if i < 2 else _fib(i - 1) + _fib(i - 2)


def tasks_of(n: int) -> int:
    """Calls of fib(n), every one a task."""
    return 2 * _fib(n + 1) - 1


def measure_dask(alt: str, n: int, repeat: int) -> dict:
    with B.cluster() as client:
        procs = list(B.worker_processes(client).values())
        if alt == "coro":
            def run(k):
                return client.compute(coro_fib(k)).result()
        else:
            def run(k):
                return client.submit(wc_fib, k, pure=False).result()
        assert run(5) == 5  # warm-up: imports, plugins, the workers' clients
        base = B.ProcSampler(lambda: B.with_descendants(procs)).sample()
        walls = []
        with B.ProcSampler(lambda: B.with_descendants(procs)) as s:
            for _ in range(repeat):
                wall, value = B.timed(lambda: run(n))
                assert value == _fib(n), value
                walls.append(wall)
                B.log(f"fib({n}) {alt}: {wall:.2f} s")
    return _result(n, walls, s.peak, base)


def _ray_workers() -> list[psutil.Process]:
    """Ray's worker processes: the raylet's children that run tasks (their
    title is ray::IDLE or ray::<function>), not its agents."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            title = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if title.startswith("ray::") and "Agent" not in title.split()[0]:
            out.append(p)
    return out


def measure_ray(n: int, repeat: int) -> dict:
    ray.init(num_cpus=B.N_WORKERS * B.THREADS_PER_WORKER, include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    try:
        assert ray.get(ray_fib.remote(5)) == 5
        base = B.ProcSampler(_ray_workers).sample()
        walls = []
        with B.ProcSampler(_ray_workers) as s:
            for _ in range(repeat):
                wall, value = B.timed(lambda: ray.get(ray_fib.remote(n)))
                assert value == _fib(n), value
                walls.append(wall)
                B.log(f"fib({n}) ray: {wall:.2f} s")
    finally:
        ray.shutdown()
    return _result(n, walls, s.peak, base)


def _result(n, walls, peak, base) -> dict:
    wall = B.median(walls)
    return {"wall": wall, "walls": walls, "tasks": tasks_of(n), "tasks_per_s": tasks_of(n) / wall,
            **{f"peak_{k}": v for k, v in peak.items()},
            **{f"base_{k}": v for k, v in base.items()}}


LABEL = {"coro": "dask_coro", "wc": "worker_client", "ray": "Ray nested tasks"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, nargs="+", default=[12, 14, 16])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--alt", nargs="+", default=["coro", "wc", "ray"], choices=list(LABEL))
    p.add_argument("--json", help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    have_ray = "ray" in args.alt and _import_ray()
    alts = [a for a in args.alt if a != "ray" or have_ray]
    res: dict[int, dict[str, dict]] = {}
    # Ray's driver prints its raylet's warnings to sys.stdout; stdout is the
    # Markdown result, so while measuring they go to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        for n in args.n:
            res[n] = {}
            for alt in alts:
                res[n][alt] = (measure_ray(n, args.repeat) if alt == "ray"
                               else measure_dask(alt, n, args.repeat))
    rows = []
    for n in args.n:
        wc = res[n].get("wc", {}).get("wall")
        for alt in alts:
            r = res[n][alt]
            rows.append([n, r["tasks"], LABEL[alt], B.fmt_s(r["wall"]), B.runs(r["walls"]),
                         f"{r['tasks_per_s']:.0f}", B.ratio(r["wall"], wc),
                         f"{r['peak_threads_max']} ({r['base_threads_max']})",
                         f"{r['peak_threads_total']} ({r['base_threads_total']})",
                         f"{r['peak_procs']} ({r['base_procs']})"])
    print(B.table(["n", "tasks", "alternative", f"wall s, median of {args.repeat}", "runs s",
                   "tasks/s", "wall / worker_client", "peak OS threads, busiest worker process (idle)",
                   "peak OS threads, all worker processes (idle)", "peak worker processes (idle)"],
                  rows))
    print()
    print(NOTES)
    if "ray" in args.alt and not have_ray:
        print("\nRay is not installed (`pip install ray`): its rows were skipped.")
    B.write_json(args.json, {"results": {str(n): v for n, v in res.items()},
                             "ray": ray.__version__ if have_ray else None})
    return 0


NOTES = """\
Wall time: from submitting fib(n) to its value on the client. Every call of
fib is a task: dask_coro's generator coroutine (`dask_coro.examples.fib`,
children yielded as one list per call), `worker_client()` (the task submits
its two children and blocks in `gather` on a seceded thread), and Ray
(`@ray.remote` fib calling `ray.get` on its two children inside the task).
Threads and processes are sampled every 50 ms from /proc (`psutil`
`num_threads`, OS threads, not only Python's) over the timed runs of one
(n, alternative); "(idle)" is the same quantity after the warm-up, before the
timed runs. Worker processes: Dask's 2 worker processes (and any children),
Ray's worker processes (`ray::IDLE` / `ray::ray_fib`; its raylet, GCS and
agents not counted). A blocked `ray.get` inside a task gives its CPU back and
Ray starts further worker processes to run the children (it warns that
"N PYTHON worker processes have been started ... tasks blocked in ray.get()"):
nested blocking gets cost whole processes there, as they cost threads with
`worker_client`."""


if __name__ == "__main__":
    sys.exit(main())
