"""fib(25) with every call a dask_coro coroutine and no manual cutoff, inline on (the default; 2
workers and 1) and inline off (every call a task), versus plain sequential Python fib(25) in one
process.

Run: python benchmarks/bench_fib_seq.py [--n 25] [--repeat 3] [--small 14] [--timeout 0] [--quick]
Sequential Python: median of --repeat x 5 runs in this process. Inline on:
--repeat runs of fib(--n) on 2 worker processes x 1 thread (with progress and tree's
counting of inline calls, the default, and with coro.tree.enabled off), then on 1 worker.
Inline off: fib(--n) is some 243,000 tasks (minutes on this machine), so its
time is extrapolated from --repeat runs of fib(--small); with --timeout > 0 it
also attempts fib(--n) itself, given up after that many seconds.
"""

from __future__ import annotations

import contextlib
import sys
import time

import _bench as B

from dask_coro.examples import fib as coro_fib

seq_fib = B.seq_fib
tasks_of = B.fib_calls


def timed_runs(n: int, repeat: int, inline: bool, n_workers: int = B.N_WORKERS,
               sampled: bool = True, tree: bool = True) -> dict:
    """--repeat runs of fib(n) on a fresh cluster: walls, tasks run, peaks."""
    # coro.tree.enabled: progress and tree, and their counts of inline calls
    with B.cluster(inline=inline, n_workers=n_workers,
                   config={"coro.tree.enabled": tree}) as client:
        assert client.compute(coro_fib(5)).result() == 5
        sampler = B.worker_sampler(client)
        base = sampler.sample()
        with sampler if sampled else contextlib.nullcontext():
            walls, ran = B.timed_runs(
                client, lambda: client.compute(coro_fib(n)).result(), repeat, seq_fib(n),
                f"fib({n}) inline={inline} on {n_workers} worker(s)")
    return {"walls": walls, "wall": B.median(walls), "tasks_run": ran,
            "peak_threads": sampler.peak["threads_max"], "peak_rss": sampler.peak["rss"],
            "base_rss": base["rss"], "base_threads": base["threads_max"]}


def attempt(n: int, timeout: float) -> dict:
    """One run of fib(n), given up after ``timeout`` s: how far it got."""
    out: dict = {"finished": False}
    with B.cluster(inline=False) as client:
        assert client.compute(coro_fib(5)).result() == 5
        B.tasks_done(client, reset=True)
        s = B.worker_sampler(client, interval=0.5)
        base = s.sample()
        with s:
            start = time.perf_counter()
            fut = client.compute(coro_fib(n))
            marks = []  # (elapsed, tasks done): the rate as the run goes on
            while time.perf_counter() - start < timeout:
                try:
                    value = fut.result(timeout=min(10.0, timeout - (time.perf_counter() - start)))
                except TimeoutError:
                    marks.append((time.perf_counter() - start, B.tasks_done(client)))
                    B.log(f"fib({n}): {marks[-1][1]} tasks done after {marks[-1][0]:.0f} s")
                    continue
                out.update(finished=True, wall=time.perf_counter() - start, value=value)
                break
            elapsed = time.perf_counter() - start
            done = B.tasks_done(client)
            out.update(elapsed=elapsed, done=done, marks=marks)
            if not out["finished"]:
                # The README: cancelling the root stops the whole tree and leaves
                # nothing on the scheduler. How long that takes, bounded.
                stop = time.perf_counter()
                fut.cancel()
                del fut
                with contextlib.suppress(TimeoutError):
                    B.wait_for(lambda: client.run_on_scheduler(_n_tasks) == 0, 60,
                               "the scheduler empty after cancelling", interval=0.5)
                out["cancel_s"] = time.perf_counter() - stop
                out["left_after_cancel"] = client.run_on_scheduler(_n_tasks)
        out.update(peak_rss=s.peak["rss"], base_rss=base["rss"], peak_threads=s.peak["threads_max"])
        t = time.perf_counter()
    out["close_s"] = time.perf_counter() - t
    return out


def _cancel_note(run: dict) -> str:
    if run["left_after_cancel"] == 0:
        how = f"left no task on the scheduler after {run['cancel_s']:.1f} s"
    else:
        how = (f"still left {run['left_after_cancel']} tasks on the scheduler after "
               f"{run['cancel_s']:.0f} s")
    return (f"Cancelling the root (the README: it stops the whole tree) then {how}; closing "
            f"the cluster took {run['close_s']:.1f} s.")


def _n_tasks(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


def main(argv=None) -> int:
    p = B.parser(__doc__)
    p.add_argument("--n", type=int, default=25)
    p.add_argument("--small", type=int, default=14,
                   help="fib(n) whose rate, inline off, is extrapolated to fib(--n)")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="s given to one attempt at fib(--n) with inline off (0: no attempt)")
    args = B.parse(p, argv, quick={"n": 12, "small": 6, "repeat": 1})
    n, total = args.n, tasks_of(args.n)

    # Sequential Python before and after the cluster runs: the faster median
    # is the reference. One taken alone, right after another scenario, once
    # read 71 ns a call against 37 (processes of the last scenario still
    # exiting), which would flatter every ratio below.
    seq_before, seq1 = B.median_of(lambda: seq_fib(n), args.repeat * 5)
    B.log(f"sequential fib({n}): {seq_before * 1000:.1f} ms")

    on2 = timed_runs(n, args.repeat, inline=True)
    off2 = timed_runs(n, args.repeat, inline=True, tree=False)
    on1 = timed_runs(n, args.repeat, inline=True, n_workers=1)
    seq_after, seq2 = B.median_of(lambda: seq_fib(n), args.repeat * 5)
    B.log(f"sequential fib({n}) after: {seq_after * 1000:.1f} ms")
    seq_s, seq = min((seq_before, seq1), (seq_after, seq2))
    small = timed_runs(args.small, args.repeat, inline=False, sampled=False)["walls"]
    small_s = B.median(small)
    rate = tasks_of(args.small) / small_s
    off_s = total / rate
    run = attempt(n, args.timeout) if args.timeout > 0 else None
    if run and run["finished"]:
        assert run["value"] == seq_fib(n), run["value"]
        off_s = run["wall"]

    rows = [
        [f"sequential Python fib({n}), one process", f"{seq_s * 1000:.1f} ms",
         f"median of {len(seq)}: {seq_s / total * 1e9:.0f} ns a call (the faster of the "
         f"medians before and after the cluster runs: {seq_before * 1000:.1f} and "
         f"{seq_after * 1000:.1f} ms)", "-", "1"],
        [f"dask_coro fib({n}), inline on (default), 2 workers", B.fmt_s(on2["wall"]) + " s",
         f"median of {args.repeat}: {B.runs(on2['walls'])}", B.counts(on2["tasks_run"]),
         f"**{on2['wall'] / seq_s:.0f}**"],
        [f"the same, `coro.tree.enabled` off (no counting of inline calls for progress and "
         f"tree): counting costs {on2['wall'] / off2['wall'] - 1:+.0%} here",
         B.fmt_s(off2["wall"]) + " s", f"median of {args.repeat}: {B.runs(off2['walls'])}",
         B.counts(off2["tasks_run"]), f"{off2['wall'] / seq_s:.0f}"],
        [f"dask_coro fib({n}), inline on (default), 1 worker", B.fmt_s(on1["wall"]) + " s",
         f"median of {args.repeat}: {B.runs(on1['walls'])}", B.counts(on1["tasks_run"]),
         f"{on1['wall'] / seq_s:.0f}"],
        [f"dask_coro fib({args.small}), inline off: every call a task",
         B.fmt_s(small_s) + " s",
         f"median of {args.repeat}: {B.runs(small)}; {rate:.0f} tasks/s",
         str(tasks_of(args.small)), f"{small_s / (seq_s * tasks_of(args.small) / total):,.0f}"],
    ]
    if run and run["finished"]:
        rows.append([f"dask_coro fib({n}), inline off: every call a task", B.fmt_s(off_s) + " s",
                     "one run", str(run["done"]), f"{off_s / seq_s:,.0f}"])
    else:
        what = ("" if run is None else
                f"; one attempt stopped at {args.timeout:.0f} s with {run['done']} tasks done")
        rows.append([f"dask_coro fib({n}), inline off: every call a task",
                     f"~{B.fmt_s(off_s)} s", f"extrapolated at the fib({args.small}) rate{what}",
                     f"{total} (all)", f"~{off_s / seq_s:,.0f}"])
    text = (
        f"fib({n}) has {total:,} calls. Sequential Python does one in about "
        f"{seq_s / total * 1e9:.0f} ns. With inline on (the default) every call is still a "
        f"`@coroutine` call, written as in `dask_coro.examples.fib`, and the whole tree takes "
        f"{B.fmt_s(on2['wall'])} s on 2 workers ({on2['wall'] / seq_s:.0f} x sequential, "
        f"{on2['wall'] / total * 1e6:.2f} us a call) and {B.fmt_s(on1['wall'])} s on 1 "
        f"({on1['wall'] / seq_s:.0f} x): the calls run inline in the root's thread-pool "
        "steps, and the few counted as tasks were handed out to the idle worker (work "
        "stealing). With inline off every call is a task, about "
        f"{1e6 / rate:.0f} us of wall time each on this cluster: fib({n}) would take "
        f"~{B.fmt_s(off_s)} s, ~{off_s / seq_s:,.0f} x sequential. "
        f"During the inline runs on 2 workers the busiest worker process had at most "
        f"{on2['peak_threads']} OS threads and the two workers' RSS went from "
        f"{B.mib(on2['base_rss'])} MiB to at most {B.mib(on2['peak_rss'])} MiB. "
        "Wall time is from `client.compute` to the value on the client; tasks run are "
        "transitions to memory on the scheduler (the root included).")
    notes = [B.fill(text)]
    if run and not run["finished"]:
        notes.append(B.fill(_cancel_note(run)))
    B.report(["", "wall", "runs", "tasks run per run (counted)",
              f"/ sequential fib({n}) (the fib({args.small}) row: per call)"], rows, *notes)
    B.write_json(args.json, {"n": n, "tasks": total, "seq_s": seq_s, "seqs": seq,
                             "inline2": on2, "inline2_tree_off": off2, "inline1": on1,
                             "seq_before_s": seq_before, "seq_after_s": seq_after,
                             "small": args.small, "small_s": small_s, "smalls": small,
                             "small_rate": rate, "tasks_s": off_s,
                             "tasks_extrapolated": not (run and run["finished"]),
                             "attempt": run})
    return 0


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("fib_seq", "fib(25), every call a coroutine, versus sequential Python",
               ["--n", "25", "--repeat", "3", "--small", "14"], 120,
               notes="Inline off, fib(25) is 242,785 tasks: minutes on this machine, too long "
                     "for the suite, so it is extrapolated from fib(14)'s rate, which flatters "
                     "it: an earlier suite's attempt at fib(25) itself (`--timeout 180`) had done "
                     "17% of the tasks after 180 s, the rate falling as the tree of suspended "
                     "coroutines grew (~1,100 s at that rate)."),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("fib_seq")
    if d and "inline2" in d:
        r = d["inline2"]["wall"] / d["seq_s"]
        rows.row(f"fib({d['n']}), every call a coroutine, no cutoff, <= 20 x sequential Python",
                 f"**{r:.0f} x** ({d['inline2']['wall'] * 1000:.0f} ms vs {d['seq_s'] * 1000:.1f} ms) "
                 f"inline on, 2 workers; {d['inline1']['wall'] / d['seq_s']:.0f} x on 1 worker; inline "
                 f"off ~{d['tasks_s']:.0f} s, ~{d['tasks_s'] / d['seq_s']:,.0f} x "
                 f"({'extrapolated' if d['tasks_extrapolated'] else 'measured'})",
                 B.yes(r <= 20))
    else:
        rows.missing("fib(25) <= 20 x sequential Python")
    return rows


if __name__ == "__main__":
    sys.exit(main())
