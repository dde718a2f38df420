"""fib(n) with every call a coroutine: dask_coro with calls run inline (the default) and with every
call a task, versus worker_client() and Ray nested tasks (when Ray is installed), and distributed's
own floor for a task that waits for its children without a thread: wall time, calls per second,
tasks run, peak OS threads and processes on the workers.

Run: python benchmarks/bench_fib.py [--n 12 14 16] [--repeat 3] [--alt inline tasks wc floor ray]
     [--quick]
2 worker processes x 1 thread (Ray: ray.init(num_cpus=2)); a fresh cluster per
(n, alternative), one untimed fib(5) to warm it up, then --repeat timed runs.
dask_coro's two rows differ only by `coro.inline.enabled`, set before the
cluster starts. Prints a Markdown table and notes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import uuid

import _bench as B
import psutil
from distributed import get_worker, worker_client

from dask_coro._internals.distributed.worker_state_machine import secede_from_loop
from dask_coro.examples import fib as coro_fib

ray = None  # imported by _import_ray() in the client process only: worker
# processes import this script too (as __mp_main__), and should not load Ray.


def wc_fib(i):
    if i < 2:
        return i
    with worker_client() as c:
        a, b = c.gather([c.submit(wc_fib, i - 1, pure=False), c.submit(wc_fib, i - 2, pure=False)])
    return a + b


async def floor_fib(i, key):
    """What distributed alone needs for a task that waits for its children
    holding no thread, with no dask_coro code on the way: an async task (run
    on the worker's event loop) that frees its slot as a seceded task does,
    submits both children in one message through the worker's client and
    awaits them. Each task is given its key: an async task cannot learn it."""
    if i < 2:
        return i
    worker = get_worker()
    client = worker._get_client()
    secede_from_loop(worker, key, 0.0)
    keys = [f"floor_fib-{uuid.uuid4().hex}" for _ in range(2)]
    children = client.map(floor_fib, [i - 1, i - 2], keys, key=keys)
    a, b = await client.gather(children, asynchronous=True)
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


def measure_dask(alt: str, n: int, repeat: int) -> dict:
    with B.cluster(inline={"inline": True, "tasks": False}.get(alt)) as client:
        if alt in ("inline", "tasks"):
            def run(k):
                return client.compute(coro_fib(k)).result()
        elif alt == "floor":
            def run(k):
                key = f"floor_fib-{uuid.uuid4().hex}"
                return client.submit(floor_fib, k, key, key=key).result()
        else:
            def run(k):
                return client.submit(wc_fib, k, pure=False).result()
        assert run(5) == 5  # warm-up: imports, plugins, the workers' clients
        sampler = B.worker_sampler(client, descendants=True)
        base = sampler.sample()
        with sampler:
            walls, ran = B.timed_runs(client, lambda: run(n), repeat, B.seq_fib(n),
                                      f"fib({n}) {alt}")
    return {**_result(n, walls, sampler.peak, base), "tasks_run": ran}


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
        sampler = B.ProcSampler(_ray_workers)
        base = sampler.sample()
        with sampler:
            walls, _ = B.timed_runs(None, lambda: ray.get(ray_fib.remote(n)), repeat,
                                    B.seq_fib(n), f"fib({n}) ray")
    finally:
        ray.shutdown()
    return _result(n, walls, sampler.peak, base)


def _result(n, walls, peak, base) -> dict:
    wall = B.median(walls)
    calls = B.fib_calls(n)
    return {"wall": wall, "walls": walls, "tasks": calls, "tasks_per_s": calls / wall,
            "tasks_run": None,
            **{f"peak_{k}": v for k, v in peak.items()},
            **{f"base_{k}": v for k, v in base.items()}}


LABEL = {"inline": "dask_coro, inline on (default)",
         "tasks": "dask_coro, inline off: every call a task",
         "wc": "worker_client",
         "floor": "floor: distributed alone, an async task awaiting its children (no dask_coro)",
         "ray": "Ray nested tasks"}


def main(argv=None) -> int:
    p = B.parser(__doc__, json=False)
    p.add_argument("--n", type=int, nargs="+", default=[12, 14, 16])
    p.add_argument("--alt", nargs="+", default=list(LABEL), choices=list(LABEL))
    p.add_argument("--json", help="also write the numbers to this JSON file (after every "
                                  "measurement, so a run stopped midway leaves what it had)")
    p.add_argument("--render", metavar="JSON", help="only print the table of such a file")
    args = B.parse(p, argv, quick={"n": [6, 8], "repeat": 1})
    if args.render:
        with open(args.render) as f:
            render(json.load(f))
        return 0
    have_ray = "ray" in args.alt and _import_ray()
    alts = [a for a in args.alt if a != "ray" or have_ray]
    data = {"results": {}, "ns": args.n, "alts": alts, "repeat": args.repeat, "partial": True,
            "ray": ray.__version__ if have_ray else None,
            "no_ray": "ray" in args.alt and not have_ray}
    # Ray's driver prints its raylet's warnings to sys.stdout; stdout is the
    # Markdown result, so while measuring they go to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        # Alternative by alternative, Ray last: a run stopped midway still has
        # dask_coro's and worker_client's rows.
        for alt in alts:
            for n in args.n:
                res = data["results"].setdefault(str(n), {})
                res[alt] = (measure_ray(n, args.repeat) if alt == "ray"
                            else measure_dask(alt, n, args.repeat))
                B.write_json(args.json, data)
    data["partial"] = False
    B.write_json(args.json, data)
    render(data)
    return 0


def render(data: dict) -> None:
    """The Markdown table and notes of a JSON file this script wrote."""
    rows, missing = [], []
    for n in data["ns"]:
        res = data["results"].get(str(n), {})
        wc = res.get("wc", {}).get("wall")
        for alt in data["alts"]:
            r = res.get(alt)
            if r is None:
                missing.append(f"fib({n}) {LABEL[alt]}")
                continue
            rows.append([n, r["tasks"], LABEL[alt], B.fmt_s(r["wall"]), B.runs(r["walls"]),
                         f"{r['tasks_per_s']:.0f}", B.counts(r["tasks_run"]),
                         B.ratio(r["wall"], wc),
                         f"{r['peak_threads_max']} ({r['base_threads_max']})",
                         f"{r['peak_threads_total']} ({r['base_threads_total']})",
                         f"{r['peak_procs']} ({r['base_procs']})"])
    print(B.table(["n", "calls", "alternative", *B.wall_header(data["repeat"]),
                   "calls/s", "tasks run per run (counted)", "wall / worker_client",
                   "peak OS threads, busiest worker process (idle)",
                   "peak OS threads, all worker processes (idle)", "peak worker processes (idle)"],
                  rows))
    print()
    if data["partial"]:
        print("**Stopped before the end** (its time budget ran out): not measured: "
              + ", ".join(missing) + ".")
        print()
    print(NOTES)
    if data["no_ray"]:
        print("\nRay is not installed (`pip install ray`): its rows were skipped.")


NOTES = """\
Wall time: from submitting fib(n) to its value on the client. Every call of
fib is a coroutine call (`dask_coro.examples.fib`, children yielded as one
list per call). With inline on (`coro.inline.enabled`, the default) a call
with plain arguments runs inside its parent's thread-pool step as a plain call
(no task, no key, no scheduler message); while the scheduler reports idle
threads, calls not started yet are handed out as tasks, so the other worker
gets work: "tasks run" counts what reached memory on the scheduler (the root,
and the calls handed out). With inline off every call is a task, as are
`worker_client()`'s (the task submits its two children and blocks in `gather`
on a seceded thread) and Ray's (`@ray.remote` fib calling `ray.get` on its two
children inside the task).
Threads and processes are sampled every 50 ms from /proc (`psutil`
`num_threads`, OS threads, not only Python's) over the timed runs of one
(n, alternative); "(idle)" is the same quantity after the warm-up, before the
timed runs. Worker processes: Dask's 2 worker processes (and any children),
Ray's worker processes (`ray::IDLE` / `ray::ray_fib`; its raylet, GCS and
agents not counted). A blocked `ray.get` inside a task gives its CPU back and
Ray starts further worker processes to run the children (it warns that
"N PYTHON worker processes have been started ... tasks blocked in ray.get()"):
nested blocking gets cost whole processes there, as they cost threads with
`worker_client`.
The floor row is what any design pays whose children are distributed tasks
submitted through the worker's client: `floor_fib` is an async task that
frees its slot as a seceded task does (`_internals.secede_from_loop`), sends
both children in one message and awaits them on the event loop, with no
dask_coro code (no planning, keys, cache, lanes or plugins): distributed's
own cost per child task, which the inline-off row can approach but not go
below."""


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("fib", "fib(n), every call a coroutine: dask_coro inline on and off versus "
               "worker_client() versus Ray nested tasks",
               ["--n", "12", "14", "16", "--repeat", "3"], 480, render=True),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("fib")
    r16 = d and d["results"].get("16", {})
    if r16 and {"inline", "wc"} <= r16.keys():
        c, w = r16["inline"], r16["wc"]
        r = c["wall"] / w["wall"]
        off = r16.get("tasks")
        rows.row("fib(16) <= 0.2 x worker_client's wall time",
                 f"**{r:.4f} x** with inline on, the default ({c['wall'] * 1000:.0f} ms vs "
                 f"{w['wall']:.2f} s)"
                 + (f"; inline off (every call a task): {off['wall'] / w['wall']:.2f} x "
                                          f"({off['wall']:.2f} s)" if off else ""),
                 B.yes(r <= 0.2))
        if off:
            ro = off["wall"] / w["wall"]
            fl = r16.get("floor")
            rows.row("fib(16), inline off (every call a task) <= 0.25 x worker_client's wall time",
                     f"**{ro:.2f} x** ({off['wall']:.2f} s vs {w['wall']:.2f} s)"
                     + (f"; distributed's own floor for such a task (an async task awaiting its "
                        f"children, no dask_coro): {fl['wall'] / w['wall']:.2f} x" if fl else "")
                     + "; see \"Where the time goes per child task\"", B.yes(ro <= 0.25))
        else:
            rows.missing("fib(16), inline off (every call a task) <= 0.25 x worker_client")
        limit = 1 + 10
        rows.row("fib(16): peak worker threads <= nthreads + 10 (1 + 10 per worker process)",
                 f"{c['peak_threads_max']} OS threads in the busiest worker process with inline on"
                 + (f", {off['peak_threads_max']} inline off" if off else "")
                 + f" (worker_client: {w['peak_threads_max']})",
                 B.yes(c["peak_threads_max"] <= limit and (not off or off["peak_threads_max"] <= limit)))
    else:
        rows.missing("fib(16) <= 0.2 x worker_client, threads <= nthreads + 10")

    if r16 and {"inline", "ray"} <= r16.keys():
        y, c = r16["ray"], r16["inline"]
        off = r16.get("tasks")
        rows.row("fib(16) against Ray nested tasks (no target)",
                 f"dask_coro {c['wall'] / y['wall']:.4f} x Ray's wall time inline on"
                 + (f", {off['wall'] / y['wall']:.2f} x inline off" if off else "")
                 + f"; Ray peaked at {y['peak_procs']} worker processes, "
                 f"{y['peak_threads_total']} threads",
                 "-")
    return rows


if __name__ == "__main__":
    sys.exit(main())
