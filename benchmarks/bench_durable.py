"""Durable runs (coro.durability.store): what storing every child costs, and
how soon a resumed run reaches its first new child.

Run: python benchmarks/bench_durable.py [--n 1000] [--kb 1] [--big-n 100]
     [--big-mb 10] [--resume-n 1000] [--store DIR] [--quick]
2 worker processes x 1 thread. Rows:
- small: a coroutine yields --n children of --kb KB results at once; wall
  time of the root without a store, then with a store (a fresh one);
- big: the same with --big-n children of --big-mb MB;
- resume: a root yields --resume-n children (all stored), then one new
  child, and fails; the same root is computed again: the time from its
  compute to the start of the new child (every stored child given from the
  store, none run).
--quick: small sizes, to check that it runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import _bench as B
import dask

from dask_coro import coroutine


def blob(i, nbytes):
    return bytes([i % 256]) * nbytes


def stamp(path, run):
    with open(path, "a") as f:
        f.write(f"{time.time()}\n")
    return 0


@coroutine
def many(n, nbytes):
    results = yield [dask.delayed(blob)(i, nbytes) for i in range(n)]
    return sum(len(r) for r in results)


@coroutine
def then_new(n, path, fail):
    yield [dask.delayed(blob)(i, 16) for i in range(n)]
    yield dask.delayed(stamp)(path, fail)  # another call in each run: never stored before
    if fail:
        raise RuntimeError("lost")
    return n


def _timed(store, fn):
    config = {"coro.durability.store": store} if store else {}
    with B.cluster(config=config) as client:
        start = time.perf_counter()
        fn(client)
        return time.perf_counter() - start


SCENARIOS = [  # its section of RESULTS.md, run by run_all.py
    B.Scenario("durable", "Durable runs: children stored as they finish, and a resume, against the same "
               "run without a store, run by run_all.py", [], 900, json=False),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--kb", type=float, default=1)
    p.add_argument("--big-n", type=int, default=100)
    p.add_argument("--big-mb", type=float, default=10)
    p.add_argument("--resume-n", type=int, default=1000)
    p.add_argument("--store", help="a directory (or fsspec URL) to put the stores under (default: a temporary one)")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.n, a.kb, a.big_n, a.big_mb, a.resume_n = 50, 1, 5, 0.1, 50
    base = a.store or tempfile.mkdtemp(prefix="bench-durable-")
    n = 0

    def fresh() -> str:
        nonlocal n
        n += 1
        return os.path.join(base, f"store{n}")

    rows = []
    for label, count, nbytes in (("small", a.n, int(a.kb * 1024)), ("big", a.big_n, int(a.big_mb * 2**20))):
        def run(client, count=count, nbytes=nbytes):
            key = f"bench-{label}-{time.time_ns()}"
            assert client.compute(many(count, nbytes, dask_key_name=key)).result() == count * nbytes

        plain = _timed(None, run)
        stored = _timed(fresh(), run)
        rows.append((f"{count} children of {nbytes} B", plain, stored, stored / plain))

    store, path = fresh(), os.path.join(base, "stamps")

    def first_run(client):
        try:
            client.compute(then_new(a.resume_n, path, True, dask_key_name="bench-resume")).result()
        except RuntimeError:
            pass

    _timed(store, first_run)
    with B.cluster(config={"coro.durability.store": store}) as client:
        start = time.time()
        f = client.compute(then_new(a.resume_n, path, False, dask_key_name="bench-resume"))
        assert f.result() == a.resume_n
        with open(path) as fh:
            stamps = [float(x) for x in fh.read().split()]
    print(f"{'row':<32} {'no store':>10} {'store':>10} {'ratio':>7}")
    for name, plain, stored, ratio in rows:
        print(f"{name:<32} {plain:>9.2f}s {stored:>9.2f}s {ratio:>6.2f}x")
    print(f"resume of {a.resume_n} stored children: first new child after {stamps[-1] - start:.2f} s")
    if not a.store:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
