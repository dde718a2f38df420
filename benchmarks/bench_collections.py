"""Planning cost of a collection yield per task, and its wall time against the same ``client.compute`` from a ``worker_client`` task.

For array and dataframe graphs of about N tasks (``--sizes``):

* ``plan``: what a yield does in the body's thread before the message goes
  (``plan_yield`` and the serialization of the message,
  ``_internals.collections_message``), per task of the graph the scheduler
  builds from it. Before this round the plan renamed and tokenized every
  task on the worker's event loop: ``--profile`` prints cProfile's top
  functions of ``plan_yield``.
* ``wall`` (``--wall``): the collection yielded in a body, and the same
  ``client.compute`` from a ``worker_client`` task, one after the other on
  one ``LocalCluster`` (2 workers, 1 thread each), each from submission to
  result; their ratio, and ``removed``: the workers the scheduler removed
  meanwhile (its ``remove-worker`` events, ``Scheduler.remove_worker``), 0
  when every worker answered its heartbeats throughout.

    python benchmarks/bench_collections.py --sizes 1000 10000 100000
    python benchmarks/bench_collections.py --sizes 1000 10000 --wall
"""

from __future__ import annotations

import cProfile
import pstats
import time

import _bench as B
import dask.array as da
import numpy as np
import pandas as pd
from distributed import Client, LocalCluster, worker_client

from dask_coro import coroutine
from dask_coro._internals.dask_private import expression_graph
from dask_coro._internals.distributed.client import collections_message
from dask_coro.core.plan import plan_yield


def array(n):
    """About n tasks: n chunks of ones, plus one, summed (fused, then a tree)."""
    return (da.ones(n * 4, chunks=4) + 1).sum()


def frame(n):
    """About n tasks: n/2 partitions, summed by a column."""
    import dask.dataframe as dd

    p = max(1, n // 2)
    pdf = pd.DataFrame({"k": np.arange(p * 4) % 5, "x": np.arange(p * 4.0)})
    return dd.from_pandas(pdf, npartitions=p).groupby("k").x.sum()


KINDS = {"array": array, "dataframe": frame}


def plan_seconds(coll):
    t0 = time.perf_counter()
    plan = plan_yield([coll], [()], {}, "parent-0123456789abcdef0123456789abcdef", 0)
    c = plan.compute
    collections_message(c.expr, c.graph, c.collections)
    return time.perf_counter() - t0, plan


@coroutine
def in_body(build, n):
    return (yield build(n))


def in_task(build, n):
    with worker_client() as c:
        return c.compute(build(n)).result()


def removals(dask_scheduler) -> int:
    return sum(1 for _, e in dask_scheduler.get_events("all") if e.get("action") == "remove-worker")


SCENARIOS = [  # its section of RESULTS.md, run by run_all.py
    B.Scenario("collections", "Collections in a body: planning per task and wall time against "
               "`client.compute` from a `worker_client` task, run by run_all.py",
               ["--sizes", "1000", "10000", "--wall"], 300, json=False, quick=["--wall"]),
]


def main(argv=None) -> None:
    ap = B.parser(__doc__, repeat=None, json=False)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--wall", action="store_true", help="also time body and worker_client on a cluster")
    ap.add_argument("--profile", action="store_true", help="cProfile of plan_yield at each size")
    args = B.parse(ap, argv, {"sizes": [100]})
    cluster = client = None
    if args.wall:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
        client = Client(cluster)
    try:
        print("| graph | tasks | plan (s) | plan per task (us) | body (s) | worker_client (s) | ratio | removed |")
        print("|---|---|---|---|---|---|---|---|")
        for kind in args.kinds:
            build = KINDS[kind]
            for n in args.sizes:
                coll = build(n)
                took, plan = plan_seconds(coll)
                tasks = len(expression_graph(plan.compute.expr))
                if args.profile:
                    prof = cProfile.Profile()
                    prof.runcall(plan_seconds, build(n))
                    pstats.Stats(prof).sort_stats("cumulative").print_stats(8)
                row = f"| {kind} {n} | {tasks} | {took:.3f} | {took / tasks * 1e6:.1f} |"
                if client is not None:
                    before = client.run_on_scheduler(removals)
                    t0 = time.perf_counter()
                    body = client.compute(in_body(build, n)).result()
                    tb = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    plain = client.submit(in_task, build, n, pure=False).result()
                    tp = time.perf_counter() - t0
                    assert np.allclose(np.asarray(body), np.asarray(plain))
                    removed = client.run_on_scheduler(removals) - before
                    row += f" {tb:.1f} | {tp:.1f} | {tb / tp:.2f} | {removed} |"
                else:
                    row += " | | | |"
                print(row, flush=True)
    finally:
        if client is not None:
            client.close()
            cluster.close()


if __name__ == "__main__":
    main()
