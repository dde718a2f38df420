"""One large float64 array made by one task and read by 8 tasks on 2 worker processes:
dask_coro.shm shared memory versus plain Dask transfer, wall time and peak memory.

Run: python benchmarks/bench_shm.py [--mb 200] [--readers 8] [--repeat 3] [--write] [--quick]
Linux only (it reads /proc and /dev/shm). A fresh cluster (2 worker processes x
1 thread) per run and alternative; it prints a Markdown table, and with
--write puts it in benchmarks/RESULTS.md (replacing this benchmark's section).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import _bench as B
import numpy as np
import psutil
from distributed import Client

from dask_coro import shm

HEADING = ("## One large array read by tasks on two workers: shared memory versus plain Dask "
           "transfer")
CHUNK = 1 << 20  # elements filled at a time, so filling allocates no second full-size array


def _fill(a):
    """a[i] = i, chunk by chunk."""
    for i in range(0, a.size, CHUNK):
        j = min(i + CHUNK, a.size)
        a[i:j] = np.arange(i, j, dtype=a.dtype)
    return a


def make_shm(n):
    return _fill(shm.empty(n, np.float64))


def make_plain(n):
    return _fill(np.empty(n, np.float64))


def read(a, i):
    """Reads every byte of ``a``; ``i`` only makes each reader a distinct task."""
    return float(np.sum(a))


def _warm(kind):
    """First use on a fresh cluster: imports, and for shm the lifetimes plugin
    (one round trip to the scheduler, once per cluster). Returns the segment
    made, if any, to wait for its release."""
    a = shm.empty(8, np.float64) if kind == "shm" else np.empty(8, np.float64)
    assert float(_fill(a).sum()) == 28.0
    return getattr(a, "segment_name", None)


# -- memory sampling --------------------------------------------------------


SHM_DIR = "/dev/shm/"


def shm_bytes(names) -> int:
    """Bytes allocated in /dev/shm by these segments (st_blocks, not st_size)."""
    total = 0
    for name in names:
        try:
            total += os.stat(SHM_DIR + name).st_blocks * 512
        except FileNotFoundError:  # unlinked (its pages go when the last mapping does)
            pass
    return total


def smaps(pid: int) -> tuple[int, int, set[str]]:
    """(USS, the part of it that is dask_coro shared memory, the dask_coro
    segments mapped) of a process, from /proc/<pid>/smaps; bytes. USS =
    Private_Clean + Private_Dirty, as psutil's memory_full_info().uss; a
    shared-memory page that only this process maps counts as private, so it
    is split out to be counted once, in /dev/shm."""
    uss = uss_shm = 0
    names: set[str] = set()
    in_shm = False
    marker = (SHM_DIR + shm.PREFIX).encode()
    with open(f"/proc/{pid}/smaps", "rb") as f:
        data = f.read()
    for line in data.splitlines():
        if line.startswith(b"Private_"):  # Private_Clean, Private_Dirty, Private_Hugetlb
            if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                kb = int(line.split()[1]) * 1024
                uss += kb
                if in_shm:
                    uss_shm += kb
        elif not line[:1].isupper():  # a mapping's header: "start-end perms ..."
            i = line.find(marker)
            in_shm = i >= 0
            if in_shm:
                names.add(line[i + len(SHM_DIR):].split()[0].decode())
    return uss, uss_shm, names


class MemPeak(B.Sampler):
    """Samples the worker processes' memory every ``interval`` seconds in the
    background; keeps the peak of each quantity and the dask_coro segments the
    workers mapped (other processes on this host may have their own)."""

    FIELDS = ("rss", "shm", "total")
    first = False  # the baseline is sampled on its own, before submitting

    def __init__(self, pids: list[int], interval: float):
        super().__init__(interval)
        self.procs = [psutil.Process(p) for p in pids]
        self.peak = dict.fromkeys(self.FIELDS, 0)
        self.names: set[str] = set()
        self.samples = 0
        self.sampling_s = 0.0

    def sample(self) -> dict[str, int]:
        rss = private = 0
        names: set[str] = set()
        for p in self.procs:
            rss += p.memory_info().rss
            uss, uss_shm, mapped = smaps(p.pid)
            private += uss - uss_shm
            names |= mapped
        self.names |= names
        dev_shm = shm_bytes(names)
        return {"rss": rss, "shm": dev_shm, "total": private + dev_shm}

    def _record(self) -> None:
        t = time.thread_time()  # CPU, kernel time reading /proc included
        super()._record()
        self.sampling_s += time.thread_time() - t
        self.samples += 1


# -- one run ----------------------------------------------------------------


def run_once(kind: str, n: int, readers: int, interval: float) -> dict:
    """On a fresh cluster: the producer pinned to worker A, readers pinned
    alternately to A and B, all submitted at once."""
    make = make_shm if kind == "shm" else make_plain
    with B.cluster() as client:
        workers = sorted(client.scheduler_info()["workers"])
        pids = client.run(os.getpid)
        warm = {client.submit(_warm, kind, workers=[w], pure=False).result() for w in workers}
        _wait_released(client, warm - {None})
        sampler = MemPeak([pids[w] for w in workers], interval)
        base = sampler.sample()
        with sampler:
            start = time.perf_counter()
            src = client.submit(make, n, workers=[workers[0]], allow_other_workers=False,
                                pure=False)
            futs = [client.submit(read, src, i, workers=[workers[i % 2]],
                                  allow_other_workers=False, pure=False)
                    for i in range(readers)]
            sums = client.gather(futs)
            wall = time.perf_counter() - start
        where = client.who_has(futs)
        per_worker = [sum(1 for f in futs if w in where[f.key]) for w in workers]
        del src, futs
        left = _wait_released(client, sampler.names)
    return {"wall": wall, "peak": sampler.peak, "base": base, "samples": sampler.samples,
            "sample_ms": sampler.sampling_s / sampler.samples * 1000, "sums": sums,
            "per_worker": per_worker, "segments": len(sampler.names), "left": left}


def _lifetimes_idle(dask_scheduler) -> bool:
    """Whether dask_coro's scheduler plugin has no tie or release pending."""
    plugin = dask_scheduler.plugins.get("dask-coro-lifetimes")
    return not getattr(plugin, "ledger", None)


def _wait_released(client: Client, names, timeout: float = 10.0) -> int:
    """Waits until these segments are gone from /dev/shm and the scheduler has
    no release in flight (closing the cluster while a worker acknowledges one
    would log a spurious "releases are owed" warning); returns how many of
    the segments are left."""
    with contextlib.suppress(TimeoutError):
        B.wait_for(lambda: not any(os.path.exists(SHM_DIR + nm) for nm in names)
                   and client.run_on_scheduler(_lifetimes_idle), timeout, "segments released")
    return sum(os.path.exists(SHM_DIR + nm) for nm in names)


# -- report -----------------------------------------------------------------


def table(args, res: dict[str, list[dict]]) -> str:
    fields = [*MemPeak.FIELDS, "above"]
    for runs in res.values():
        for r in runs:
            r["peak"]["above"] = r["peak"]["total"] - r["base"]["total"]
            r["base"]["above"] = 0
    med = {k: {"wall": B.median(r["wall"] for r in runs),
               **{f: B.median(r["peak"][f] for r in runs) for f in fields},
               "base": B.median(r["base"]["total"] for r in runs)}
           for k, runs in res.items()}
    s, p = med["shm"], med["plain"]

    def placement(runs):
        each = [" + ".join(map(str, r["per_worker"])) for r in runs]
        return f"{each[0]} in every run" if len(set(each)) == 1 else ", ".join(each)

    def row(label, f, ratio=True):
        r = B.ratio(s[f], p[f]) if ratio else "-"
        return f"| {label} | {B.mib(s[f])} | {B.mib(p[f])} | {r} |"

    return "\n".join([
        f"| {args.mb} MB, {args.readers} readers, median of {args.repeat} runs | shared memory "
        f"| plain Dask | shm / plain |",
        "|---|---|---|---|",
        f"| wall time s | {s['wall']:.2f} | {p['wall']:.2f} | {B.ratio(s['wall'], p['wall'])} |",
        row("peak sum of worker RSS MB", "rss"),
        row("peak /dev/shm used MB", "shm", ratio=False),
        row("peak total: worker USS + /dev/shm MB", "total"),
        row("peak total minus baseline MB", "above"),
        row("baseline total, idle workers MB", "base"),
        f"| readers on producer's worker + other worker "
        f"| {placement(res['shm'])} | {placement(res['plain'])} | |",
    ])


def notes(args, res: dict[str, list[dict]]) -> str:
    runs = [r for rs in res.values() for r in rs]
    cost = B.median(r["sample_ms"] for r in runs)
    left = sum(r["left"] for r in res["shm"])
    released = "Every reader result equalled n(n-1)/2 in both versions. " + (
        "After the futures were released, the run's segment was gone from /dev/shm "
        f"in each of the {len(res['shm'])} shared-memory runs."
        if left == 0 else
        f"After the futures were released, {left} segment(s) of the shared-memory runs "
        "were still in /dev/shm 10 s later."
    )
    return f"""\
Wall time: from submitting the producer and the readers (together; each reader
depends on the producer) until all reader results are back on the client; a
fresh cluster per run and alternative, alternatives interleaved. The producer
is pinned to one worker and fills a float64 array with 0, 1, 2, ... (in place,
chunk by chunk); the readers are pinned alternately to both workers (where
they ran is read back with `client.who_has`) and each returns `np.sum` of the
whole array. Plain Dask sends the array to the other worker once (serialized,
over TCP); shared memory sends a handle and the other worker maps the same
pages. Memory is sampled every {args.interval * 1000:.0f} ms from the client process during the
run and once at its end (a sample, which reads /proc/PID/smaps of both workers,
takes about {cost:.0f} ms of the client's CPU: a load on the 2 cores in both
alternatives); peaks are per row, not necessarily from one sample:

- *sum of worker RSS*: resident memory of the two worker processes added up.
  RSS counts a shared page in every process that has touched it, so the
  shared array, read on both workers, is counted twice there.
- */dev/shm used*: bytes allocated in /dev/shm by the `dask-coro-` segments
  the workers map.
- *total*: each worker's USS (its private pages, `Private_Clean +
  Private_Dirty` from /proc/PID/smaps, as psutil's `memory_full_info().uss`)
  less the shared-memory pages it alone maps, plus /dev/shm used: every page
  counted once, the fair comparison. *Minus baseline* subtracts the same
  quantity sampled just before submitting (two idle workers).

""" + B.fill(released)


def main(argv=None) -> int:
    p = B.parser(__doc__, json=False, write=True)
    p.add_argument("--mb", type=int, default=200, help="array size in MiB")
    p.add_argument("--readers", type=int, default=8)
    p.add_argument("--interval", type=float, default=0.05, help="memory sampling period, s")
    args = B.parse(p, argv, quick={"mb": 8, "readers": 2, "repeat": 1})
    argv = sys.argv[1:] if argv is None else argv
    n = args.mb * 2**20 // 8
    expected = float(n * (n - 1) // 2)  # exact: every partial sum is an integer below 2**53
    assert n * (n - 1) // 2 < 2**53, "--mb too large for an exact check"
    res: dict[str, list[dict]] = {"shm": [], "plain": []}
    t0 = time.perf_counter()
    for kind in B.interleaved(res, args.repeat):
        out = run_once(kind, n, args.readers, args.interval)
        assert out["sums"] == [expected] * args.readers, (kind, out["sums"])
        assert out["segments"] == (kind == "shm"), out["segments"]  # seen by the sampler
        res[kind].append(out)
        B.log(f"run {len(res[kind])} {kind}: {out['wall']:.2f} s, peak total "
              f"{B.mib(out['peak']['total'])} MB, readers per worker {out['per_worker']}, "
              f"{out['samples']} samples of {out['sample_ms']:.0f} ms, "
              f"{out['segments']} segment(s), {out['left']} left after release")
    assert [r["sums"] for r in res["shm"]] == [r["sums"] for r in res["plain"]]
    body, text = table(args, res), notes(args, res)
    print(body)
    print()
    print(text)
    B.log(f"({time.perf_counter() - t0:.0f} s in all)")
    if args.write:
        B.write_section(HEADING, "bench_shm.py", argv, body, text)
    return 0


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("shm", "One large array read by tasks on two workers: shared memory versus plain "
               "Dask transfer",
               [], 60, json=False),
]


if __name__ == "__main__":
    sys.exit(main())
