"""The chaos test's workloads at a larger size, N rounds under random worker kills: runs,
kills, wrong answers (must be 0) and the peak worker memory of each round, beside one round
without kills on the same cluster.

Run: python benchmarks/bench_chaos.py [--runs 5] [--size large] [--kills 5] [--write]
A LocalCluster of 3 Nanny workers x 1 thread, every coroutine call a task (as in
tests/runtime/test_chaos.py); the killer, the workloads and the rounds are tests/chaos.py's. A
round runs each workload once: fib(14), process_all, a promise, a shared-memory array,
a streaming loop (--size large: 40 chunks of 8 MB, 0.25 s each, one at a time) and a
tree of parents waiting on running children (large: 4 parents x 4 children sleeping
1 s). The killer SIGKILLs a random running worker every 1-3 s once the last one killed
is back, at most --kills per workload. Worker memory is the resident size of the worker
processes, sampled every 0.1 s. With --write the table replaces its section of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import _bench as B
import dask
from distributed import Client, LocalCluster

TESTS = str(Path(__file__).resolve().parent.parent / "tests")
sys.path.insert(0, TESTS)
# The worker processes import the workloads by name (tests/chaos.py, tests/workloads.py).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
import chaos  # noqa: E402

# Its own section of RESULTS.md (--write), beside the one run_all.py writes.
HEADING = "## Chaos at a larger size: runs, kills, wrong answers, peak worker memory"
SIZES = {"small": chaos.SMALL, "large": chaos.LARGE}
SHOWN = ["stream", "stream_wc", "tree"]  # workloads with a column of their own


class _Calm:
    """A stand-in killer for the round without kills."""

    kills = 0

    def next_workload(self) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    p = B.parser(__doc__, repeat=None, write=True)
    p.add_argument("--runs", type=int, default=5, help="rounds under the killer")
    p.add_argument("--size", choices=sorted(SIZES), default="large")
    p.add_argument("--kills", type=int, default=5, help="at most this many kills per workload "
                   "(0: no limit)")
    p.add_argument("--seed", type=int, default=0)
    args = B.parse(p, argv, {"runs": 1, "size": "small"})
    size = SIZES[args.size]
    rows, data = [], {"size": args.size, "rounds": []}
    wrong_total = kills_total = 0
    start = time.monotonic()
    with B.inline_setting(False), dask.config.set(chaos.NANNIES_STAY), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as lc, Client(lc) as client:
        client.wait_for_workers(3, timeout=60)
        with chaos.WorkerMemory(lc) as memory:
            time.sleep(0.5)
            idle_one, idle_sum = memory.peak()
            calm = chaos.run_round(client, _Calm(), memory, size)
            B.log(f"calm round: {calm.wall:.1f} s, peak {calm.peak_worker / 2**20:.0f} MiB")
            rounds = []
            with chaos.Killer(lc, seed=args.seed, per_workload=args.kills or None) as killer:
                for i in range(args.runs):
                    r = chaos.run_round(client, killer, memory, size)
                    rounds.append(r)
                    B.log(f"round {i + 1}: {r.wall:.1f} s, {r.kills} kills, {len(r.wrong)} wrong, "
                          f"peak {r.peak_worker / 2**20:.0f} MiB")
            client.wait_for_workers(3, timeout=120)
            chaos.poll(lambda: client.run_on_scheduler(chaos.scheduler_tasks) == 0, 60,
                       "tasks left on the scheduler")
    for label, r in [("no kills", calm)] + [(str(i + 1), r) for i, r in enumerate(rounds)]:
        wrong_total += len(r.wrong)
        kills_total += r.kills
        rows.append([label, r.runs, r.kills, len(r.wrong), B.fmt_s(r.wall),
                     B.mib(r.peak_worker), B.mib(r.peak_workers),
                     *(f"{B.fmt_s(r.walls[k])} s, {r.kills_in[k]} kills, "
                       f"{B.mib(r.peaks[k][0])} / {B.mib(r.peaks[k][1])}"
                       + (f", **{r.plain_errors[k]}**" if k in r.plain_errors else "")
                       for k in SHOWN)])
        data["rounds"].append({"label": label, "runs": r.runs, "kills": r.kills,
                               "wrong": [repr(w) for w in r.wrong], "wall": r.wall,
                               "peak_worker": r.peak_worker, "peak_workers": r.peak_workers,
                               "walls": r.walls, "kills_in": r.kills_in, "peaks": r.peaks,
                               "plain_errors": r.plain_errors})
    runs_total = sum(r.runs for r in rounds)
    plain_failed = sum(len(r.plain_errors) for r in rounds)
    data.update(runs=runs_total, kills=kills_total, wrong=wrong_total, plain_failed=plain_failed,
                idle_worker=idle_one,
                idle_workers=idle_sum, elapsed=time.monotonic() - start)
    header = ["round", "workload runs", "kills", "wrong answers", "wall s",
              "peak MiB, largest worker", "peak MiB, all 3",
              "streaming loop: wall, kills, peak MiB (largest / all 3)",
              "the same loop, worker_client", "waiting tree"]
    notes = [
        B.fill(f"Under the killer: {runs_total} workload runs in {args.runs} round(s), "
               f"{kills_total} kills, **{wrong_total} wrong answers** (the round without kills "
               "included); nothing was left on the scheduler after the last round. Idle before the first round: "
               f"{B.mib(idle_one)} MiB the largest worker, {B.mib(idle_sum)} MiB all 3. "
               f"Size `{args.size}`: the streaming loop yields {size.chunks} chunks of "
               f"{size.chunk_mb:g} MB one at a time ({size.chunks * size.chunk_mb:g} MB in all, "
               f"each produced in {size.chunk_secs:g} s), the tree is {size.parents} parents x "
               f"{size.width} children sleeping {size.secs:g} s; at most "
               f"{args.kills or 'any number of'} kills per workload. A peak is the resident "
               "memory of the worker processes, sampled every 0.1 s during the workload (the "
               "round's: the largest of its workloads'). The plain Dask loop (a `worker_client` "
               f"task) failed in {plain_failed} of the {args.runs} rounds under the killer: a task running on "
               "`distributed.scheduler.allowed-failures` + 1 (4) killed workers fails with "
               "`KilledWorker`; a coroutine lost while it waits on its children is not counted "
               "(see docs/failures.md, Suspicion)."),
    ]
    B.report(header, rows, *notes)
    B.write_json(args.json, data)
    if args.write:
        B.write_section(HEADING, "bench_chaos.py", argv, B.table(header, rows), *notes,
                        dated=True)
    return 0 if wrong_total == 0 else 1


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("chaos", "Chaos at a larger size: a streaming loop and waiting parents under kills",
               ["--runs", "3", "--size", "large", "--kills", "5"], 420,
               quick=["--kills", "5"],
               notes="3 Nanny workers, not the 2 of the other scenarios (the chaos test's "
                     "cluster: the killer always leaves one running). Rounds under random "
                     "kills take as long as the kills make them: the wall times measure "
                     "recovery on a loaded machine, not speed."),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("chaos")
    if d:
        rows.row("chaos at a larger size: every answer right under random worker kills",
                 f"**{d['wrong']} wrong** in {d['runs']} workload runs, {d['kills']} kills "
                 f"(size `{d['size']}`)", B.yes(d["wrong"] == 0))
    else:
        rows.missing("chaos at a larger size: every answer right under random worker kills")
    return rows


if __name__ == "__main__":
    sys.exit(main())
