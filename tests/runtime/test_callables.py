"""Any callable ``dask.delayed`` takes can be a coroutine function: numpy
functions, ``operator.itemgetter``, ``functools.partial``, callable objects
(a dataclass instance, which is not even hashable), bound methods, builtins,
classes. Each gives what ``dask.delayed`` of it gives, locally and on a
cluster, as a root, as a child run inline and as a child task.

And a call's body is driven only if its *function* makes one (a generator
or ``async def`` function, through partials, methods, ``functools.wraps``
and ``__call__``): a plain function that returns a generator object returns
it as its value, as ``dask.delayed(f)`` does.
"""

from __future__ import annotations

import functools
import inspect
import operator
import pickle
import types
from dataclasses import dataclass

import cloudpickle
import dask
import numpy as np
import pytest
from distributed import worker_client
from helpers import inline_and_as_tasks

from dask_coro import coroutine, result
from dask_coro.examples import afib, fib, inc
from dask_coro.runtime.call import (
    ASYNC,
    GENERATOR,
    PLAIN,
    WRAPPERS,
    CoroutineFunction,
    CoroutineTask,
    _task_by_name,
    body_kind,
)

# -- the callables -----------------------------------------------------------------


@dataclass
class Scale:
    """A callable dataclass instance: eq=True makes it unhashable."""

    factor: int

    def __call__(self, x):
        return x * self.factor


@dataclass
class Account:
    """An unhashable instance whose methods are coroutine functions."""

    start: int

    def add(self, x):
        return self.start + x

    def steps(self, n):
        total = self.start
        for i in range(n):
            total += yield inc(i)
        return total

    async def add_later(self, x):
        return self.start + await inc(x)


class Pipeline:
    """A callable object whose ``__call__`` is a generator."""

    def __call__(self, n):
        a, b = yield [inc(n), inc(n + 1)]
        return a * b


def gen_add(x, y):
    a = yield inc(x)
    return a + y


async def async_add(x, y):
    return await inc(x) + y


def logged(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


def triple(x):
    return x * 3


#: name -> (callable, args): plain callables, whose value dask.delayed gives too.
PLAIN_CALLABLES = {
    "np.add": (np.add, (2, 3)),  # a ufunc: not weakly referable
    "np.sum": (np.sum, ([1, 2, 3],)),  # a list argument: always a task
    "itemgetter": (operator.itemgetter(1), ("xyz",)),
    "partial(max)": (functools.partial(max, 3), (5,)),
    "dataclass instance": (Scale(2), (21,)),
    "bound method of an unhashable instance": (Account(5).add, (3,)),
    "builtin len": (len, ("abcd",)),
    "builtin divmod": (divmod, (17, 5)),
    "bound builtin method": ("abc".upper, ()),
    "class": (complex, (1, 2)),
    "lambda": (lambda x: x - 1, (10,)),
    "functools.wraps of a plain function": (logged(triple), (4,)),
}

#: name -> (callable, args, expected): callables whose calls are bodies.
BODIES = {
    "partial of a generator function": (functools.partial(gen_add, y=10), (1,), 12),
    "generator method of an unhashable instance": (Account(5).steps, (3,), 11),
    "async method of an unhashable instance": (Account(5).add_later, (1,), 7),
    "object with a generator __call__": (Pipeline(), (3,), 20),
    "functools.wraps of a generator function": (logged(gen_add), (1, 2), 4),
    "partial of an async function": (functools.partial(async_add, y=1), (1,), 3),
}

#: Module-level wrappers, so tasks refer to them by name.
PLAIN_CORO = {name: coroutine(f) for name, (f, _) in PLAIN_CALLABLES.items()}
BODY_CORO = {name: coroutine(f) for name, (f, _, _) in BODIES.items()}


@coroutine
def evens(n):
    """A plain function returning a generator object: that is its value."""
    return (i for i in range(0, n, 2))


@coroutine
def evens_after_a_wait(n):
    """The same after a wait in result(): still a value, not a body."""
    m = result(inc(n))
    return (i for i in range(0, m, 2))


@coroutine
def consume(name, n):
    """Yields ``name``'s call; reports what came back and its items."""
    fn = {"evens": evens, "evens_after_a_wait": evens_after_a_wait}[name]
    g = yield fn(n)
    return type(g).__name__, list(g)


@coroutine
def consume_in_a_task(name, n):
    """The generator consumed by a plain task next to it."""
    fn = {"evens": evens, "evens_after_a_wait": evens_after_a_wait}[name]
    return (yield dask.delayed(list)(fn(n)))


@coroutine
def parent(kind, name):
    """Yields the coroutine call of ``name``, alone and inside a Delayed."""
    if kind == "plain":
        fn, args = PLAIN_CORO[name], PLAIN_CALLABLES[name][1]
    else:
        fn, args = BODY_CORO[name], BODIES[name][1]
    alone = yield fn(*args)
    inside = yield dask.delayed(lambda v: v)(fn(*args))
    both = yield [fn(*args), fn(*args)]
    return alone, inside, both


def with_worker_client(name):
    """The same program as ``parent("plain", name)`` as a worker_client task."""
    f, args = PLAIN_CALLABLES[name]
    with worker_client() as wc:
        alone = wc.compute(dask.delayed(f)(*args)).result()
        inside = wc.compute(dask.delayed(lambda v: v)(dask.delayed(f)(*args))).result()
        both = wc.gather(wc.compute([dask.delayed(f)(*args), dask.delayed(f)(*args)]))
    return alone, inside, both


def same(a, b):
    """Equal values of the same type (np.int64 stays np.int64)."""
    return type(a) is type(b) and (a == b if not isinstance(a, tuple) else all(map(same, a, b)))


# -- decoration ----------------------------------------------------------------------


@pytest.mark.parametrize("name", [*PLAIN_CALLABLES, *BODIES])
def test_every_callable_can_be_decorated(name):
    f = PLAIN_CALLABLES[name][0] if name in PLAIN_CALLABLES else BODIES[name][0]
    fn = coroutine(f)
    assert isinstance(fn, CoroutineFunction)
    assert fn.__wrapped__ is f
    assert WRAPPERS[fn.run] is fn  # the registry the in-place runner reads
    assert fn.kind == (PLAIN if name in PLAIN_CALLABLES else ASYNC if "async" in name else GENERATOR)
    call = fn(*(PLAIN_CALLABLES[name][1] if name in PLAIN_CALLABLES else BODIES[name][1]))
    assert call.key  # a key can be built (it tokenizes the callable)


def test_keys_are_named_after_the_callable():
    # A callable object without a name is named after its type, as
    # dask.delayed names its leaf (Delayed objects of the object itself).
    assert coroutine(operator.itemgetter(1))("ab").key.startswith("itemgetter-")
    assert coroutine(Scale(2))(1).key.startswith("Scale-")
    assert coroutine(functools.partial(max, 3))(1).key.startswith("max-")
    assert coroutine(np.sum)([1]).key.startswith("sum-")
    assert coroutine(Account(1).add)(1).key.startswith("add-")


def test_the_kind_agrees_with_inspect_where_inspect_can_tell():
    for f in [gen_add, async_add, triple, functools.partial(gen_add, y=1), Account(1).steps,
              Account(1).add_later, Account(1).add, functools.partial(functools.partial(async_add, 1), 2)]:
        expected = (
            GENERATOR if inspect.isgeneratorfunction(f)
            else ASYNC if inspect.iscoroutinefunction(f)
            else PLAIN
        )
        assert body_kind(f) == expected, f
    # And further than inspect: through functools.wraps and __call__.
    assert not inspect.isgeneratorfunction(logged(gen_add))
    assert body_kind(logged(gen_add)) == GENERATOR
    assert body_kind(Pipeline()) == GENERATOR
    assert body_kind(evens.__wrapped__) == PLAIN
    assert body_kind(len) == body_kind(np.sum) == body_kind(dict) == PLAIN


def test_a_plain_function_is_kept_and_called_as_it_is_when_it_makes_bodies():
    # The common case costs nothing: a generator function is its own runner,
    # and the registry and pickling by name work on it as before.
    fn = coroutine(gen_add)
    assert fn.run is gen_add
    assert WRAPPERS[gen_add] is fn


@pytest.mark.parametrize("fn", [inc, fib, afib])
def test_a_decorated_function_is_pickled_by_name(fn):
    # A plain function (inc) runs through a shim, a body function as it is.
    assert (fn.run is fn.__wrapped__) == (fn is not inc)
    task = CoroutineTask(fn.run, "k")
    assert task.__reduce__()[0] is _task_by_name
    again = pickle.loads(pickle.dumps(task))
    assert again.func is fn.run and again.key == "k"


def test_a_wrapper_not_importable_by_name_is_pickled_by_value():
    fn = coroutine(Scale(3))  # no name to find it by
    again = pickle.loads(cloudpickle.dumps(CoroutineTask(fn.run, "k")))
    assert again.func(2) == 6
    assert again.__dask_tokenize__() == CoroutineTask(fn.run, "k").__dask_tokenize__()


# -- locally -------------------------------------------------------------------------


@pytest.mark.parametrize("name", PLAIN_CALLABLES)
@pytest.mark.parametrize("inline", [True, False])
def test_plain_callables_locally(name, inline):
    f, args = PLAIN_CALLABLES[name]
    expected = dask.delayed(f)(*args).compute(scheduler="sync")
    with dask.config.set({"coro.inline.enabled": inline}):
        assert same(coroutine(f)(*args).compute(scheduler="sync"), expected)
        assert same(coroutine(f)(*args).compute(scheduler="threads"), expected)
        alone, inside, both = parent("plain", name).compute(scheduler="sync")
    assert same(alone, expected) and same(inside, expected)
    assert both == [expected, expected] and all(same(x, expected) for x in both)


@pytest.mark.parametrize("name", BODIES)
@pytest.mark.parametrize("inline", [True, False])
def test_bodies_locally(name, inline):
    f, args, expected = BODIES[name]
    with dask.config.set({"coro.inline.enabled": inline}):
        assert coroutine(f)(*args).compute(scheduler="sync") == expected
        assert parent("body", name).compute(scheduler="sync") == (expected, expected, [expected] * 2)


def test_a_plain_function_returning_a_generator_returns_it_locally():
    direct = evens(6).compute(scheduler="sync")
    plain = dask.delayed(evens.__wrapped__)(6).compute(scheduler="sync")
    assert isinstance(direct, types.GeneratorType) and isinstance(plain, types.GeneratorType)
    assert list(direct) == list(plain) == [0, 2, 4]
    for inline in (True, False):
        with dask.config.set({"coro.inline.enabled": inline}):
            assert consume("evens", 6).compute(scheduler="sync") == ("generator", [0, 2, 4])
            assert consume("evens_after_a_wait", 5).compute(scheduler="sync") == ("generator", [0, 2, 4])
            assert consume_in_a_task("evens", 6).compute(scheduler="sync") == [0, 2, 4]


def test_a_plain_function_returning_a_coroutine_object_returns_it():
    async def later():
        return 1

    @coroutine
    def make():
        return later()

    out = make().compute(scheduler="sync")
    assert isinstance(out, types.CoroutineType)
    out.close()


# -- on a cluster --------------------------------------------------------------------


async def _check_plain(c):
    for name, (f, args) in PLAIN_CALLABLES.items():
        expected = await c.compute(dask.delayed(f)(*args))
        assert same(await c.compute(coroutine(f)(*args)), expected), name
        assert same(await c.compute(PLAIN_CORO[name](*args)), expected), name
        ours = await c.compute(parent("plain", name))
        theirs = await c.submit(with_worker_client, name, pure=False)
        assert ours[0] == theirs[0] and ours[1] == theirs[1] and list(ours[2]) == list(theirs[2]), name
        assert same(ours[0], expected) and same(ours[1], expected), name


async def _check_bodies(c):
    for name, (f, args, expected) in BODIES.items():
        assert await c.compute(coroutine(f)(*args)) == expected, name
        assert await c.compute(BODY_CORO[name](*args)) == expected, name
        assert await c.compute(parent("body", name)) == (expected, expected, [expected] * 2), name


async def _check_generator_values(c):
    assert await c.compute(consume("evens", 6)) == ("generator", [0, 2, 4])
    assert await c.compute(consume("evens_after_a_wait", 5)) == ("generator", [0, 2, 4])
    # Next to a plain task on one worker, as dask.delayed's generator is.
    plain = dask.delayed(list)(dask.delayed(evens.__wrapped__)(6))
    assert await c.compute(plain) == [0, 2, 4]
    assert await c.compute(consume_in_a_task("evens", 6)) == [0, 2, 4]


test_plain_callables_inline_on_a_cluster, test_plain_callables_as_tasks_on_a_cluster = inline_and_as_tasks(
    _check_plain, workers=1
)
test_bodies_inline_on_a_cluster, test_bodies_as_tasks_on_a_cluster = inline_and_as_tasks(_check_bodies)
test_a_generator_value_inline_on_a_cluster, test_a_generator_value_as_a_task_on_a_cluster = inline_and_as_tasks(
    _check_generator_values, workers=1
)
