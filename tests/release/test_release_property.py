"""Property test of worker release (hypothesis): random DAGs of 20-200 tasks
on 2-3 workers, with and without ``coro.worker-release.enabled``, a client
adding dependents of finished keys mid-run and, in some examples, a worker
closed mid-run: the same, right results, no hang, distributed's validation on
for scheduler and workers, nothing left on either afterwards.

``--release-examples N`` sets how many DAGs (default 12 in CI).
"""

from __future__ import annotations

import asyncio
import random

import dask
import pytest
from distributed import Client, Scheduler, Worker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dask_coro.release.scheduler import NAME, ReleasePlugin

VALIDATE = {"distributed.scheduler.validate": True, "distributed.worker.validate": True}
# A worker fetching from the closed worker retries its address until the
# connect timeout (30 s by default; with or without worker release, about
# one example in four stalled that long): shorter, so that a stall cannot
# pass for a hang under wait_for's bound.
FAST_FAIL = {"distributed.comm.timeouts.connect": "3s"}


def node(i, *deps):
    return i + sum(deps) % 1_000_003


def plus_one(x):
    return x + 1


@st.composite
def dags(draw):
    n = draw(st.integers(20, 200))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    deps = [sorted(rng.sample(range(i), min(i, rng.randint(0, 3)))) for i in range(n)]
    extra = draw(st.lists(st.integers(0, n - 1), max_size=6, unique=True))
    workers = draw(st.integers(2, 3))
    kill = draw(st.booleans())
    return n, deps, extra, workers, kill


def expected(n, deps):
    values: list[int] = []
    for i in range(n):
        values.append(node(i, *(values[d] for d in deps[i])))
    return values


def graph(n, deps):
    return {f"t-{i}": (node, i, *(f"t-{d}" for d in deps[i])) for i in range(n)}


async def _until(cond, timeout=30.0, what=lambda: ""):
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"condition not reached {what()}"
        await asyncio.sleep(0.01)


def _held(workers) -> dict:
    """What each worker still holds: its keys in memory, its tasks' states,
    and the story of each task (distributed's ``WorkerState.story``)."""
    return {
        w.address: {
            "data": sorted(w.data),
            "tasks": {k: ts.state for k, ts in w.state.tasks.items()},
            "stories": {k: w.state.story(k)[-6:] for k in w.state.tasks},
        }
        for w in workers
    }


async def run(spec, enabled: bool) -> tuple[list[int], list[int], int]:
    n, deps, extra, n_workers, kill = spec
    dsk = graph(n, deps)
    dependents = {d for ds in deps for d in ds}
    sinks = [f"t-{i}" for i in range(n) if i not in dependents]
    with dask.config.set({**VALIDATE, **FAST_FAIL, "coro.worker-release.enabled": enabled}):
        async with Scheduler(dashboard_address=":0", port=0, validate=True) as s:
            workers = [await Worker(s.address, nthreads=1, validate=True) for _ in range(n_workers)]
            try:
                async with Client(s.address, asynchronous=True, set_as_default=False) as c:
                    if enabled:
                        await c.register_plugin(ReleasePlugin())
                        await _until(lambda: len(s.plugins[NAME].ready) == n_workers)
                    futs = c.get(dsk, sinks, sync=False)
                    # Mid-run: once a third of the tasks finished, dependents
                    # of finished keys (with their lineage, as a client would
                    # compute them) and maybe a lost worker.
                    await _until(lambda: sum(ts.state == "memory" for ts in s.tasks.values()) >= n // 3 or all(f.done() for f in futs))
                    more = c.get({**dsk, **{f"x-{j}": (plus_one, f"t-{j}") for j in extra}}, [f"x-{j}" for j in extra], sync=False)
                    if kill:
                        victim = workers.pop(random.Random(n).randrange(len(workers)))
                        await victim.close()
                        workers.append(await Worker(s.address, nthreads=1, validate=True))
                    got = await c.gather(futs)
                    got_more = await c.gather(more)
                    early = s.plugins[NAME].released_early if enabled else 0
                    futs = more = None  # let go of the keys
                await _until(lambda: not s.tasks)
                await _until(lambda: all(not w.data and not w.state.tasks for w in workers), what=lambda: _held(workers))
            finally:
                for w in workers:
                    await w.close()
    return got, got_more, early


def test_release_property(pytestconfig):
    if pytestconfig.getoption("--validate"):
        pytest.skip("validates on its own: its clusters run with validation on in any pass")
    examples = pytestconfig.getoption("--release-examples")
    early_total = []

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
    @given(dags())
    def check(spec):
        n, deps, extra, _, _ = spec
        values = expected(n, deps)
        dependents = {d for ds in deps for d in ds}
        want = [values[i] for i in range(n) if i not in dependents]
        want_more = [values[j] + 1 for j in extra]
        for enabled in (False, True):
            got, got_more, early = asyncio.run(asyncio.wait_for(run(spec, enabled), 120))
            assert list(got) == want and list(got_more) == want_more, (enabled, spec)
            if enabled:
                early_total.append(early)

    check()
    print(f"worker release: {len(early_total)} DAGs, {sum(early_total)} keys released early")
    assert sum(early_total) > 0  # the feature did something


pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
