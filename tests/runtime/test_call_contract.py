"""What a coroutine call promises as a dask ``Delayed``, each beside the same
program written with ``dask.delayed``: the contract any lighter call object
must keep. Client side under dask's synchronous scheduler, from
the client of a cluster, and built inside a coroutine running on a worker."""

from __future__ import annotations

import operator
import pickle

import cloudpickle
import dask
import dask.bag as db
import pytest
from dask.delayed import Delayed
from helpers import inline_and_as_tasks

from dask_coro import coroutine


class Box:
    def __init__(self, value):
        self.value = value

    def scaled(self, k):
        return self.value * k


def _inc(x):
    return x + 1


def _pair(x):
    return (x, x + 10)


def _box(x):
    return Box(x)


def _upto(n):
    return list(range(n))


def _add(x, y):
    return x + y


FUNCS = {f.__name__: f for f in (_inc, _pair, _box, _upto, _add)}
CORO = {name: coroutine(f) for name, f in FUNCS.items()}
CORO["_pair"] = coroutine(_pair, nout=2)


def coro_call(name, *args):
    return CORO[name](*args)


def delayed_call(name, *args):
    nout = 2 if name == "_pair" else None
    return dask.delayed(FUNCS[name], nout=nout)(*args)


# Each program builds a lazy value with ``make`` (a coroutine call or a
# dask.delayed call of the same function); both must compute the same.
PROGRAMS = {
    "compute": lambda make: make("_inc", 1),
    "getitem": lambda make: make("_pair", 1)[1],
    "unpack": lambda make: list(make("_pair", 2)),
    "attribute": lambda make: make("_box", 3).value,
    "method call": lambda make: make("_box", 3).scaled(4),
    "operators": lambda make: (make("_inc", 1) + make("_inc", 2)) * 3 - make("_inc", 0),
    "unary and compare": lambda make: [-make("_inc", 1), make("_inc", 1) < 5, abs(make("_inc", -9))],
    "sum of calls": lambda make: sum(make("_inc", i) for i in range(5)),
    "call in a call": lambda make: make("_add", make("_inc", 1), make("_pair", 5)[0]),
    "nested shape": lambda make: {"a": [make("_inc", 1), (make("_inc", 2),)], "b": 7},
}


def _bag(make):
    return db.from_delayed([make("_upto", 4), make("_upto", 3)]).map(operator.mul, 2)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_compute_as_with_dask_delayed(name):
    build = PROGRAMS[name]
    (want,) = dask.compute(build(delayed_call), scheduler="sync")
    (got,) = dask.compute(build(coro_call), scheduler="sync")
    assert got == want


def test_bag_from_delayed_takes_calls_as_dask_delayed():
    want = _bag(delayed_call).compute(scheduler="sync")
    got = _bag(coro_call).compute(scheduler="sync")
    assert got == want == [0, 2, 4, 6, 0, 2, 4]


@pytest.mark.parametrize("make", [coro_call, delayed_call], ids=["coroutine", "delayed"])
def test_a_call_is_a_delayed_collection(make):
    x = make("_inc", 1)
    assert isinstance(x, Delayed)
    assert dask.is_dask_collection(x)
    keys = x.__dask_keys__()
    assert keys == [x.key]
    graph = x.__dask_graph__()
    assert x.key in graph
    assert dict(x.dask) == dict(graph)
    assert dask.base.tokenize(x) == dask.base.tokenize(x)
    assert x.compute(scheduler="sync") == 2
    assert x.persist(scheduler="sync").compute(scheduler="sync") == 2
    a, b = make("_pair", 1)  # nout=2: unpacks as a Delayed does
    assert dask.compute(a, b, scheduler="sync") == (1, 11)


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
@pytest.mark.parametrize("name", ["compute", "getitem", "attribute", "operators", "call in a call"])
def test_pickled_programs_compute_as_with_dask_delayed(dumps, name):
    build = PROGRAMS[name]
    want = pickle.loads(dumps(build(delayed_call))).compute(scheduler="sync")
    x = build(coro_call)
    y = pickle.loads(dumps(x))
    assert isinstance(y, Delayed)
    assert y.key == x.key
    assert y.compute(scheduler="sync") == want


async def _on_cluster(c):
    # dask.delayed(x): one lazy value for a structure holding lazy values
    # (Client.compute takes a list as many collections).
    for name, build in sorted(PROGRAMS.items()):
        want = await c.compute(dask.delayed(build(delayed_call)))
        assert await c.compute(dask.delayed(build(coro_call))) == want, name

    @coroutine
    def inside(name):
        # The same program built and yielded by a coroutine on a worker.
        return (yield PROGRAMS[name](coro_call))

    @coroutine
    def inside_bag():
        return (yield _bag(coro_call))

    for name, build in sorted(PROGRAMS.items()):
        want = await c.compute(dask.delayed(build(delayed_call)))
        assert await c.compute(inside(name)) == want, name
    assert await c.compute(inside_bag()) == await c.compute(_bag(delayed_call))


test_programs_on_a_cluster_inline, test_programs_on_a_cluster = inline_and_as_tasks(_on_cluster)
