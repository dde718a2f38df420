"""10,000 coroutines suspended at once, each waiting on one child held back by a gate (dask_coro
with inline off and with inline on): do they complete, peak OS threads, worker memory per
suspended coroutine; versus worker_client tasks waiting the same way.

Run: python benchmarks/bench_suspended.py [--n 10000] [--wc-n 2000] [--repeat 3] [--quick]
                                          [--alt coro coro_inline wc]
     python benchmarks/bench_suspended.py --tracemalloc 2000   (where the memory goes)
2 worker processes x 1 thread; a fresh cluster per run and alternative. The
gate is a task restricted to a resource no worker has (it stays in no-worker
on the scheduler); each waiter yields one child that depends on it. When every
waiter is suspended, one worker is given the resource and everything runs.
The child is a `Future`, never a coroutine call, so it is a task and the
waiter suspends with `coro.inline.enabled` on as well as off; a waiter whose
child were a `@coroutine` call with plain arguments would, inline on, run it
in its own step and never suspend.
"""

from __future__ import annotations

import sys
import time

import _bench as B
from distributed import Future, get_worker, worker_client

from dask_coro import coroutine
from dask_coro._internals.distributed.worker_state_machine import secede_from_loop


def _identity(x):
    return x


@coroutine
def waiter(i, gate_key):
    gate = yield Future(gate_key)  # one child: a task of ours that depends on the gate
    return gate + i


def wc_waiter(i, gate_key):
    with worker_client() as c:
        child = c.submit(_identity, Future(gate_key, c), pure=False)
        gate = child.result()  # the thread blocks here, seceded
    return gate + i


async def floor_waiter(i, gate_key, key):
    """distributed alone, the same wait with no dask_coro code: an async task
    (on the worker's event loop) that frees its slot as a seceded task does,
    submits the same child through the worker's client and awaits it."""
    worker = get_worker()
    client = worker._get_client()
    secede_from_loop(worker, key, 0.0)
    child = client.submit(_identity, Future(gate_key, client), pure=False)
    gate = await child
    return gate + i


async def bare_waiter(i, key):
    """The least a waiting distributed task holds: a seceded async task
    awaiting an event of its worker's, with no child and no future."""
    worker = get_worker()
    secede_from_loop(worker, key, 0.0)
    event = _bare_event(worker)
    await event.wait()
    return 1000 + i


def _bare_event(worker):
    import asyncio

    event = getattr(worker, "_bench_bare_event", None)
    if event is None:
        event = worker._bench_bare_event = asyncio.Event()
    return event


async def _open_bare(dask_worker=None) -> None:
    event = _bare_event(dask_worker)
    event.set()
    dask_worker._bench_bare_event = None  # the next round's waiters wait again


def _tm_start(dask_worker=None) -> None:
    import tracemalloc

    tracemalloc.start(12)
    dask_worker._bench_tm_base = tracemalloc.take_snapshot()


def _tm_diff(dask_worker=None) -> list[tuple[str, int, str, int, int]]:
    """(file, line, source, bytes, blocks) allocated since _tm_start and still
    alive, each charged to the innermost frame in dask_coro, distributed or
    dask (the code that asked for it, not the library plumbing under it)."""
    import linecache
    import re
    import tracemalloc

    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    ours = re.compile(r"/(dask_coro|distributed|dask)/")
    out = []
    for st in snap.compare_to(dask_worker._bench_tm_base, "traceback"):
        frames = list(st.traceback)  # oldest first
        frame = next((f for f in reversed(frames) if ours.search(f.filename)), frames[-1])
        parts = frame.filename.replace("\\", "/").split("/")
        short = "/".join(parts[-2:])
        src = linecache.getline(frame.filename, frame.lineno).strip()
        out.append((short, frame.lineno, src, st.size_diff, st.count_diff))
    return out


INLINE = {"coro": False, "coro_inline": True, "wc": None, "floor": None, "bare": None}
LABEL = {"coro": "dask_coro coroutines, inline off",
         "coro_inline": "dask_coro coroutines, inline on (default)", "wc": "worker_client tasks",
         "floor": "floor: distributed alone, an async task awaiting the same child (no dask_coro)",
         "bare": "floor: a seceded async task awaiting an event, no child (no dask_coro)"}


def run_once(alt: str, n: int, settle: float, timeout: float, trace: bool = False) -> dict:
    with B.cluster(inline=INLINE[alt]) as client:
        procs = list(B.worker_processes(client).values())
        # Warm-up: imports, dask_coro's plugins and the workers' own clients.
        _one_round(client, alt, 50, timeout, warm=True)
        if trace:
            client.run(_tm_start)
        sampler = B.ProcSampler(lambda: procs, interval=0.2)
        base = sampler.sample()
        with sampler:
            out = _one_round(client, alt, n, timeout, settle=settle, procs=procs, trace=trace)
        out.update(base=base, peak=sampler.peak)
    return out


def _one_round(client, alt, n, timeout, warm=False, settle=0.0, procs=(), trace=False) -> dict:
    # A new gate per round: the gate of an earlier round was opened for good.
    gate = B.Gate(client)
    tag = gate.tag
    start = time.perf_counter()
    if alt in ("coro", "coro_inline"):
        futs = client.compute([waiter(i, gate.key) for i in range(n)])
        prefix = "waiter-"
    elif alt in ("floor", "bare"):
        prefix = f"{alt}_waiter-{tag}-"
        keys = [f"{prefix}{i}" for i in range(n)]
        if alt == "floor":
            futs = client.map(floor_waiter, range(n), [gate.key] * n, keys, key=keys)
        else:
            futs = client.map(bare_waiter, range(n), keys, key=keys)
    else:
        # Keys of this round only: reusing the warm-up's keys would hand back
        # its results, still in memory, instead of running new waiters.
        prefix = f"wc_waiter-{tag}-"
        futs = client.map(wc_waiter, range(n), gate_key=gate.key, pure=False,
                          key=[f"{prefix}{i}" for i in range(n)])
    gate.wait_suspended(prefix, n, timeout)
    suspend_s = time.perf_counter() - start
    out = {"suspend_s": suspend_s}
    if not warm:
        time.sleep(settle)  # let the allocator and the event loops settle
        at = B.ProcSampler(lambda: list(procs)).sample()
        out["at"] = at
        out["gate_state"] = client.run_on_scheduler(_state, key=gate.key)
        if trace:
            out["trace"] = [row for rows in client.run(_tm_diff).values() for row in rows]
        B.log(f"{alt}: {n} suspended after {suspend_s:.1f} s; threads {at['threads_total']}, "
              f"RSS {B.mib(at['rss'])} MiB")
    start = time.perf_counter()
    gate.open()
    if alt == "bare":
        client.run(_open_bare)
    results = client.gather(futs)
    out["release_s"] = time.perf_counter() - start
    assert results == [1000 + i for i in range(n)], results[:5]
    del futs, gate
    return out


def _state(dask_scheduler, key) -> str:
    ts = dask_scheduler.tasks.get(key)
    return ts.state if ts else "forgotten"


def main(argv=None) -> int:
    p = B.parser(__doc__)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--wc-n", type=int, default=2000,
                   help="waiters for worker_client (0: skip); 10,000 take minutes to suspend")
    p.add_argument("--settle", type=float, default=1.0, help="s to wait before the memory sample")
    p.add_argument("--timeout", type=float, default=120.0, help="s to get all waiters suspended")
    p.add_argument("--top", type=int, default=15, help="lines listed with --tracemalloc")
    p.add_argument("--tracemalloc", type=int, default=0, metavar="N",
                   help="instead: one run of N coroutines under tracemalloc, and where their "
                        "memory was allocated")
    p.add_argument("--alt", nargs="+", default=list(INLINE), choices=list(INLINE))
    args = B.parse(p, argv, quick={"n": 100, "wc_n": 50, "repeat": 1, "settle": 0.2,
                                   "timeout": 30.0})
    if args.tracemalloc:
        return breakdown(args)
    alts = {a: (args.wc_n if a == "wc" else args.n) for a in args.alt}  # floors: --n
    res: dict[str, list[dict]] = {a: [] for a, k in alts.items() if k}
    errors: dict[str, str] = {}
    for alt in B.interleaved(res, args.repeat):
        if alt in errors:
            continue
        try:
            res[alt].append(run_once(alt, alts[alt], args.settle, args.timeout))
        except Exception as e:  # reported, not hidden: "completes?" is the question
            errors[alt] = f"{type(e).__name__}: {e}"
            B.log(f"{alt}: {errors[alt]}")
    rows, summary = [], {}
    for alt, runs in res.items():
        n = alts[alt]
        if not runs:
            rows.append([LABEL[alt], n, "no: " + errors[alt]] + ["-"] * 6)
            continue
        per = [(r["at"]["rss"] - r["base"]["rss"]) / n for r in runs]
        m = {
            "n": n,
            "completed": len(runs),
            "suspend_s": B.median([r["suspend_s"] for r in runs]),
            "release_s": B.median([r["release_s"] for r in runs]),
            "threads_at": B.median([r["at"]["threads_max"] for r in runs]),
            "threads_peak": max(r["peak"]["threads_max"] for r in runs),
            "threads_base": B.median([r["base"]["threads_max"] for r in runs]),
            "rss_base": B.median([r["base"]["rss"] for r in runs]),
            "rss_at": B.median([r["at"]["rss"] for r in runs]),
            "bytes_each": B.median(per),
            "bytes_each_runs": per,
            "gate_state": runs[0]["gate_state"],
        }
        summary[alt] = m
        rows.append([LABEL[alt], n, f"yes, {len(runs)} of {args.repeat} runs"
                     + (f" ({errors[alt]})" if alt in errors else ""),
                     B.fmt_s(m["suspend_s"]), B.fmt_s(m["release_s"]),
                     f"{m['threads_base']} / {m['threads_at']} / {m['threads_peak']}",
                     f"{B.mib(m['rss_base'])} / {B.mib(m['rss_at'])}",
                     f"{m['bytes_each'] / 1024:.1f}",
                     ", ".join(f"{x / 1024:.1f}" for x in per)])
    gate_state = summary.get("coro", summary.get("wc", {})).get("gate_state", "?")
    B.report(["waiters", "n", "completed?", "all suspended after s", "done after release s",
              "OS threads, busiest worker: idle / all suspended / peak",
              "RSS of both workers MiB: idle / all suspended",
              "KiB per suspended waiter (median)", "runs KiB"], rows, B.fill(
        f"Medians of {args.repeat} runs, a fresh cluster per run and alternative (alternatives "
        "interleaved). A waiter is a root task; dask_coro's `yield`s a `Future` of the gate "
        "by key, which becomes one child task (`identity` of the gate) per waiter, with "
        "inline on too (a `Future` is never run inline): inline on adds the trampoline's "
        "frame and the poll for idle threads to each suspended waiter; "
        "worker_client's submits the same child and blocks in `result()` on a seceded thread. "
        "The floor rows have no dask_coro code: an async distributed task that frees its "
        "slot as a seceded task does (`_internals.secede_from_loop`) and awaits the same "
        "child's future (what any design whose waiting coroutine is a running task with a "
        "child future pays), or awaits an event of its worker with no child at all (what a "
        "waiting running task alone costs distributed). "
        "\"All suspended\": every waiter is `long-running` on its worker (the gate was in "
        f"state `{gate_state}` on the scheduler then). Memory: RSS of the two worker "
        f"processes summed, sampled {args.settle:.0f} s after the last waiter suspended, minus "
        "the same after a warm-up round of 50 waiters (imports, plugins, the workers' own "
        "clients), divided by the number of waiters: what a suspended waiter costs a worker, "
        "its task state, its child's future and, for worker_client, its thread's stack (the "
        "part of it that is touched). Threads: OS threads of the busiest worker process "
        "(`psutil` `num_threads`), sampled every 200 ms."))
    B.write_json(args.json, {"summary": summary, "errors": errors})
    return 0


def breakdown(args) -> int:
    """Where the memory of suspended coroutines is allocated, by source line."""
    n = args.tracemalloc
    r = run_once("coro", n, args.settle, args.timeout, trace=True)  # inline off
    by: dict[tuple[str, int, str], list[int]] = {}
    for f, line, src, size, count in r["trace"]:
        acc = by.setdefault((f, line, src), [0, 0])
        acc[0] += size
        acc[1] += count
    total = sum(v[0] for v in by.values())
    top = sorted(by.items(), key=lambda kv: -kv[1][0])[:args.top]
    rows = [[f"`{f}:{line}`", f"`{src[:70]}`", f"{size / n:.0f}", f"{count / n:.1f}",
             f"{size / total:.0%}"] for (f, line, src), (size, count) in top]
    rss = (r["at"]["rss"] - r["base"]["rss"]) / n
    B.report(["allocated under (file:line)", "source", "bytes per suspended coroutine",
              "blocks per coroutine", "share of traced"], rows, f"""\
{n} coroutines suspended at once, each on one child, one run under
`tracemalloc` (12 frames per allocation) started on both workers after the
warm-up: Python memory allocated since and still alive when all were
suspended, summed over both workers, {total / n:.0f} bytes per coroutine in all
({rss / 1024:.1f} KiB of RSS per coroutine in this run, tracemalloc's own
bookkeeping included). The top {args.top} source lines: an allocation is charged
to the innermost line of dask_coro, distributed or dask on its stack (the code
that asked for it, not asyncio's or the standard library's under it), not to
whoever keeps it alive.""")
    B.write_json(args.json, {"n": n, "traced_bytes_each": total / n, "rss_bytes_each": rss,
                             "top": [[f, line, src, size / n, count / n]
                                     for (f, line, src), (size, count) in top]})
    return 0


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("suspended", "10,000 coroutines suspended at once",
               ["--n", "10000", "--wc-n", "1000", "--repeat", "3", "--timeout", "90",
                "--alt", "coro", "wc"], 330,
               quick=["--alt", "coro", "wc"],
               notes="Inline off only, as the target measures suspended coroutines: "
                     "with inline on (the default) a waiter whose child were a `@coroutine` "
                     "call with plain arguments would run it inline and never suspend; this "
                     "waiter's child is a `Future`, which is never run inline, so inline on it "
                     "suspends all the same, through the same runner (`--alt coro_inline` "
                     "measures it: a trial with 2,000 waiters gave 30.4 KiB each inline on "
                     "against 30.5 KiB off). It is left out of the suite to keep it within 15 "
                     "minutes. worker_client is measured with 1,000 waiters for the same "
                     "reason: with 10,000 (`--wc-n 10000`, one thread each) getting them "
                     "all suspended takes minutes on this machine (a trial had about 9,400 "
                     "suspended after 200 s, and one run of 2,000 timed out at 180 s)."),
    B.Scenario("suspended_floor",
               "10,000 waiting tasks at once with no dask_coro code: distributed's own floor",
               ["--n", "10000", "--repeat", "1", "--timeout", "90", "--alt", "floor", "bare"], 300,
               quick=["--alt", "floor", "bare"],
               notes="One run each (a floor, not a comparison of medians): what a waiting "
                     "task costs a worker in distributed itself, with the same child future "
                     "as dask_coro's waiter, and with no child at all."),
    B.Scenario("suspended_memory",
               "Where the memory of a suspended coroutine goes (tracemalloc, inline off)",
               ["--tracemalloc", "1000", "--top", "15"], 60,
               quick=["--tracemalloc", "100", "--top", "5"]),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("suspended")
    summ = (d or {}).get("summary", {})
    errs = (d or {}).get("errors", {})
    c = summ.get("coro")
    if c:
        kib = c["bytes_each"] / 1024
        on = summ.get("coro_inline")
        done = c["completed"]
        rows.row("10,000 suspended coroutines complete, <= 10 KiB of worker memory each "
                 "(inline off: every waiter a suspended task)",
                 f"completed in {done} of {done + (1 if 'coro' in errs else 0)} runs; **{kib:.1f} KiB** "
                 f"each (RSS); peak {c['threads_peak']} OS threads in the busiest worker"
                 + (f". Inline on (the waiter's child is a `Future`, so it suspends too): "
                    f"{on['bytes_each'] / 1024:.1f} KiB each, completed in {on['completed']} runs"
                    if on else "")
                 + _floors(data("suspended_floor")),
                 B.yes(kib <= 10 and "coro" not in errs))
    else:
        err = errs.get("coro")
        rows.row("10,000 suspended coroutines complete, <= 10 KiB each",
                 f"did not complete: {err}" if err else "not measured in this run",
                 "**no**" if err else "-")
    return rows


def _floors(d) -> str:
    """distributed's own memory per waiting task, from the suspended_floor run."""
    summ = (d or {}).get("summary", {})
    parts = [f"{summ[a]['bytes_each'] / 1024:.1f} KiB {what}"
             for a, what in (("floor", "with the same child future"), ("bare", "with no child"))
             if a in summ]
    if not parts:
        return ""
    return (". distributed alone, a seceded async task waiting (no dask_coro): "
            + ", ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
