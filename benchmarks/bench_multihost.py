"""One large float64 array made on one host and read by 8 tasks on 2 hosts x 2 workers
(simulated hosts: tests/multihost.py): dask_coro.shm versus plain NumPy arrays, wall time
and bytes sent from one host to the other.

Run (as root, Linux): python benchmarks/bench_multihost.py [--mb 200] [--repeat 3] [--write]
Each run starts a fresh cluster of two hosts; the producer runs on host A, the readers
go round robin over the four workers, all submitted at once.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import _bench as B
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import multihost

HEADING = "## One large array read on two hosts: shared memory versus plain NumPy"
CHUNK = 1 << 20


def make(n, shared):
    from dask_coro import shm

    a = shm.empty(n, np.float64) if shared else np.empty(n, np.float64)
    for i in range(0, n, CHUNK):
        j = min(i + CHUNK, n)
        a[i:j] = np.arange(i, j, dtype=np.float64)
    return a


def read(a, i):
    return float(np.sum(a))


def crossing(dask_worker):
    """Bytes this worker sent to workers of another host: the shared arrays'
    copies (their transfer log counts a handle's size), and plain data."""
    from distributed.comm.addressing import get_address_host

    from dask_coro.lifetimes import shm

    here = get_address_host(dask_worker.address)
    plain = sum(
        e["total"] for e in dask_worker.transfer_outgoing_log
        if e.get("who") and get_address_host(e["who"]) != here
    )
    return shm.sent_to_other_hosts[0], plain, shm.copies_made[0]


def run_once(shared: bool, n: int, readers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        hosts = multihost.Hosts(Path(tmp), [2, 2])
        try:
            c = hosts.client
            a_workers, b_workers = hosts.workers_of(0), hosts.workers_of(1)
            workers = [w for pair in zip(a_workers, b_workers) for w in pair]
            c.run(lambda: read(make(8, shared), 0))  # imports, the lifetimes plugin
            start = time.perf_counter()
            src = c.submit(make, n, shared, workers=a_workers[:1], pure=False)
            futs = [c.submit(read, src, i, workers=[workers[i % 4]], pure=False) for i in range(readers)]
            sums = c.gather(futs)
            wall = time.perf_counter() - start
            assert sums == [float(n) * (n - 1) / 2] * readers, sums
            counts = c.run(crossing)
            sent = sum(counts[w][0] if shared else counts[w][1] for w in a_workers)
            copies_b = sum(counts[w][2] for w in b_workers)
            del src, futs
        finally:
            hosts.close()
    return {"wall": wall, "sent": sent, "copies": copies_b}


def main() -> None:
    p = B.parser(__doc__, write=True)
    p.add_argument("--mb", type=float, default=200)
    p.add_argument("--readers", type=int, default=8)
    args = B.parse(p, None, {"mb": 1, "repeat": 1})
    reason = multihost.available()
    if reason:
        sys.exit(f"bench_multihost: {reason}")
    n = int(args.mb * 1e6 / 8)
    res: dict[str, list[dict]] = {"shm": [], "numpy": []}
    for kind in B.interleaved(res, args.repeat):
        res[kind].append(run_once(kind == "shm", n, args.readers))
    med = {k: {f: B.median(r[f] for r in runs) for f in ("wall", "sent", "copies")} for k, runs in res.items()}
    size = n * 8
    header = ["", "wall (s)", "bytes sent A -> B", "arrays sent A -> B", "copies made on B"]
    rows = [[k, f"{m['wall']:.2f}", f"{m['sent'] / 1e6:.0f} MB", f"{m['sent'] / size:.1f}",
             f"{m['copies']:.0f}"] for k, m in med.items()]
    note = (f"A {size / 1e6:.0f} MB array made on host A, read by {args.readers} tasks over 2 "
            f"hosts x 2 workers; medians of {args.repeat} runs. shm / numpy wall: "
            f"{med['shm']['wall'] / med['numpy']['wall']:.2f} x.")
    B.report(header, rows, note)
    if args.write:
        B.write_section(HEADING, "bench_multihost.py", None, B.table(header, rows), note)
    B.write_json(args.json, med)


SCENARIOS = [  # its section of RESULTS.md, run by run_all.py (as root, on Linux)
    B.Scenario("multihost", HEADING.removeprefix("## "), ["--repeat", "3"], 300),
]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
