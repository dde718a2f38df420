"""The catalogue of misuses: each wrong use of the package gives a clear error
naming the problem, never a hang or a silent wrong result. The table of
docs/misuse.md, "What a misuse gives you", lists the same cases; a test
checks that it shows each one's message.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import dask
import pytest
from distributed import get_worker
from distributed.utils_test import async_poll_for, captured_logger
from filelog import append, lines
from helpers import cluster

import dask_coro
from dask_coro import (
    BadYieldError,
    DaskCoroError,
    NotInTaskError,
    Promise,
    PromiseError,
    coroutine,
    current_key,
    gather,
    result,
    shm,
    tie,
)

MISUSE_PAGE = (pathlib.Path(__file__).parents[2] / "docs" / "misuse.md").read_text()


@dataclass
class Case:
    name: str
    run: Callable[[], object]
    error: type[BaseException]
    message: str  # a fragment of the message, as docs/misuse.md shows it


@coroutine
def one():
    return 1


def _body(value):
    @coroutine
    def body():
        return (yield value)

    return body


@coroutine
def yields_uncalled():
    return (yield one)


@coroutine
def nests_gather():
    return (yield [gather(one())])


class _Odd:
    def __await__(self):
        yield "odd"


@coroutine
async def awaits_something_odd():
    return await _Odd()


async def _plain_async():
    return 1


@coroutine
def yields_a_coroutine_object():
    c = _plain_async()
    try:
        return (yield c)
    finally:
        # Closed, as it is never awaited on purpose: else its "never awaited"
        # RuntimeWarning comes at whichever later garbage collection finds it,
        # an error under the suite's warning filter wherever that is (it was
        # one inside pytest's own ast.parse of a module imported later).
        c.close()


def _loop_future():
    loop = asyncio.new_event_loop()
    try:
        return loop.create_future()
    finally:
        loop.close()


@coroutine
def spawns_after_its_block():
    with dask_coro.group() as g:
        pass
    g.spawn(one())


@coroutine
def asks_an_empty_group():
    with dask_coro.group() as g:
        return (yield g.next())


@coroutine
def numbers(n):
    for i in range(n):
        yield dask_coro.emit(i)


@coroutine
def iterates_a_closed_stream():
    s = dask_coro.stream(numbers(3))
    s.close()
    return [x for x in s]


@coroutine
def spawns_a_stream_twice():
    s = dask_coro.stream(numbers(3))
    with dask_coro.group() as g:
        g.spawn(s)
        g.spawn(s)


@coroutine
def iterates_a_spawned_stream():
    s = dask_coro.stream(numbers(3))
    with dask_coro.group() as g:
        g.spawn(s)
        return list(s)


@coroutine
def spawns_a_started_stream():
    s = dask_coro.stream(numbers(3))
    next(iter(s))
    with dask_coro.group() as g:
        g.spawn(s)


@coroutine
def reads_a_stream_twice():
    s = dask_coro.stream(numbers(3))
    first = list(s)
    return first, list(s)


@coroutine
def spawns_a_set():
    with dask_coro.group() as g:
        g.spawn([one(), {1, 2}])


@coroutine
def asks_a_stream_result_early():
    s = dask_coro.stream(numbers(3))
    next(iter(s))
    return s.result


def _unpack():
    a, b = one()  # noqa: RUF059 - the unpacking is what raises


def _with_setting(key, value):
    # Checked when a coroutine task starts, whatever the setting is for.
    def run():
        with dask.config.set({key: value}):
            one().compute(scheduler="sync")

    return run


def _result_on_loop():
    async def main():
        result(one())

    asyncio.run(main())


LOCAL = [
    Case("yield a set", lambda: _body({1, 2})().compute(scheduler="sync"), BadYieldError,
         "a set has no order to give results back in"),
    Case("yield an iterator", lambda: _body(iter([1]))().compute(scheduler="sync"),
         BadYieldError, "an iterator is consumed once; yield a list of its items instead"),
    Case("yield a generator expression",
         lambda: _body(x for x in [one()])().compute(scheduler="sync"), BadYieldError,
         "a generator expression is an iterator, consumed once; yield a list of its items instead"),
    Case("yield an uncalled coroutine function", lambda: yields_uncalled().compute(scheduler="sync"),
         BadYieldError, "a coroutine function must be called: yield f(x), not f"),
    Case("nest gather() inside a yield", lambda: nests_gather().compute(scheduler="sync"),
         BadYieldError, "gather() is awaited, not nested"),
    Case("await what is neither asyncio nor dask_coro in an async coroutine",
         lambda: awaits_something_odd().compute(scheduler="sync"), BadYieldError,
         "which is neither an asyncio future nor a dask_coro awaitable"),
    Case("yield a plain coroutine object", lambda: yields_a_coroutine_object().compute(scheduler="sync"),
         BadYieldError, "did you call a generator or async function without @dask_coro.coroutine?"),
    Case("yield an asyncio future", lambda: _body(_loop_future())().compute(scheduler="sync"),
         BadYieldError, "only distributed.Future objects can be yielded"),
    Case("result() of a set", lambda: result({1, 2}), BadYieldError, "coroutine 'result' yielded {1, 2}"),
    Case("result() on a running event loop", _result_on_loop, DaskCoroError,
         "was called on a running event loop"),
    Case("@coroutine on something not callable", lambda: coroutine(3), TypeError,
         "@coroutine expects a function, got 3"),
    Case("@coroutine(inline=...) not a bool", lambda: coroutine(inline="yes")(lambda: 1), TypeError,
         "@coroutine(inline=...) expects True or False"),
    Case("unpack a call of unknown length", _unpack, TypeError,
         "Delayed objects of unspecified length are not iterable"),
    Case("current_key() outside a task", current_key, NotInTaskError,
         "current_key() was called outside of a task"),
    Case("tie() outside a task", lambda: tie("rid", print), NotInTaskError,
         "tie() ties a resource to a key of a distributed cluster"),
    Case("Promise() without a cluster", Promise, PromiseError,
         "a Promise is a node on a distributed scheduler"),
    Case("a setting that is not a time", _with_setting("coro.inline.interval", "soon"), ValueError,
         "coro.inline.interval: 'soon' is not a time interval"),
    Case("a setting that is not one of its choices", _with_setting("coro.inline.stealing", "sometimes"),
         ValueError, "coro.inline.stealing: 'sometimes' is not one of push, poll"),
    Case("a setting that is not true or false", _with_setting("coro.tree.enabled", "no"), ValueError,
         "coro.tree.enabled: 'no' is not true or false"),
    Case("a misspelled setting", _with_setting("coro.inline.intervall", "1s"), ValueError,
         "coro.inline.intervall is not a dask_coro setting; did you mean coro.inline.interval?"),
    Case("a group timeout that is not a number", lambda: dask_coro.group(timeout="soon"), TypeError,
         "group timeout= must be a number of seconds or None, not 'soon'"),
    Case("a negative group timeout", lambda: dask_coro.group(timeout=-1), ValueError,
         "group timeout= must be >= 0, not -1"),
    Case("a group limit that is not an int", lambda: dask_coro.group(limit="x"), TypeError,
         "group limit= must be a positive int or None, not 'x'"),
    Case("a group limit below 1", lambda: dask_coro.group(limit=0), ValueError,
         "group limit= must be >= 1, not 0"),
    Case("spawn a set (or anything a yield refuses)", lambda: spawns_a_set().compute(scheduler="sync"),
         BadYieldError, "spawn() of child 0 of group was given {1, 2} at position [1]"),
    Case("spawn() outside the group's block", lambda: dask_coro.group().spawn(one()), RuntimeError,
         "use a group inside its block: with dask_coro.group() as g: ..."),
    Case("spawn() after the group's block was left", lambda: spawns_after_its_block().compute(), RuntimeError,
         "spawn() on a group that was closed (its block was left)"),
    Case("next() of a group with no child left", lambda: asks_an_empty_group().compute(), RuntimeError,
         "next() on a group with no child left to deliver (test `while g:` first; a stream child's end is known only when it comes"),
    Case("stream() of what is not a coroutine call", lambda: dask_coro.stream(3), TypeError,
         "dask_coro.stream() takes a call of a @coroutine function, not int"),
    Case("a stream buffer that is not a positive int", lambda: dask_coro.stream(numbers(3), buffer=0), ValueError,
         "stream buffer= must be a positive int or None, not 0"),
    Case("emit() outside a body", lambda: dask_coro.emit(1), RuntimeError,
         "dask_coro.emit() is called in a coroutine body"),
    Case("iterate a stream after closing it", lambda: iterates_a_closed_stream().compute(), RuntimeError,
         "iterating a stream that was closed"),
    Case("iterate a stream again after its end", lambda: reads_a_stream_twice().compute(), RuntimeError,
         "iterating a stream that was already read to its end: a stream is read once"),
    Case("a stream's result before its last item", lambda: asks_a_stream_result_early().compute(), RuntimeError,
         "a stream's result is known once every item was taken (iterate it to its end)"),
    Case("spawn a stream in two groups, or twice", lambda: spawns_a_stream_twice().compute(), RuntimeError,
         "a stream is spawned in one group, once"),
    Case("iterate a stream spawned in a group", lambda: iterates_a_spawned_stream().compute(), RuntimeError,
         "a stream spawned in a group is read through it: for child, item in g"),
    Case("spawn a stream already iterated", lambda: spawns_a_started_stream().compute(), RuntimeError,
         "spawn a stream in a group before iterating or closing it"),
    Case("shm array of Python objects", lambda: shm.empty(10, dtype=object), TypeError,
         "holds Python objects, which cannot live in shared memory"),
    Case("shm array of a negative shape", lambda: shm.empty(-1), ValueError,
         "shape must be non-negative integers"),
]


@pytest.mark.inline
@pytest.mark.parametrize("case", LOCAL, ids=[c.name for c in LOCAL])
def test_local_misuse(case):
    with pytest.raises(case.error) as info:
        case.run()
    assert case.message in str(info.value)


# -- on a cluster ----------------------------------------------------------------


@coroutine
def resolves_with_itself():
    p = Promise()
    p.resolve_with(p)


@coroutine
def forgets_its_promise():
    return [Promise()]


def _tie_to_forgotten(key):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tie("dask-coro-test-rid", lambda rid: None, key=key)
    return [str(w.message) for w in seen]


def _sync_compute_in_async_task():
    async def inner():
        return one().compute(scheduler="sync")

    return inner


async def _async_sync_compute():
    return one().compute(scheduler="sync")


CLUSTER_MESSAGES = {
    "resolve a promise with itself": "cannot be resolved with itself",
    "a promise its creator never resolved": "never resolved: the task",
    "resolve a promise that has its value": "already has a final value; it cannot be resolved again",
    "tie to a key already forgotten": "which the scheduler has already forgotten; it is released now",
    "a coroutine computed synchronously inside an async task": "was called on a worker's event loop",
    "a bad setting on a worker": "coro.inline.interval: 'soon' is not a time interval",
    "a scheduler plugin that cannot be installed": "cannot install its scheduler plugin 'dask-coro-tree'",
    "yield or await in a finally block of a cancelled body":
        "in its cleanup after it was cancelled; a cancelled body cannot wait: its finally blocks must not "
        "yield or await",
}


async def _refuse(self, scheduler):
    raise RuntimeError("no tree here")


@pytest.mark.inline
@cluster(nthreads=[("", 1)])
async def test_cluster_misuses(c, s, a, monkeypatch):
    msgs = CLUSTER_MESSAGES
    from dask_coro.diagnostics.scheduler import TreePlugin

    with monkeypatch.context() as m:
        m.setattr(TreePlugin, "start", _refuse)
        with pytest.raises(DaskCoroError, match=msgs["a scheduler plugin that cannot be installed"]):
            await c.compute(one())
    with dask.config.set({"coro.inline.interval": "soon"}):  # the worker's, in this process
        with pytest.raises(ValueError, match=msgs["a bad setting on a worker"]):
            await c.compute(one())
    with pytest.raises(PromiseError, match=msgs["resolve a promise with itself"]):
        await c.compute(resolves_with_itself())
    # The promise comes back in its creator's result, which holds it (as a
    # Future in a result is held): kept while the promise is computed.
    creator = c.compute(forgets_its_promise())
    (p,) = await creator
    with pytest.raises(PromiseError, match=msgs["a promise its creator never resolved"]):
        await c.compute(p)
    del creator
    own = await asyncio.to_thread(Promise)
    await asyncio.to_thread(own.resolve_with, 1)
    assert await c.compute(own) == 1
    with pytest.raises(PromiseError, match=msgs["resolve a promise that has its value"]):
        await asyncio.to_thread(own.resolve_with, 2)
    warned = await c.submit(_tie_to_forgotten, "no-such-key")
    assert any(msgs["tie to a key already forgotten"] in w for w in warned), warned
    with pytest.raises(DaskCoroError, match=msgs["a coroutine computed synchronously inside an async task"]):
        await c.submit(_async_sync_compute)
    assert get_worker  # the worker functions above run on the cluster


@coroutine
def ticks(folder: str):
    append(folder, "ticks", "tick")
    return 0


@coroutine
def waits_in_cleanup(folder: str):
    try:
        while True:
            yield ticks(folder)
    finally:
        yield ticks(folder)  # a cancelled body cannot wait


@coroutine
async def awaits_in_cleanup(folder: str):
    try:
        while True:
            await ticks(folder)
    finally:
        await ticks(folder)


@coroutine
def parent_of(child: Callable[[str], object], folder: str):
    return (yield child(folder))


@pytest.mark.parametrize(
    "name, waited, inline_child",
    [("waits_in_cleanup", "yielded", False), ("awaits_in_cleanup", "awaited", False),
     pytest.param("waits_in_cleanup", "yielded", True, marks=pytest.mark.inline)],
)
@cluster(nthreads=[("", 1)])
async def test_a_cancelled_body_that_waits_in_cleanup(c, s, a, tmp_path, name, waited, inline_child):
    """Its cleanup cannot wait: one warning names the body, its run's key and
    the mistake (Python's own error, "generator ignored GeneratorExit", names
    neither), whether it is the root or a call run inline."""
    body = {"waits_in_cleanup": waits_in_cleanup, "awaits_in_cleanup": awaits_in_cleanup}[name]
    folder = str(tmp_path)
    call = parent_of(body, folder) if inline_child else body(folder)
    with captured_logger("dask_coro", level=logging.WARNING) as log:
        fut = c.compute(call)
        await async_poll_for(lambda: len(lines(folder, "ticks")) >= 2, timeout=20)
        key = fut.key
        await c.cancel(fut)
        await async_poll_for(lambda: CLUSTER_MESSAGES[_CLEANUP] in log.getvalue(), timeout=20)
        await async_poll_for(lambda: not a.state.tasks, timeout=20)
    found = [line for line in log.getvalue().splitlines() if "cleanup" in line]
    assert len(found) == 1, found
    assert f"coroutine {name!r} {waited} in its cleanup" in found[0]
    assert repr(key) in found[0]


_CLEANUP = "yield or await in a finally block of a cancelled body"


def test_docs_list_every_misuse_with_its_message():
    for case in LOCAL:
        assert case.message in MISUSE_PAGE, case.name
    for name, message in CLUSTER_MESSAGES.items():
        assert message in MISUSE_PAGE, name
    assert len(LOCAL) + len(CLUSTER_MESSAGES) >= 20
