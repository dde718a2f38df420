"""One large float64 array made by one task and read by 8 tasks on 2 worker processes: dask_coro.shm shared memory versus plain Dask transfer, wall time and peak memory.

Run: python benchmarks/bench_shm.py [--mb 200] [--readers 8] [--repeat 3] [--write]
Linux only (it reads /proc and /dev/shm). A fresh cluster (2 worker processes x
1 thread) per run and alternative; it prints a Markdown table, and with
--write puts it in benchmarks/RESULTS.md (replacing this benchmark's section).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import threading
import time

import numpy as np
import psutil
from distributed import Client, LocalCluster

from dask_coro import shm

HEADING = "## One large array read by tasks on two workers: shared memory versus plain Dask transfer"
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
    (one round trip to the scheduler, once per cluster)."""
    a = shm.empty(8, np.float64) if kind == "shm" else np.empty(8, np.float64)
    return float(_fill(a).sum())


# -- memory sampling --------------------------------------------------------


def shm_bytes() -> int:
    """Bytes allocated in /dev/shm by dask_coro segments (st_blocks, not st_size)."""
    total = 0
    for name in shm.segments():
        try:
            total += os.stat(os.path.join("/dev/shm", name)).st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def uss_split(pid: int) -> tuple[int, int]:
    """(USS, the part of it that is dask_coro shared memory) of a process, in
    bytes, from /proc/<pid>/smaps. USS = Private_Clean + Private_Dirty, as
    psutil's memory_full_info().uss; a shared-memory page that only this
    process maps counts as private, so it is split out to count it once."""
    uss = uss_shm = 0
    in_shm = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if not head.endswith(":"):  # a mapping's header line
                in_shm = "/dev/shm/" + shm.PREFIX in line
            elif head in ("Private_Clean:", "Private_Dirty:"):
                kb = int(line.split()[1]) * 1024
                uss += kb
                if in_shm:
                    uss_shm += kb
    return uss, uss_shm


class MemPeak:
    """Samples the worker processes' memory every ``interval`` seconds in the
    background; keeps the peak of each quantity."""

    FIELDS = ("rss", "shm", "total")

    def __init__(self, pids: list[int], interval: float = float(os.environ.get("BS_INT", "0.05"))):
        self.procs = [psutil.Process(p) for p in pids]
        self.interval = interval
        self.peak = dict.fromkeys(self.FIELDS, 0)
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[str, int]:
        rss = sum(p.memory_info().rss for p in self.procs)
        private = 0
        for p in self.procs:
            uss, uss_shm = uss_split(p.pid)
            private += uss - uss_shm
        dev_shm = shm_bytes()
        return {"rss": rss, "shm": dev_shm, "total": private + dev_shm}

    def _record(self) -> None:
        s = self.sample()
        self.samples += 1
        for k in self.FIELDS:
            self.peak[k] = max(self.peak[k], s[k])

    def _run(self) -> None:
        while not self._stop.is_set():
            self._record()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self._record()  # the state at the end counts too


# -- one run ----------------------------------------------------------------


def run_once(kind: str, n: int, readers: int) -> dict:
    """On a fresh cluster: the producer pinned to worker A, readers pinned
    alternately to A and B, all submitted at once."""
    make = make_shm if kind == "shm" else make_plain
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        workers = sorted(client.scheduler_info()["workers"])
        pids = client.run(os.getpid)
        for w in workers:
            assert client.submit(_warm, kind, workers=[w], pure=False).result() == 28.0
        _wait_no_segments(10)
        sampler = MemPeak([pids[w] for w in workers])
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
        segs_during = shm.segments()
        del src, futs
        gone = _wait_no_segments(10)
    return {"wall": wall, "peak": sampler.peak, "base": base, "samples": sampler.samples,
            "sums": sums, "per_worker": per_worker, "segments_during": len(segs_during),
            "segments_after": gone}


def _wait_no_segments(timeout: float) -> int:
    """Waits until /dev/shm holds no dask_coro segment; returns how many are left."""
    deadline = time.monotonic() + timeout
    while shm.segments() and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(shm.segments())


# -- report -----------------------------------------------------------------


def _mb(b: float) -> str:
    return f"{b / 2**20:.0f}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def table(args, res: dict[str, list[dict]]) -> str:
    med = {k: {"wall": statistics.median(r["wall"] for r in runs),
               **{f: statistics.median(r["peak"][f] for r in runs) for f in MemPeak.FIELDS},
               **{"base_" + f: statistics.median(r["base"][f] for r in runs)
                  for f in MemPeak.FIELDS}}
           for k, runs in res.items()}
    s, p = med["shm"], med["plain"]
    placement = {k: ", ".join(" + ".join(map(str, r["per_worker"])) for r in runs)
                 for k, runs in res.items()}
    lines = [
        f"| {args.mb} MB, {args.readers} readers, median of {args.repeat} | shared memory "
        f"| plain Dask | shm / plain |",
        "|---|---|---|---|",
        f"| wall time s | {s['wall']:.2f} | {p['wall']:.2f} | {_ratio(s['wall'], p['wall'])} |",
        f"| peak sum of worker RSS MB | {_mb(s['rss'])} | {_mb(p['rss'])} "
        f"| {_ratio(s['rss'], p['rss'])} |",
        f"| peak /dev/shm used MB | {_mb(s['shm'])} | {_mb(p['shm'])} | - |",
        f"| peak total: worker USS + /dev/shm MB | {_mb(s['total'])} | {_mb(p['total'])} "
        f"| {_ratio(s['total'], p['total'])} |",
        f"| same, before submitting (baseline) MB | {_mb(s['base_total'])} "
        f"| {_mb(p['base_total'])} | |",
        f"| readers run on producer's worker + other worker, per run "
        f"| {placement['shm']} | {placement['plain']} | |",
    ]
    return "\n".join(lines)


NOTES = """\
Wall time: from submitting the producer and the readers (together; each reader
depends on the producer) until all reader results are back on the client. The
producer is pinned to one worker and fills a float64 array with 0, 1, 2, ...
(in place, chunk by chunk); the readers are pinned alternately to both workers
and each returns `np.sum` of the whole array. Plain Dask moves the array to the
other worker once (over TCP, serialized); shared memory moves a handle and the
other worker maps the same pages. Memory is sampled every 50 ms from the
client process while the run lasts (peaks are per column, so they need not
come from the same sample):

- *sum of worker RSS*: resident memory of the two worker processes added up.
  RSS counts a shared page in every process that has touched it, so a
  shared-memory array read on both workers is counted twice here.
- */dev/shm used*: bytes allocated by `dask-coro-` segments in /dev/shm.
- *total*: each worker's USS (its private pages, `Private_Clean +
  Private_Dirty` from /proc/PID/smaps, what psutil reports as `uss`) without
  the shared-memory pages it alone maps, plus /dev/shm used: every page
  counted once, which is the fair comparison. The baseline row is the same
  quantity sampled just before submitting (two idle workers).

Every reader result was checked equal to n(n-1)/2 in both versions, and both
versions gave the same results."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=200, help="array size in MiB")
    p.add_argument("--readers", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--write", action="store_true",
                   help="put the table in benchmarks/RESULTS.md (this benchmark's section)")
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    n = args.mb * 2**20 // 8
    expected = float(n * (n - 1) // 2)  # exact: every partial sum is an integer below 2**53
    assert n * (n - 1) // 2 < 2**53, "--mb too large for an exact check"
    res: dict[str, list[dict]] = {"shm": [], "plain": []}
    t0 = time.perf_counter()
    for r in range(args.repeat):
        order = ("shm", "plain") if r % 2 == 0 else ("plain", "shm")
        for kind in order:
            out = run_once(kind, n, args.readers)
            assert out["sums"] == [expected] * args.readers, (kind, out["sums"])
            res[kind].append(out)
            print(f"run {r + 1} {kind}: {out['wall']:.2f} s, peak total "
                  f"{_mb(out['peak']['total'])} MB, readers per worker {out['per_worker']}, "
                  f"{out['samples']} samples, segments during {out['segments_during']}, "
                  f"left after release {out['segments_after']}", file=sys.stderr, flush=True)
    assert [r["sums"] for r in res["shm"]] == [r["sums"] for r in res["plain"]]
    leaked = sum(r["segments_after"] for r in res["shm"])
    body = table(args, res)
    after = ("After the futures were released, /dev/shm held no `dask-coro-` segment "
             f"in any of the {args.repeat} shared-memory runs." if leaked == 0 else
             f"After the futures were released, {leaked} `dask-coro-` segment(s) were "
             "still in /dev/shm 10 s later.")
    print(body)
    print()
    print(after)
    print(f"({time.perf_counter() - t0:.0f} s in all)", file=sys.stderr)
    if args.write:
        command = shlex.join(["python", "benchmarks/bench_shm.py", *argv])
        section = f"{HEADING}\n\nCommand: `{command}`\n\n{body}\n\n{NOTES}\n{after}\n"
        _write(section)
    return 0


def _write(section: str) -> None:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
    with open(path) as f:
        text = f.read()
    start = text.find(HEADING + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(HEADING))
        rest = "" if end < 0 else text[end:]
        text = text[:start] + section + rest
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
