"""Durable runs (coro.durability.store): what storing every child costs, and
how soon a resumed run reaches its first new child.

Run: python benchmarks/bench_durable.py [--n 1000] [--kb 1] [--big-n 100]
     [--big-mb 10] [--resume-n 1000] [--store DIR] [--no-s3] [--no-local]
     [--no-big] [--quick]
2 worker processes x 1 thread; each row for a local directory store and an
S3-API store (a moto server this process starts; needs s3fs and
moto[server], else that store is left out). Rows:
- small: a coroutine yields --n children of --kb KB results at once; wall
  time of the root without a store, then with a store (a fresh one);
- big: the same with --big-n children of --big-mb MB;
- resume: a root yields --resume-n children (all stored), then one new
  child, and fails; the same root is computed again: the time from its
  compute to the start of the new child (every stored child given from the
  store, none run).
--no-local / --no-s3: the rows of one store only; --no-big: no big row.
--quick: small sizes, to check that it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import tempfile
import time

import _bench as B
import dask
from dask.utils import format_bytes

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


def _timed(config, fn):
    with B.cluster(config=config) as client:
        # One root first, not timed: each worker process's first coroutine
        # installs its plugins, and opens the store (an S3 client's set-up).
        assert client.compute(many(2, 16, dask_key_name=f"bench-warm-{time.time_ns()}")).result() == 32
        start = time.perf_counter()
        fn(client)
        return time.perf_counter() - start


class _S3:
    """A local S3-API server (moto, as s3fs's own tests use) with a bucket:
    each ``fresh()`` a store of its own in it."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "bench", "secret": "bench",
                        "client_kwargs": {"region_name": "us-east-1"}}
        import boto3

        boto3.client("s3", endpoint_url=self.options["endpoint_url"], aws_access_key_id="bench",
                     aws_secret_access_key="bench", region_name="us-east-1").create_bucket(Bucket="bench")
        self.n = 0

    def fresh(self):
        self.n += 1
        return {"coro.durability.store": f"s3://bench/store{self.n}", "coro.durability.store-key": "bench-secret",
                "coro.durability.store-options": self.options}

    def close(self):
        self.server.stop()


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
    p.add_argument("--no-s3", action="store_true", help="the local directory store only")
    p.add_argument("--no-local", action="store_true", help="the S3-API store only")
    p.add_argument("--no-big", action="store_true", help="no row of big children")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.n, a.kb, a.big_n, a.big_mb, a.resume_n = 50, 1, 5, 0.1, 50
    base = a.store or tempfile.mkdtemp(prefix="bench-durable-")
    n = 0

    def local() -> dict:
        nonlocal n
        n += 1
        return {"coro.durability.store": os.path.join(base, f"store{n}")}

    backends = [] if a.no_local else [("local directory", local)]
    s3 = None
    if not a.no_s3:
        try:
            s3 = _S3()
        except ImportError as e:
            print(f"(no S3-API store: {e}; pip install s3fs 'moto[server]')")
        else:
            backends.append(("S3 API (moto)", s3.fresh))

    rows = []
    try:
        sizes = (("small", a.n, int(a.kb * 1024), 1.3), ("big", a.big_n, int(a.big_mb * 2**20), 1.5))
        if a.no_big:
            sizes = sizes[:1]
        for label, count, nbytes, target in sizes:
            def run(client, count=count, nbytes=nbytes, label=label):
                key = f"bench-{label}-{time.time_ns()}"
                assert client.compute(many(count, nbytes, dask_key_name=key)).result() == count * nbytes

            plain = _timed({}, run)
            for name, fresh in backends:
                stored = _timed(fresh(), run)
                rows.append([f"{count} children of {format_bytes(nbytes)}", name, f"{plain:.2f} s",
                             f"{stored:.2f} s", f"{stored / plain:.2f}x", f"<= {target}x"])
        for name, fresh in backends:
            config, path = fresh(), os.path.join(base, f"stamps-{len(rows)}")

            def first_run(client, path=path):
                try:
                    client.compute(then_new(a.resume_n, path, True, dask_key_name="bench-resume")).result()
                except RuntimeError:
                    pass

            _timed(config, first_run)
            with B.cluster(config=config) as client:
                assert client.compute(many(2, 16, dask_key_name=f"bench-warm-{time.time_ns()}")).result() == 32
                start = time.time()
                f = client.compute(then_new(a.resume_n, path, False, dask_key_name="bench-resume"))
                assert f.result() == a.resume_n
                with open(path) as fh:
                    stamps = [float(x) for x in fh.read().split()]
            rows.append([f"resume of {a.resume_n} stored children: its first new child", name, "",
                         f"{stamps[-1] - start:.2f} s", "", "<= 2 s"])
    finally:
        if s3 is not None:
            s3.close()
        if not a.store:
            shutil.rmtree(base, ignore_errors=True)
    B.report(
        ["row", "store", "no store", "with the store", "ratio", "target"], rows,
        B.fill("Wall time of the root from its compute to its value, on 2 worker processes x 1 thread; the "
               "store a fresh one per row; the S3-API store a moto server in the benchmark's process. The "
               "resume row: the time from computing the root again to the start of its one new child, "
               "every stored child given from the store."),
    )


if __name__ == "__main__":
    main()
