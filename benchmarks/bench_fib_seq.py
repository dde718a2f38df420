"""fib(25) with every call a dask_coro coroutine and no manual cutoff, versus plain sequential Python fib(25) in one process; bounded by a timeout, with the rate measured on a smaller fib to extrapolate.

Run: python benchmarks/bench_fib_seq.py [--n 25] [--timeout 300] [--small 16] [--repeat 3]
2 worker processes x 1 thread. Sequential Python: median of --repeat x 5 runs
in this process. Coroutines: fib(--small) --repeat times (the rate), then one
attempt at fib(--n) on a fresh cluster, given up after --timeout seconds (it
is one run, not a median: a run takes the whole budget).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time

import _bench as B

from dask_coro.examples import fib as coro_fib


def seq_fib(i: int) -> int:
    return i if i < 2 else seq_fib(i - 1) + seq_fib(i - 2)


def tasks_of(n: int) -> int:
    return 2 * seq_fib(n + 1) - 1


def small_rate(n: int, repeat: int) -> list[float]:
    with B.cluster() as client:
        assert client.compute(coro_fib(5)).result() == 5
        walls = []
        for _ in range(repeat):
            wall, value = B.timed(lambda: client.compute(coro_fib(n)).result())
            assert value == seq_fib(n)
            walls.append(wall)
            B.log(f"fib({n}) coroutines: {wall:.2f} s")
    return walls


def attempt(n: int, timeout: float) -> dict:
    """One run of fib(n), given up after ``timeout`` s: how far it got."""
    out: dict = {"finished": False}
    with B.cluster() as client:
        assert client.compute(coro_fib(5)).result() == 5
        B.tasks_done(client, reset=True)
        procs = list(B.worker_processes(client).values())
        base = B.ProcSampler(lambda: procs).sample()
        with B.ProcSampler(lambda: procs, interval=0.5) as s:
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
                left = -1
                while time.perf_counter() - stop < 60:
                    left = client.run_on_scheduler(_n_tasks)
                    if left == 0:
                        break
                    time.sleep(0.5)
                out["cancel_s"] = time.perf_counter() - stop
                out["left_after_cancel"] = left
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
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=25)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds given to fib(--n)")
    p.add_argument("--small", type=int, default=16, help="fib(n) whose rate is extrapolated")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    n, total = args.n, tasks_of(args.n)

    seq = []
    for _ in range(args.repeat * 5):
        wall, _ = B.timed(lambda: seq_fib(n))
        seq.append(wall)
    seq_s = B.median(seq)
    B.log(f"sequential fib({n}): {seq_s * 1000:.1f} ms")

    small = small_rate(args.small, args.repeat)
    small_s = B.median(small)
    rate = tasks_of(args.small) / small_s
    run = attempt(n, args.timeout)
    if run["finished"]:
        coro_s, how = run["wall"], "measured"
        assert run["value"] == seq_fib(n), run["value"]
    else:
        coro_s, how = total / rate, f"did not finish in {args.timeout:.0f} s; extrapolated"
    big_rate = run["done"] / run["elapsed"]
    rows = [
        [f"sequential Python fib({n}), one process", f"{seq_s * 1000:.1f} ms",
         f"median of {len(seq)}", "1"],
        [f"dask_coro fib({args.small}), every call a coroutine ({tasks_of(args.small)} tasks)",
         B.fmt_s(small_s) + " s", f"median of {args.repeat}: {B.runs(small)}; {rate:.0f} tasks/s", "-"],
        [f"dask_coro fib({n}), every call a coroutine ({total} tasks)",
         (B.fmt_s(run["wall"]) + " s") if run["finished"] else f"> {args.timeout:.0f} s",
         ("one run" if run["finished"] else
          f"one run, stopped at {args.timeout:.0f} s with {run['done']} tasks done "
          f"({run['done'] / total:.0%}): {big_rate:.0f} tasks/s"),
         f"{coro_s / seq_s:,.0f}" + ("" if run["finished"] else " (extrapolated)")],
    ]
    print(B.table(["", "wall", "runs", f"/ sequential fib({n})"], rows))
    print()
    if run["finished"]:
        how = f"fib({n}) with every call a coroutine finished in {B.fmt_s(coro_s)} s."
    else:
        how = (f"fib({n}) with every call a coroutine did not finish in {args.timeout:.0f} s; "
               f"at the fib({args.small}) rate ({rate:.0f} tasks/s) it would take about "
               f"{B.fmt_s(coro_s)} s, at the rate of the attempt itself about "
               f"{B.fmt_s(total / big_rate) if big_rate else '-'} s (the rate falls as the "
               "tree of suspended coroutines grows).")
    text = (f"{how} Sequential Python does one call in about {seq_s / total * 1e9:.0f} ns; "
            f"a coroutine task costs about {1e6 / rate:.0f} us of wall time on this cluster, "
            "so a coroutine per call only pays where a call does milliseconds of work: "
            "give fib a cutoff below which it recurses in plain Python. "
            f"During the attempt the two workers' RSS went from {B.mib(run['base_rss'])} MiB "
            f"to at most {B.mib(run['peak_rss'])} MiB and the busiest worker process had at "
            f"most {run['peak_threads']} OS threads. "
            + ("" if run["finished"] else _cancel_note(run) + " ")
            + "Tasks done are counted by a scheduler plugin (transitions to memory); the "
            f"fib({n}) attempt is one run, not a median, because it takes the whole budget.")
    print(textwrap.fill(text, 79, break_on_hyphens=False))
    B.write_json(args.json, {"n": n, "tasks": total, "seq_s": seq_s, "seqs": seq,
                             "small": args.small, "small_s": small_s, "smalls": small,
                             "small_rate": rate, "attempt": run, "coro_s": coro_s,
                             "extrapolated": not run["finished"], "timeout": args.timeout})
    return 0


if __name__ == "__main__":
    sys.exit(main())
