"""A coroutine function that travels by value (defined in a test function,
as in a notebook's ``__main__``) is loaded once per process, and is sent anew
from where it was defined each time, with its closure as it is then."""

from __future__ import annotations

import sys

from distributed import Client, LocalCluster
from distributed.protocol.pickle import dumps, loads

from dask_coro import coroutine
from dask_coro.runtime import byvalue
from dask_coro.runtime.call import CoroutineTask


def _local_function(offset):
    def f(x):
        return x + offset

    return f


def test_tasks_of_one_function_share_it_once_loaded():
    f = _local_function(1)
    first = loads(dumps(CoroutineTask(f, "f-1")))
    second = loads(dumps(CoroutineTask(f, "f-2")))
    assert (first.key, second.key) == ("f-1", "f-2")
    assert first.func is second.func is not f
    assert first.func(1) == 2
    # Sent on from where it was loaded (the scheduler, a worker's children):
    # the bytes it came as, loaded as the same function again.
    again = loads(dumps(CoroutineTask(first.func, "f-3")))
    assert again.func is first.func


def test_a_graph_pickles_its_function_once():
    f = _local_function(1)
    one = len(dumps([CoroutineTask(f, "f-1")]))
    many = len(dumps([CoroutineTask(f, f"f-{i}") for i in range(50)]))
    assert many < one + 50 * 40, (one, many)  # keys and references, not 50 copies


def test_a_function_is_pickled_as_it_is_now_where_it_was_defined():
    offset = 1

    def f(x):
        return x + offset

    before = loads(dumps(CoroutineTask(f, "f-1")))
    offset = 10
    after = loads(dumps(CoroutineTask(f, "f-2")))
    assert (before.func(1), after.func(1)) == (2, 11)


def test_the_cache_of_loaded_functions_is_bounded(monkeypatch):
    monkeypatch.setattr(byvalue, "_MAX_LOADED", 8)
    funcs = [loads(dumps(CoroutineTask(_local_function(i), f"f-{i}"))).func for i in range(20)]
    assert [f(0) for f in funcs] == list(range(20))
    assert len(byvalue._LOADED) <= 8


def test_on_worker_processes_one_function_object_per_process():
    offset = 1

    @coroutine
    def tree(depth):
        if depth == 0:
            # The code object is the function's: one per loaded copy.
            return {id(sys._getframe().f_code)}
        left, right = yield [tree(depth - 1), tree(depth - 1)]
        return left | right | {id(sys._getframe().f_code)}

    @coroutine
    def plus(x):
        return x + offset

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        # 31 tasks (unmarked tests run every coroutine call as a task), 15
        # of them waiting at once: each had a copy of its own before.
        codes = client.compute(tree(4)).result(timeout=60)
        assert 1 <= len(codes) <= 2, codes  # one per worker that ran some
        assert client.compute(plus(1)).result(timeout=30) == 2
        offset = 5
        assert client.compute(plus(1)).result(timeout=30) == 6
        # and a function unchanged since is still the one cached
        codes |= client.compute(tree(2)).result(timeout=60)
        assert len(codes) <= 2, codes
