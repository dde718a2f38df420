"""Dask collections yielded in a body, against plain Dask.

Each case is one program, a function that builds a collection: yielded in a
coroutine's body, and computed with ``client.compute`` in a ``worker_client``
task, on one process cluster shared by the module (2 workers, 1 thread
each), with dask's default settings. The two must agree. P2P shuffles and
rechunks (dask picks them on a distributed cluster, and ``method="p2p"``)
find their barrier by the keys dask gave them, which a yield keeps.
"""

from __future__ import annotations

import asyncio
import time

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pandas as pd
import pytest
from dask.utils import key_split
from distributed import Client, LocalCluster, get_client, worker_client

from dask_coro import coroutine

dd = pytest.importorskip("dask.dataframe")

# Collections are never run inline; the cluster runs dask_coro's defaults.
pytestmark = pytest.mark.inline

TIMEOUT = 120  # s a computation may take at most on a loaded machine: a bound


@pytest.fixture(scope="module")
def client(request):
    validate = request.config.getoption("--validate")
    kwargs = {"validate": True, "scheduler_kwargs": {"validate": True}} if validate else {}
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", **kwargs
    ) as cluster, Client(cluster) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


@coroutine
def in_body(build, *args):
    return (yield build(*args))


def in_task(build, *args):
    with worker_client() as c:
        return c.gather(c.compute(build(*args)))


def both(client, build, *args):
    """``build(*args)`` computed in a body and in a worker_client task."""
    body = client.compute(in_body(build, *args)).result(timeout=TIMEOUT)
    plain = client.submit(in_task, build, *args, pure=False).result(timeout=TIMEOUT)
    return body, plain


def rows(frame, index=True):
    """A frame's rows, with their index unless ``index`` is False, in one
    order: a shuffle's output partition holds its rows in the order their
    shards arrived (in plain Dask too), so the row order is not the same from
    run to run."""
    flat = frame.reset_index(drop=not index)
    if isinstance(flat, pd.Series):
        flat = flat.to_frame()
    return flat.sort_values(list(flat.columns), ignore_index=True)


def assert_same(a, b, index=True):
    """``index=False``: frames whose index labels carry no meaning, as a
    merge's: each output partition numbers its rows from 0 in the order their
    shards arrived, so which row has which label differs from run to run (in
    plain Dask too); their rows are compared without it."""
    if isinstance(a, (pd.DataFrame, pd.Series)):
        assert type(a) is type(b)
        pd.testing.assert_frame_equal(rows(a, index), rows(b, index))
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y, index)
    elif type(a).__module__.startswith("xarray"):
        import xarray as xr

        xr.testing.assert_identical(a, b)
    else:
        np.testing.assert_array_equal(a, b)


def p2p_used(build, *args):
    """Whether the graph ``build(*args)`` makes, on a worker, has a P2P barrier."""
    graph = build(*args).__dask_graph__()
    return any("barrier" in key_split(k) for k in graph)


# -- the programs ---------------------------------------------------------------


def square(n=40, chunks=10):
    return da.arange(n * n, chunks=n * chunks).reshape(n, n)


def rechunk(method):
    # Rows to columns: all to all, where dask picks P2P on a cluster.
    return square(chunks=1).rechunk((40, 1), method=method).sum(axis=0)


def reductions():
    x = square().astype(float)
    return x.mean(axis=0), x.std(), x.max(axis=1), da.argmin(x, axis=0)


def mapped_blocks():
    return square().map_blocks(lambda b: b * 2 + 1, dtype=int).sum(axis=1)


def mapped_overlap():
    return square().map_overlap(lambda b: b - np.roll(b, 1, axis=0), depth=1, boundary="none", dtype=int)


def linalg():
    x = da.from_array(np.arange(400.0).reshape(100, 4) % 7 + np.eye(100, 4), chunks=(25, 4))
    _, r = da.linalg.tsqr(x)
    return r, (x.T @ x)


def frames():
    pdf = pd.DataFrame({"k": np.arange(200) % 13, "x": np.arange(200.0), "y": np.arange(200) % 7})
    other = pd.DataFrame({"k": np.arange(13), "z": np.arange(13) * 10})
    return dd.from_pandas(pdf, npartitions=5), dd.from_pandas(other, npartitions=3)


def merge(method):
    a, b = frames()
    return a.merge(b, on="k", shuffle_method=method)


def groupby_agg():
    a, _ = frames()
    return a.groupby("k").agg({"x": "sum", "y": "max"})


def groupby_split_out(method):
    a, _ = frames()
    return a.groupby("k").x.sum(split_out=3, shuffle_method=method)


def value_counts_nunique():
    a, _ = frames()
    return a.y.value_counts(split_out=2), a.k.nunique()


def set_index():
    a, _ = frames()
    return a.set_index("y")


def shuffle(method):
    a, _ = frames()
    return a.shuffle("k", method=method)


def rolling():
    a, _ = frames()
    return a.x.rolling(5).mean()


def quantile():
    a, _ = frames()
    return a.x.quantile([0.25, 0.5, 0.9])


def bag_groupby():
    b = db.from_sequence(range(100), npartitions=4)
    return b.groupby(lambda v: v % 7).map(lambda kv: (kv[0], sorted(kv[1])))


def bag_foldby():
    b = db.from_sequence(range(100), npartitions=4)
    return b.foldby(lambda v: v % 7, lambda acc, v: acc + v, 0)


def dataset():
    import xarray as xr

    times = pd.date_range("2000-01-01", periods=48, freq="6h")
    data = np.arange(48 * 4.0).reshape(48, 4)
    return xr.Dataset(
        {"t": (("time", "x"), data)}, coords={"time": times, "x": np.arange(4)}
    ).chunk({"time": 12})


def xr_mean():
    return dataset().mean("time")


def xr_resample():
    return dataset().resample(time="1D").mean()


def xr_groupby():
    return dataset().groupby("time.hour").mean()


def by_method(name: str, build, methods=("tasks", "p2p", None)) -> dict:
    """A case of ``build(method)`` per method: ``name-tasks``, ``name-p2p``,
    and ``name-default`` (None: the method dask picks)."""
    return {f"{name}-{method or 'default'}": (build, method) for method in methods}


CASES = {
    **by_method("rechunk", rechunk),
    "reductions": (reductions,),
    "map_blocks": (mapped_blocks,),
    "map_overlap": (mapped_overlap,),
    "linalg": (linalg,),
    **by_method("merge", merge),
    "groupby-agg": (groupby_agg,),
    **by_method("groupby-split_out", groupby_split_out, ("p2p", None)),
    "value_counts-nunique": (value_counts_nunique,),
    "set_index": (set_index,),
    **by_method("shuffle", shuffle),
    "rolling": (rolling,),
    "quantile": (quantile,),
    "bag-groupby": (bag_groupby,),
    "bag-foldby": (bag_foldby,),
    "xarray-mean": (xr_mean,),
    "xarray-resample": (xr_resample,),
    "xarray-groupby": (xr_groupby,),
}


def yielded(build, *args):
    """What a body yields: the collection, or a tuple of them as one yield."""
    out = build(*args)
    return list(out) if isinstance(out, tuple) else out


def as_built(build, *args):
    out = yielded(build, *args)
    return tuple(out) if isinstance(out, list) else out


@pytest.mark.parametrize("case", list(CASES))
def test_a_collection_in_a_body_gives_what_plain_dask_gives(client, case):
    if case.startswith("xarray"):
        pytest.importorskip("xarray")
    build, *args = CASES[case]
    body, plain = both(client, yielded, build, *args)
    index = build is not merge
    assert_same(as_tuple(body), as_tuple(plain), index)
    # The local answer, with dask's synchronous scheduler (where P2P cannot run).
    args = ["tasks" if a in ("p2p", None) else a for a in args]
    with dask.config.set({"dataframe.shuffle.method": "tasks", "array.rechunk.method": "tasks"}):
        local = dask.compute(as_built(build, *args), scheduler="sync")[0]
    assert_same(as_tuple(body), as_tuple(local), index)


def as_tuple(x):
    return tuple(x) if isinstance(x, (list, tuple)) else x


@pytest.mark.parametrize("case", ["rechunk-default", "merge-default", "groupby-split_out-default", "shuffle-default"])
def test_dask_picks_p2p_on_the_cluster_by_default(client, case):
    # So the "-default" cases above are P2P ones, as the same program is
    # in a worker_client task.
    build, *args = CASES[case]
    assert client.submit(p2p_used, build, *args, pure=False).result(timeout=TIMEOUT)


# -- a collection persisted in the body, and one built from Futures -------------


@coroutine
def persisted_in_body():
    x = da.arange(100, chunks=10).persist()
    s = yield x.sum()
    m = yield (x * 2).max()
    return s, m


def persisted_in_task():
    with worker_client() as c:
        x = c.persist(da.arange(100, chunks=10))
        return c.compute(x.sum()).result(), c.compute((x * 2).max()).result()


def test_a_collection_persisted_in_the_body(client):
    body = client.compute(persisted_in_body()).result(timeout=TIMEOUT)
    plain = client.submit(persisted_in_task, pure=False).result(timeout=TIMEOUT)
    assert body == plain == (4950, 198)


def from_futures():
    c = get_client()
    parts = [c.submit(np.arange, i * 10, (i + 1) * 10, pure=False) for i in range(4)]
    return da.concatenate([da.from_delayed(p, shape=(10,), dtype=int) for p in parts]).sum()


def test_a_collection_built_from_futures(client):
    body, plain = both(client, from_futures)
    assert body == plain == sum(range(40))


# -- one yield is one dask.compute ------------------------------------------------


def load(i, path):
    """A chunk of data that is not the same twice, recording each load."""
    with open(path, "a") as f:
        f.write(f"{i}\n")
    return np.random.default_rng().random(10)


def loaded(path):
    parts = [dask.delayed(load)(i, path) for i in range(4)]
    return da.concatenate([da.from_delayed(p, shape=(10,), dtype=float) for p in parts])


@coroutine
def sum_and_mean(path):
    x = loaded(path)
    s, m = yield [x.sum(), x.mean()]
    return s, m


def sum_and_mean_in_task(path):
    x = loaded(path)
    with worker_client() as c:
        return tuple(c.gather(c.compute([x.sum(), x.mean()])))


def test_collections_of_one_yield_share_their_tasks(client, tmp_path):
    # s, m = yield [x.sum(), x.mean()] is dask.compute(x.sum(), x.mean()):
    # every chunk of x loaded once, so both come from the same data.
    body_path, plain_path = str(tmp_path / "body"), str(tmp_path / "plain")
    s, m = client.compute(sum_and_mean(body_path)).result(timeout=TIMEOUT)
    with open(body_path) as f:
        assert sorted(f.read().split()) == ["0", "1", "2", "3"]
    assert s == pytest.approx(m * 40)
    s, m = client.submit(sum_and_mean_in_task, plain_path, pure=False).result(timeout=TIMEOUT)
    with open(plain_path) as f:
        assert sorted(f.read().split()) == ["0", "1", "2", "3"]
    assert s == pytest.approx(m * 40)


# -- planning never blocks the worker's event loop ------------------------------


async def _lag_probe(dask_worker, interval=0.02):
    """Record the longest the worker's event loop took to answer a timer."""
    dask_worker._coll_lag = 0.0
    loop = asyncio.get_running_loop()

    async def probe():
        while True:
            t = loop.time()
            await asyncio.sleep(interval)
            dask_worker._coll_lag = max(dask_worker._coll_lag, loop.time() - t - interval)

    dask_worker._coll_probe = asyncio.ensure_future(probe())


async def _lag_read(dask_worker):
    dask_worker._coll_probe.cancel()
    return dask_worker._coll_lag


def big_array(n):
    return da.ones(n * 4, chunks=4).sum()


def big_delayed(n):
    return [dask.delayed(int)(i) for i in range(n)]


@coroutine
def yields(build, n):
    yield build(n)


def sends_in_task(build, n):
    """The same graph from a worker_client task: built and sent, and once
    the scheduler has it, let go of (the futures go as the task returns)."""
    with worker_client() as c:
        futures = c.compute(build(n))
        wait_for(lambda: c.run_on_scheduler(scheduler_tasks) > n, "the plain graph arrived")
        del futures


def scheduler_tasks(dask_scheduler):
    return len(dask_scheduler.tasks)


def wait_for(cond, what, timeout=TIMEOUT * 2):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("build, n", [(big_array, 20_000), (big_delayed, 2_000)], ids=["array", "delayed"])
def test_a_big_yield_never_blocks_the_workers_event_loop(client, build, n):
    # The longest the worker's loop took to answer a 20 ms timer while a body
    # planned and sent a graph of 20,000 tasks (an array; 2,000 Delayed
    # leaves, each renamed: some 0.5 ms each, in the body's thread), beside
    # the same graph built and sent from a worker_client task. Planning and serializing run in
    # the body's own thread, as the worker_client task builds its graph in
    # its thread: the loop answers within a second (or, on a machine so
    # loaded that the plain task's loop stalls too, within twice its
    # stall). Only until the scheduler has the graph: running 20,000 tasks
    # is not what is measured.
    (addr, *_) = client.scheduler_info()["workers"]
    client.run(_lag_probe, workers=[addr])
    client.submit(sends_in_task, build, n, pure=False, workers=[addr]).result(timeout=TIMEOUT * 2)
    plain = client.run(_lag_read, workers=[addr])[addr]
    wait_for(lambda: client.run_on_scheduler(scheduler_tasks) == 0, "the plain graph left")
    client.run(_lag_probe, workers=[addr])
    root = client.compute(yields(build, n), workers=[addr])
    wait_for(lambda: client.run_on_scheduler(scheduler_tasks) > n, "the body's graph arrived")
    body = client.run(_lag_read, workers=[addr])[addr]
    root.cancel()
    wait_for(lambda: client.run_on_scheduler(scheduler_tasks) == 0, "the body's graph left")
    assert body < max(1.0, 2 * plain), (body, plain)
