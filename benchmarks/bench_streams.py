"""Streams: items/s and emit-to-consumer latency, producer and consumer on
different workers, against a hand-built ``distributed.Queue`` stream and
Ray's streaming generator; the producer's worker's peak memory with
``buffer=16``.

    PYTHONPATH=$PWD python benchmarks/bench_streams.py [--small N] [--big N] [--mb M] [--buffer B] [--warm-up N] [--no-ray]

Items of 10 MB (a numeric NumPy array in each) go through shared memory on
one host: the consumer maps the segment the producer copied it into.
"""

from __future__ import annotations

import statistics
import threading
import time

import _bench as B
import dask
import numpy as np
from distributed import Client, LocalCluster, Queue

import dask_coro
from dask_coro import coroutine


def payload(i, mb):
    if mb == 0:
        return (i, time.time())
    a = np.full(mb * 2**20, i % 256, dtype=np.uint8)  # its pages touched: resident
    return (i, time.time(), a)


@coroutine
def producer(n, mb):
    for i in range(n):
        yield dask_coro.emit(payload(i, mb))
    return n


@coroutine
def consumer(n, mb, buffer, where):
    lat = []
    with dask.annotate(workers=[where], allow_other_workers=False):
        s = dask_coro.stream(producer(n, mb), buffer=buffer)
    t0 = time.time()
    for item in s:
        lat.append(time.time() - item[1])
    return len(lat), time.time() - t0, lat


def q_producer(name, n, mb, maxsize=0):
    q = Queue(name, maxsize=maxsize)
    for i in range(n):
        q.put(payload(i, mb))
    return n


def q_consumer(name, n, maxsize=0):
    q = Queue(name, maxsize=maxsize)
    lat = []
    t0 = time.time()
    for _ in range(n):
        item = q.get()
        lat.append(time.time() - item[1])
    return len(lat), time.time() - t0, lat


def rss_sampler(client, worker, stop, peaks):
    def rss():
        import psutil

        return psutil.Process().memory_info().rss

    while not stop.is_set():
        peaks.append(client.run(rss, workers=[worker])[worker])
        time.sleep(0.02)


def row(name, n, dt, lat):
    lat = sorted(lat)
    return (f"| {name} | {n} | {n / dt:,.0f} | {statistics.median(lat) * 1e3:.2f} | "
            f"{lat[int(0.99 * (len(lat) - 1))] * 1e3:.2f} |")


def bench_dask(args):
    out = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, Client(lc) as c:
        a, b = sorted(c.scheduler_info()["workers"])
        for n, mb, label in ((args.small, 0, "small"), (args.big, args.mb, f"{args.mb} MB")):
            if mb and args.warm_up:
                # Untimed, the same for each way: the first items of 10 MB on a
                # cluster pay for new memory (a worker keeps a stream's
                # segments for its later streams, ``coro.stream.segment-pool``).
                got, dt, lat = c.compute(consumer(args.warm_up, mb, args.buffer, b), workers=[a]).result()
                out.append(row(f"warm-up (untimed): dask_coro stream, {label}, buffer={args.buffer}", got, dt, lat))
                print(out[-1], flush=True)
                name = f"q-warm-up-{label}"
                pf = c.submit(q_producer, name, args.warm_up, mb, args.buffer, workers=[b], pure=False)
                got, dt, lat = c.submit(q_consumer, name, args.warm_up, args.buffer, workers=[a], pure=False).result()
                pf.result()
                out.append(row(f"warm-up (untimed): distributed.Queue(maxsize={args.buffer}), {label}", got, dt, lat))
                print(out[-1], flush=True)
            for buffer in (None, args.buffer):
                stop, peaks = threading.Event(), []
                idle = None
                if mb:
                    c.run(lambda: __import__("gc").collect())
                    t = threading.Thread(target=rss_sampler, args=(c, b, stop, peaks))
                    t.start()
                    while not peaks:
                        time.sleep(0.01)
                    idle = peaks[0]
                got, dt, lat = c.compute(consumer(n, mb, buffer, b), workers=[a]).result()
                stop.set()
                extra = ""
                if mb:
                    t.join()
                    extra = f" peak {(max(peaks) - idle) / 2**20:.0f} MiB above idle on the producer's worker"
                out.append(row(f"dask_coro stream, {label}, buffer={buffer}", got, dt, lat) + extra)
                print(out[-1], flush=True)
            for maxsize in (0, args.buffer):
                name = f"q-{label}-{maxsize}"
                pf = c.submit(q_producer, name, n, mb, maxsize, workers=[b], pure=False)
                got, dt, lat = c.submit(q_consumer, name, n, maxsize, workers=[a], pure=False).result()
                pf.result()
                what = "distributed.Queue" + (f"(maxsize={maxsize})" if maxsize else "")
                out.append(row(f"{what}, {label}", got, dt, lat))
                print(out[-1], flush=True)
    return out


def bench_ray(args):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    out = []
    try:
        @ray.remote(num_returns="streaming")
        def gen(n, mb):
            for i in range(n):
                yield payload(i, mb)

        @ray.remote
        def cons(n, mb):
            lat = []
            t0 = time.time()
            for ref in gen.remote(n, mb):
                item = ray.get(ref)
                lat.append(time.time() - item[1])
            return len(lat), time.time() - t0, lat

        for n, mb, label in ((args.small, 0, "small"), (args.big, args.mb, f"{args.mb} MB")):
            if mb and args.warm_up:
                got, dt, lat = ray.get(cons.remote(args.warm_up, mb))
                out.append(row(f"warm-up (untimed): Ray streaming generator, {label}", got, dt, lat))
                print(out[-1], flush=True)
            got, dt, lat = ray.get(cons.remote(n, mb))
            out.append(row(f"Ray streaming generator, {label}", got, dt, lat))
            print(out[-1], flush=True)
    finally:
        ray.shutdown()
    return out


SCENARIOS = [  # its section of RESULTS.md, run by run_all.py
    B.Scenario("streams", "Streams: small and large items against a Queue and Ray, run by run_all.py",
               ["--small", "2000", "--big", "20"], 300, json=False, quick=["--no-ray"]),
]


def main(argv=None) -> None:
    p = B.parser(__doc__, repeat=None, json=False)
    p.add_argument("--small", type=int, default=10_000)
    p.add_argument("--big", type=int, default=100)
    p.add_argument("--mb", type=int, default=10)
    p.add_argument("--buffer", type=int, default=16, help="the stream's buffer, the bounded Queue's maxsize")
    p.add_argument("--warm-up", type=int, default=20,
                   help="items of the large size each way streams once, untimed, before its timed rows (0: none)")
    p.add_argument("--no-ray", action="store_true")
    args = B.parse(p, argv, {"small": 50, "big": 2, "mb": 1, "warm_up": 2})
    print("| what | items | items/s | latency p50 (ms) | p99 (ms) |\n|---|---|---|---|---|")
    bench_dask(args)
    if not args.no_ray:
        bench_ray(args)


if __name__ == "__main__":
    main()
