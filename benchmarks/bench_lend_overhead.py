"""What lending adds to a coroutine's wait when its task has no resources
(the common case: one lookup and one coroutine frame around the wait), against
awaiting the wait directly; and a lend and take-back with resources, through
the worker's state machine, on an in-process worker.

Run: python benchmarks/bench_lend_overhead.py [--n 100000]
Prints microseconds per wait.
"""

from __future__ import annotations

import asyncio
import sys
import time

import _bench as B
from distributed import Event, Scheduler, Worker, secede

from dask_coro.resources.worker import _lender, lent


async def _ready() -> None:
    return None


async def _until(fut: asyncio.Future) -> None:
    return await fut


def _holds(hold):
    secede()
    Event(hold).wait()


async def main(n: int) -> None:
    from distributed import Client

    async with Scheduler(dashboard_address=":0") as s, Worker(s.address, nthreads=1, resources={"GPU": 1}) as w:
        async with Client(s.address, asynchronous=True) as c:
            # A long-running task with no resources, and one holding the GPU.
            plain = c.submit(_holds, "plain-hold", key="plain")
            gpu = c.submit(_holds, "gpu-hold", key="gpu", resources={"GPU": 1})
            while {"plain", "gpu"} - {ts.key for ts in w.state.long_running}:
                await asyncio.sleep(0.01)
            for label, key, wrap in [
                ("await the wait directly", "plain", False),
                ("through lent(), task without resources", "plain", True),
                ("through lent(), task with GPU: lend and take back", "gpu", True),
            ]:
                m = n if key == "plain" else n // 10
                start = time.perf_counter()
                for _ in range(m):
                    if wrap:
                        await lent(w, key, _ready(), _until)
                    else:
                        await _ready()
                us = (time.perf_counter() - start) / m * 1e6
                print(f"| {label} | {m} | {us:.2f} |")
            assert not _lender(w).book.lent and w.state.available_resources == {"GPU": 0}
            await Event("plain-hold", client=c).set()
            await Event("gpu-hold", client=c).set()
            await c.gather([plain, gpu])


SCENARIOS = [  # its section of RESULTS.md, run by run_all.py
    B.Scenario("lend", "Resources lent while a coroutine waits: microseconds a wait pays, run by "
               "run_all.py", [], 120, json=False),
]


def run(argv=None) -> None:
    p = B.parser(__doc__, repeat=None, json=False)
    p.add_argument("--n", type=int, default=100_000)
    args = B.parse(p, argv, {"n": 1_000})
    print("| wait | n | us per wait |\n|---|---|---|")
    asyncio.run(main(args.n))


if __name__ == "__main__":
    sys.exit(run())
