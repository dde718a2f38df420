"""The scheduler's cost of dask_coro's bookkeeping: time in its plugins' hooks per ended
coroutine with 1,000 to 10,000 roots waiting at once, and in the worker-release hook per
dependent of one key with 1,000 to 8,000 dependents (flat: linear in the work).

Run: python benchmarks/bench_scheduler_cost.py [--roots 1000 4000 10000]
     [--dependents 1000 4000 8000] [--repeat 1] [--quick]
2 worker processes x 1 thread, inline off, a fresh cluster per row; the
scheduler runs in this process, so its plugins' hooks are wrapped with a timer
(``time.thread_time`` around each call of every hook of every dask_coro
scheduler plugin: CPU time of the scheduler's event-loop thread, which other
processes on a loaded machine do not inflate).

Roots: each root is a coroutine that yields one child depending on a gate, a
task restricted to a resource no worker has; once every root waits (its
child submitted, the root seceded), the gate opens and every root ends. The
time measured is that of the ending phase: from the gate's opening until the
last root's result is back. "Hooks per root" is the time the dask_coro
plugins' hooks spent on the scheduler's event loop in that phase, divided by
the number of roots; "durability hook per root" the part of it in
``DurablePlugin``'s ``transition`` (which ends each root's book).

Books: the same events fed to the pure books alone, no cluster (CPU time of
this thread, ``time.thread_time``): the durability book and its byte budget
for N parents of 3 children each, all waiting, then each consuming its
children (charged, the oldest let go of past the budget) and ending; the release books for one
key whose D dependents are assigned one at a time to one worker.

Dependents: one key (a 1 MB array) and D tasks that each take it and an
index, computed with worker release on (``ReleasePlugin``); "release hook per
dependent" is the time in ``ReleasePlugin.transition`` over the whole
computation divided by D.
"""

from __future__ import annotations

import contextlib
import sys
import time

import _bench as B
import dask
import numpy as np
from distributed import Future

from dask_coro import coroutine
from dask_coro.release.scheduler import NAME as RELEASE

HOOKS = ("transition", "update_graph", "remove_worker", "add_worker", "add_client", "remove_client")


@coroutine
def root(i, gate_key):
    gate = yield Future(gate_key)  # one child: a task of ours that depends on the gate
    return gate + i


def _time_hooks(dask_scheduler) -> list[str]:
    """Wrap every hook of every dask_coro plugin with a timer (once)."""
    wrapped = []
    for name, plugin in dask_scheduler.plugins.items():
        if not name.startswith("dask-coro") or getattr(plugin, "_bench_spent", None) is not None:
            continue
        plugin._bench_spent = {}
        for hook in HOOKS:
            method = getattr(plugin, hook, None)
            if method is None:
                continue

            def timed(*args, _method=method, _hook=hook, _plugin=plugin, **kwargs):
                # CPU time of the event loop's thread: what the hook cost it,
                # other processes on the machine left out.
                t0 = time.thread_time()
                try:
                    return _method(*args, **kwargs)
                finally:
                    spent = _plugin._bench_spent
                    spent[_hook] = spent.get(_hook, 0.0) + time.thread_time() - t0

            setattr(plugin, hook, timed)
        wrapped.append(name)
    return wrapped


def _spent(dask_scheduler, reset: bool = False) -> dict[str, dict[str, float]]:
    out = {}
    for name, plugin in dask_scheduler.plugins.items():
        spent = getattr(plugin, "_bench_spent", None)
        if spent is not None:
            out[name] = dict(spent)
            if reset:
                spent.clear()
    return out


def _left(dask_scheduler) -> int:
    """Entries left in the durability book (0 once every root ended)."""
    durable = dask_scheduler.plugins.get("dask-coro-durable")
    if durable is None:
        return 0
    book = durable.book
    return len(book.held) + len(book.parent_of)


def _round(client, n: int, timeout: float) -> dict:
    gate = B.Gate(client)
    futs = client.compute([root(i, gate.key) for i in range(n)])
    waited = gate.wait_suspended("root-", n, timeout)
    client.run_on_scheduler(_time_hooks)
    client.run_on_scheduler(_spent, reset=True)
    start = time.perf_counter()
    gate.open()
    results = client.gather(futs)
    wall = time.perf_counter() - start
    spent = client.run_on_scheduler(_spent)
    assert results == [1000 + i for i in range(n)], results[:5]
    del futs, gate
    return {"waited": waited, "wall": wall, "spent": spent}


def roots_row(n: int, timeout: float) -> dict:
    with B.cluster(inline=False) as client:
        _round(client, 50, timeout)  # warm-up: imports, plugins, the workers' clients
        out = _round(client, n, timeout)
        with contextlib.suppress(TimeoutError):
            B.wait_for(lambda: not client.run_on_scheduler(_left), 30, "every root ended",
                       interval=0.1)
        out["left"] = client.run_on_scheduler(_left)
    B.log(f"{n} roots: ended in {out['wall']:.2f} s; hooks {out['spent']}")
    return out


def use(x, i):
    return float(x[0]) + i


def make(n):
    return np.ones(n)


def dependents_row(d: int, workers: int) -> dict:
    with B.cluster(n_workers=workers, config={"coro.worker-release.enabled": True}) as client:
        B.release_plugin(client, workers)
        client.run_on_scheduler(_time_hooks)
        x = dask.delayed(make, pure=True)(128 * 1024)
        tasks = [dask.delayed(use, pure=True)(x, i) for i in range(d)]
        client.run_on_scheduler(_spent, reset=True)
        start = time.perf_counter()
        got = client.gather(client.compute(tasks))
        wall = time.perf_counter() - start
        spent = client.run_on_scheduler(_spent)
        assert got == [1.0 + i for i in range(d)], got[:5]
    hook = spent.get(RELEASE, {}).get("transition", 0.0)
    B.log(f"{d} dependents on {workers} worker(s): {wall:.2f} s, release hook {hook:.3f} s")
    return {"wall": wall, "hook": hook}


def hold_book(n: int) -> float:
    """N parents of 3 children each waiting at once, then each ending, fed to
    the durability book and its byte budget (each child consumed and charged
    on one of two workers, the oldest let go of past 64 children's worth, a
    run asked again): CPU seconds."""
    from dask_coro.durability.book import HoldBook
    from dask_coro.durability.budget import HoldBudget

    book = HoldBook()
    budget = HoldBudget(lambda w: 64 * 100)
    kids = {f"p{i}": [f"p{i}-{j}" for j in range(3)] for i in range(n)}
    t0 = time.thread_time()
    for p, ks in kids.items():
        book.adopt(p, ks, lambda k: "processing")
    for p, ks in kids.items():
        for j, k in enumerate(ks):
            book.moved(k, "processing", "memory")
            book.finished(k)
            if book.asked_now(k):
                for gone in budget.charge(k, f"w{j % 2}", 100):
                    book.lost(gone)
        book.ask(ks[0])
        budget.discharge(ks[0])
        for k in book.end(p):
            budget.discharge(k)
    return time.thread_time() - t0


def release_books(d: int) -> float:
    """One key's D dependents assigned one at a time to one worker, half of
    them finishing meanwhile, as ReleasePlugin feeds its books: CPU seconds.
    (Before the books counted dependents, each assignment walked them all.)"""
    from dask_coro.release import book as rb

    deps = [f"d{i}" for i in range(d)]
    t0 = time.thread_time()
    if hasattr(rb, "Dependents"):
        counts, marks = rb.Dependents(), rb.Marks()
        counts.watch("x", [(k, "queued", None) for k in deps])
        for i, k in enumerate(deps):
            counts.moved(k, "queued", "processing", "w")
            if counts.settled_on("x", "w"):
                if not (marks.is_marked("x", "w") and marks.name("x", "w", k)):
                    marks.mark("x", "w", counts.processing_on("x", "w"))
            if i % 2:
                counts.moved(deps[i - 1], "processing", "memory")
    else:  # the walk the hook did for each dependent assigned
        marks = rb.Marks()
        state = dict.fromkeys(deps, "queued")
        for i, k in enumerate(deps):
            state[k] = "processing"
            if all(v in ("memory", "erred", "processing") for v in state.values()):
                marks.mark("x", "w", [x for x, v in state.items() if v == "processing"])
            [x for x, v in state.items() if v not in ("memory", "erred")]  # named
            if i % 2:
                state[deps[i - 1]] = "memory"
    return time.thread_time() - t0


def books(sizes_roots, sizes_deps) -> dict:
    out: dict = {"roots": {}, "dependents": {}}
    rows = []
    for n in sizes_roots:
        spent = min(hold_book(n) for _ in range(3))
        out["roots"][n] = spent
        rows.append([f"{n:,} parents", f"{spent:.4f}", f"{spent / n * 1e6:.2f}"])
    B.report(["durability book", "CPU s (best of 3)", "per parent (us)"], rows)
    rows = []
    for d in sizes_deps:
        spent = min(release_books(d) for _ in range(3))
        out["dependents"][d] = spent
        rows.append([f"{d:,} dependents", f"{spent:.4f}", f"{spent / d * 1e6:.2f}"])
    B.report(["release books", "CPU s (best of 3)", "per dependent (us)"], rows)
    return out


def main(argv=None) -> int:
    p = B.parser(__doc__, repeat=1)
    p.add_argument("--books", action="store_true",
                   help="only the pure books, no cluster (CPU time; seconds, not minutes)")
    p.add_argument("--roots", type=int, nargs="*", default=[1000, 4000, 10000])
    p.add_argument("--dependents", type=int, nargs="*", default=[1000, 4000, 8000])
    p.add_argument("--timeout", type=float, default=240.0, help="s to get all roots waiting")
    args = B.parse(p, argv, quick={"roots": [100, 400], "dependents": [100, 400]})
    if args.books:
        B.write_json(args.json, books(args.roots, args.dependents))
        return 0
    out: dict = {"roots": {}, "dependents": {}, "books": books(args.roots, args.dependents)}
    rows = []
    for n in args.roots:
        runs = [roots_row(n, args.timeout) for _ in range(args.repeat)]
        hooks = B.median([sum(sum(h.values()) for h in r["spent"].values()) for r in runs])
        durable = B.median([r["spent"].get("dask-coro-durable", {}).get("transition", 0.0)
                            for r in runs])
        wall = B.median([r["wall"] for r in runs])
        out["roots"][n] = {"hooks": hooks, "durable": durable, "wall": wall,
                           "left": max(r["left"] for r in runs), "runs": runs}
        rows.append([f"{n:,} roots waiting", B.fmt_s(wall), f"{hooks:.3f}",
                     f"{hooks / n * 1e6:.0f}", f"{durable / n * 1e6:.0f}", f"{wall / n * 1e3:.2f}"])
    B.report(["roots", "ending phase wall (s)", "dask_coro hooks (CPU s)", "hooks per root (CPU us)",
              "durability hook per root (CPU us)", "wall per root (ms)"], rows, B.fill(
        f"Medians of {args.repeat} run(s), a fresh cluster per row, inline off. Flat columns "
        "per root mean the scheduler's cost of ending a coroutine does not grow with the "
        "coroutines waiting beside it."))
    rows = []
    for d in args.dependents:
        for workers in (1, 2):
            runs = [dependents_row(d, workers) for _ in range(args.repeat)]
            hook = B.median([r["hook"] for r in runs])
            wall = B.median([r["wall"] for r in runs])
            out["dependents"][f"{d}/{workers}"] = {"hook": hook, "wall": wall}
            rows.append([f"{d:,}", workers, B.fmt_s(wall), f"{hook:.3f}", f"{hook / d * 1e6:.0f}"])
    B.report(["dependents of one key", "workers", "wall (s)", "release hook (CPU s)",
              "release hook per dependent (CPU us)"], rows, B.fill(
        f"Medians of {args.repeat} run(s), a fresh cluster per row, worker release on. "
        "With 2 workers the key lives on one and the other fetches a copy (marked for it)."))
    B.write_json(args.json, out)
    return 0


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("scheduler_cost", "The scheduler's bookkeeping per ended coroutine (1,000 to 10,000 "
               "roots waiting) and per dependent under worker release (1,000 to 8,000 dependents)",
               ["--roots", "1000", "4000", "10000", "--dependents", "1000", "4000", "8000"], 600,
               notes="CPU time of dask_coro's scheduler plugins' hooks (the scheduler runs in "
                     "the benchmark's process, its hooks wrapped with a thread_time timer): flat "
                     "per root and per dependent means linear in the work. Before the books were "
                     "indexed (same script, same machine): 85 and 338 us per root in the "
                     "durability hook with 1,000 and 4,000 roots waiting (10,000 did not finish: "
                     "the scheduler lost a worker meanwhile), 145 and 228 us per dependent in the "
                     "release hook with 1,000 and 2,000 dependents; the pure books alone "
                     "(`--books`) 71, 419 and 1,179 us per parent for 1,000, 4,000 and 10,000, "
                     "and 46, 192 and 371 us per dependent for 1,000, 4,000 and 8,000."),
]


if __name__ == "__main__":
    sys.exit(main())
