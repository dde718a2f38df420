"""10,000 pending promises on a 1-thread worker: time to create them, to resolve them one by one
from a client, and the check that their dependent sums right.

Run: python benchmarks/bench_promises.py [--n 10000] [--quick]
"""

from __future__ import annotations

import sys
import time

import _bench as B
import dask

from dask_coro import Promise


def main(argv=None) -> int:
    p = B.parser(__doc__, repeat=None, json=False)
    p.add_argument("--n", type=int, default=10_000)
    n = B.parse(p, argv, quick={"n": 200}).n
    with B.cluster(n_workers=1) as client:
        created, promises = B.timed(lambda: [Promise() for _ in range(n)])
        total = client.compute(dask.delayed(sum)(promises))
        time.sleep(1)
        assert not total.done()  # every promise is parked, the sum waits
        resolved, _ = B.timed(lambda: [q.resolve_with(i) for i, q in enumerate(promises)])
        assert total.result() == n * (n - 1) // 2
    B.report(["pending promises", "create s", "resolve s", "per resolve ms"],
             [[n, f"{created:.1f}", f"{resolved:.1f}", f"{resolved / n * 1000:.2f}"]])
    return 0


SCENARIOS = [  # its sections of RESULTS.md, run by run_all.py
    B.Scenario("promises", "2,000 pending promises on a 1-thread worker",
               ["--n", "2000"], 60, json=False,
               notes="All were parked on the scheduler (no worker thread, slot or coroutine) while "
                     "their dependent waited, and the sum was right. One resolve is one vetting "
                     "round trip plus two messages on the client's batched stream. (2,000 rather "
                     "than the 10,000 of earlier suites, to keep this suite within 15 minutes; "
                     "the time per resolve does not depend on the number.)"),
]


if __name__ == "__main__":
    sys.exit(main())
