"""Work stealing on 1, 2, 4 and 8 workers: a binary tree of @coroutine calls
whose leaves sleep (I/O-bound), inline on, the scheduler pushing idle threads to
subscribed workers (coro.inline.stealing: push, the default) versus every worker
polling it (poll).

Run: python benchmarks/bench_scale.py [--workers 1 2 4 8] [--depth 10] [--leaf-ms 10]
     [--modes push poll] [--repeat 2] [--results] [--quick]
Worker processes x 1 thread each, one cluster per number of workers (warmed
up with a depth-3 tree in each mode); the mode is set on every worker between
runs, after the previous run's subscriptions and polls ended. Rounds
interleave the modes; medians of --repeat rounds. The leaves sleep (time.sleep),
so 8 single-threaded workers need little CPU: the speed-up measures the
stealing, not the cores. The scheduler (in this process, LocalCluster) counts
the messages stealing costs (dask_coro.InlinePlugin.counts): pushes sent and
subscriptions received in push mode, requests answered in poll mode.
Prints a Markdown table; --results writes its section of RESULTS.md.
"""

from __future__ import annotations

import os
import sys
import time

import _bench as B
import dask
import psutil
from dask.utils import parse_timedelta

from dask_coro import coroutine
from dask_coro.runtime.scheduler import NAME

MODES = ("push", "poll")


@coroutine
def tree(depth, seconds):
    if depth == 0:
        time.sleep(seconds)
        return 1
    a, b = yield [tree(depth - 1, seconds), tree(depth - 1, seconds)]
    return a + b


def _set_mode(mode: str) -> str:
    dask.config.set({"coro.inline.stealing": mode})
    return str(dask.config.get("coro.inline.stealing"))


def _stealing_ended(dask_worker=None) -> bool:
    from dask_coro.runtime.worker import _KeyWatcher

    w = dask_worker.plugins.get(_KeyWatcher.name)
    return w is None or w.stealer is None or w.stealer.done()


def _counts(reset: bool = False, dask_scheduler=None) -> dict:
    plugin = dask_scheduler.plugins.get(NAME)
    if plugin is None:
        return {}
    out = dict(plugin.counts)
    if reset:
        plugin.counts = dict.fromkeys(plugin.counts, 0)
    return out


def _quiet(client, mode: str) -> None:
    """The previous run's subscriptions and polls ended on every worker, and
    ``mode`` is set on each."""
    B.wait_for(lambda: all(client.run(_stealing_ended).values()), 30,
               "stealing ended on the workers", interval=0.1)
    seen = set(client.run(_set_mode, mode).values())
    assert seen == {mode}, seen


def messages(mode: str, c: dict) -> int:
    """Scheduler messages spent on stealing: pushes sent and subscriptions
    received (push), requests answered (poll, each one a request and a reply)."""
    return c["push"] + c["subscribe"] + c["unsubscribe"] + c["poll"]


def one_run(client, mode: str, depth: int, seconds: float) -> dict:
    _quiet(client, mode)
    client.run_on_scheduler(_counts, reset=True)
    B.tasks_done(client, reset=True)
    me = psutil.Process()
    cpu0 = sum(me.cpu_times()[:2])
    wall, value = B.timed(lambda: client.compute(tree(depth, seconds)).result())
    cpu = sum(me.cpu_times()[:2]) - cpu0
    assert value == 2**depth, value
    c = client.run_on_scheduler(_counts)  # during the run
    tasks = B.tasks_done(client)
    msgs = messages(mode, c)
    # Subscriptions (and polls) end a second after the last inline run.
    _quiet(client, mode)
    after = client.run_on_scheduler(_counts)
    return {"wall": wall, "tasks": tasks, "stolen": tasks - 1, "counts": c, "after": after,
            "messages": msgs, "rate": msgs / wall, "sched_cpu": cpu}


def run(args) -> dict:
    res: dict[int, dict[str, list[dict]]] = {}
    for n in args.workers:
        res[n] = {m: [] for m in args.modes}
        with B.cluster(inline=True, n_workers=n) as client:
            for mode in args.modes:
                _quiet(client, mode)
                assert client.compute(tree(3, 0.001)).result() == 8
            for mode in B.interleaved(args.modes, args.repeat):
                out = one_run(client, mode, args.depth, args.leaf_ms / 1000)
                res[n][mode].append(out)
                B.log(f"{n} worker(s), {mode}: {out['wall']:.2f} s, {out['stolen']} stolen, "
                      f"{out['messages']} messages ({out['rate']:.0f}/s) {out['counts']}")
    return res


def summary(res: dict, args) -> dict:
    out: dict = {}
    for n, by in res.items():
        for mode, runs in by.items():
            med = lambda k: B.median([x[k] for x in runs])  # noqa: E731
            out.setdefault(mode, {})[n] = {
                "wall": med("wall"), "walls": [x["wall"] for x in runs], "stolen": med("stolen"),
                "messages": med("messages"), "rate": med("rate"), "sched_cpu": med("sched_cpu"),
                "pushes": med_count(runs, "push"), "polls": med_count(runs, "poll"),
                "events": med_count(runs, "event"), "checks": med_count(runs, "check"),
            }
    for mode, by in out.items():
        one = by.get(1)
        for n, r in by.items():
            r["speedup"] = one["wall"] / r["wall"] if one else None
            r["per_worker"] = r["rate"] / n
            r["per_steal"] = r["messages"] / r["stolen"] if r["stolen"] else None
    return out


def med_count(runs: list[dict], key: str) -> float:
    return B.median([x["counts"].get(key, 0) for x in runs])


def at_scale(s: dict, args) -> dict | None:
    """Messages a second on 1,000 busy workers: polling from its interval,
    pushing from the messages per stolen task and the stealing rate per worker
    measured on the most workers."""
    push = s.get("push", {})
    if not push:
        return None
    n = max(push)
    r = push[n]
    if not r["stolen"] or not r["per_steal"]:
        return None
    interval = dask.config.get("coro.inline.interval")
    seconds = parse_timedelta(interval)
    steals_per_worker = r["stolen"] / r["wall"] / n
    return {"workers": n, "interval": interval, "poll": 1000 / seconds,
            "steals_per_worker": steals_per_worker, "per_steal": r["per_steal"],
            "push": 1000 * steals_per_worker * r["per_steal"]}


def render(s: dict, args) -> tuple[list[str], list[list], str]:
    header = ["stealing", "workers", *B.wall_header(args.repeat), "speed-up over 1 worker",
              "tasks stolen", "stealing messages", "messages/s", "messages/s per worker",
              "messages per stolen task", "idle events / looks", "scheduler process CPU s"]
    rows = []
    for mode in args.modes:
        for n, r in sorted(s.get(mode, {}).items()):
            rows.append([
                mode, n, *B.wall_cells(r["walls"]),
                "-" if r["speedup"] is None else f"{r['speedup']:.2f}",
                f"{r['stolen']:.0f}", f"{r['messages']:.0f}", f"{r['rate']:.0f}",
                f"{r['per_worker']:.1f}",
                "-" if r["per_steal"] is None else f"{r['per_steal']:.2f}",
                f"{r['events']:.0f} / {r['checks']:.0f}" if mode == "push" else "-",
                f"{r['sched_cpu']:.2f}",
            ])
    leaves = 2**args.depth
    note = B.fill(
        f"A binary tree of `@coroutine` calls of depth {args.depth}: {leaves} leaves that "
        f"sleep {args.leaf_ms:g} ms ({leaves * args.leaf_ms / 1000:.1f} s of sleep in all), "
        f"{2 * leaves - 1} calls, inline on; worker processes x 1 thread. Tasks stolen: calls "
        "handed out as tasks (tasks that reached memory, less the root). Stealing messages: "
        "push: pushes the scheduler sent plus subscriptions and unsubscriptions it received "
        "(InlinePlugin.counts; one stream message each); poll: requests it answered (each a "
        "request and a reply on an RPC comm). Idle events: what made the scheduler look "
        "(a task leaving processing, a secede, a subscription, ...), looks: how often it "
        "counted idle threads (at most once per coro.inline.interval). Counted from the "
        "computation's start to its result; after it, each worker sends one unsubscription "
        "(push) or polls for one second more (poll). Scheduler process CPU: "
        "user + system time of this process (scheduler and client) during the run. Medians "
        f"of {args.repeat} run(s).")
    scale = at_scale(s, args)
    if scale:
        note += "\n\n" + B.fill(
            f"On 1,000 busy workers: polling costs 1,000 / {scale['interval']} = "
            f"**{scale['poll']:,.0f} requests a second** whatever the work. Pushing costs messages "
            f"per idle event: {scale['workers']} workers stole {scale['steals_per_worker']:.1f} "
            f"tasks a second each and the scheduler spent {scale['per_steal']:.2f} messages per "
            f"stolen task, so 1,000 workers stealing at that rate would cost 1,000 x "
            f"{scale['steals_per_worker']:.1f} x {scale['per_steal']:.2f} = "
            f"**{scale['push']:,.0f} messages a second**, and none while no thread is idle "
            "(workers stealing less often, longer tasks, cost proportionally less; the rate "
            "limit caps it at one look per interval, each sending at most one message per "
            "idle thread).")
    return header, rows, note


def main(argv=None) -> int:
    p = B.parser(__doc__, repeat=2, write=True)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--depth", type=int, default=10, help="2**depth leaves")
    p.add_argument("--leaf-ms", type=float, default=10.0, help="sleep of one leaf, ms")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = B.parse(p, argv, quick={"workers": [1, 2], "depth": 5, "leaf_ms": 5.0, "repeat": 1})
    load0 = os.getloadavg()[0]
    res = run(args)
    s = summary(res, args)
    header, rows, note = render(s, args)
    note += "\n\n" + B.fill(
        f"Machine load: 1-minute load average {load0:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end ({psutil.cpu_count()} cores).")
    B.report(header, rows, note)
    if args.write:
        B.write_section(HEADING, "bench_scale.py", argv, B.table(header, rows), note)
    B.write_json(args.json, {"depth": args.depth, "leaf_ms": args.leaf_ms,
                             "summary": {m: {str(n): r for n, r in by.items()}
                                         for m, by in s.items()},
                             "at_scale": at_scale(s, args), "runs": res})
    return 0


HEADING = "## Work stealing on 1 to 8 workers: the scheduler pushing idle threads versus polling"


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("scale", "Work stealing on 1 to 8 workers: the scheduler pushing idle threads "
               "versus polling",
               ["--workers", "1", "2", "4", "8", "--depth", "10", "--leaf-ms", "10", "--repeat", "2"],
               300,
               notes="Leaves sleep, so the 8 worker processes need little CPU of the 2 cores: the "
                     "speed-up measures how well work is handed out. Push is the default "
                     "(`coro.inline.stealing`); poll is the design it replaced, in the same run."),
]


def targets(data):
    """Its rows of the Targets table of RESULTS.md (run_all.py), from the numbers
    of this run: ``data(key)`` is a scenario's JSON, None if it did not run."""
    rows = B.Targets()
    d = data("scale")
    push = d and d["summary"].get("push", {})
    if push and {"1", "4", "8"} <= push.keys():
        p4, p8 = push["4"], push["8"]
        poll = d["summary"].get("poll", {})
        ns = sorted(push, key=int)
        # Flat: what stealing costs per idle event it serves (a stolen task)
        # does not grow with the workers; messages a second grow only with
        # the steals themselves (none while no thread is idle).
        flat = bool(p8["per_steal"] and p4["per_steal"]
                    and p8["per_steal"] <= 1.25 * p4["per_steal"])
        text = (f"**{p8['speedup']:.2f} x** on 8 workers ({push['1']['wall']:.2f} s on 1, "
                f"{p8['wall']:.2f} s on 8); pushing: "
                + ", ".join(f"{push[n]['rate']:.0f}" for n in ns)
                + f" messages/s on {', '.join(ns)} workers, "
                + ", ".join("-" if push[n]["per_steal"] is None else f"{push[n]['per_steal']:.1f}"
                            for n in ns)
                + " per stolen task")
        if poll:
            pn = sorted(poll, key=int)
            text += ("; polling: " + ", ".join(f"{poll[n]['rate']:.0f}" for n in pn)
                     + " messages/s")
            if "8" in poll:
                text += f", speed-up on 8 {poll['8']['speedup']:.2f} x"
        scale = d.get("at_scale")
        if scale:
            text += (f"; 1,000 workers: ~{scale['push']:,.0f} messages/s pushing at the "
                     f"measured steal rate versus {scale['poll']:,.0f} polling")
        rows.row("stealing: speed-up on 8 workers >= 6 x, stealing messages/s flat (push: messages "
                 "per stolen task, 8 workers <= 1.25 x 4 workers)", text,
                 B.yes(p8["speedup"] >= 6 and flat))
    else:
        rows.missing("stealing: speed-up on 8 workers >= 6 x, stealing messages/s flat")
    return rows


if __name__ == "__main__":
    sys.exit(main())
