"""is_lazy and classifier: what a coroutine may yield, and the error if not."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pytest

import dask_coro
from dask_coro import BadYieldError, DaskCoroError, coroutine
from dask_coro.core.classify import ACCEPTED, Rejected, classifier, is_lazy
from dask_coro.core.structure import Structure


@coroutine
def child(x):
    return x


def _gen():
    yield 1  # pragma: no cover


async def _acoro():
    return 1  # pragma: no cover


async def _agen():
    yield 1  # pragma: no cover


# --- is_lazy ------------------------------------------------------------------


def test_is_lazy_delayed():
    assert is_lazy(dask.delayed(1)) is True
    assert is_lazy(dask.delayed(sum)([1, 2])) is True


def test_is_lazy_coroutine_call():
    call = child(1)
    assert isinstance(call, dask_coro.CoroutineCall)
    assert is_lazy(call) is True
    # Derived lazy values too.
    assert is_lazy(call + 1) is True
    assert is_lazy(call[0]) is True


def test_is_lazy_dask_array_and_bag():
    assert is_lazy(da.ones(4, chunks=2)) is True
    assert is_lazy(da.ones(4, chunks=2).sum()) is True
    assert is_lazy(db.from_sequence([1, 2], npartitions=1)) is True


def test_is_lazy_dask_dataframe():
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    ddf = dd.from_pandas(pd.DataFrame({"a": [1, 2, 3]}), npartitions=2)
    assert is_lazy(ddf) is True
    assert is_lazy(ddf.a.sum()) is True


@pytest.mark.parametrize(
    "obj",
    [0, 1, -5, 2.5, "s", b"b", None, True, range(3), {}.keys(), object()],
    ids=lambda o: type(o).__name__,
)
def test_is_lazy_false_for_plain_values(obj):
    assert is_lazy(obj) is False


def test_is_lazy_false_for_numpy():
    assert is_lazy(np.arange(3)) is False
    assert is_lazy(np.float64(1.0)) is False


def test_is_lazy_raises_internal_rejected_for_set():
    with pytest.raises(Rejected):
        is_lazy({1})


def test_is_lazy_can_be_extended():
    class MyLazy:
        pass

    class MyBad:
        pass

    is_lazy.register(MyLazy, lambda obj: True)

    def reject(obj):
        raise Rejected("custom hint")

    is_lazy.register(MyBad, reject)
    # (singledispatch has no unregister; these test-local classes stay
    # registered but are unreachable from anywhere else.)
    assert is_lazy(MyLazy()) is True
    with pytest.raises(BadYieldError, match=r"\(custom hint\)$"):
        classifier("c", 0)(MyBad(), ())


# --- classifier ---------------------------------------------------------------


def test_classifier_passes_through_true_and_false():
    classify = classifier("co", 0)
    assert classify(dask.delayed(1), ()) is True
    assert classify(5, (0,)) is False


def _check(obj, hint):
    classify = classifier("mycoro", 3)
    with pytest.raises(BadYieldError) as info:
        classify(obj, (1, "a"))
    err = info.value
    assert isinstance(err, TypeError)
    assert isinstance(err, DaskCoroError)
    msg = str(err)
    assert msg.startswith("coroutine 'mycoro' yielded ")
    assert " at position [1]['a'] of yield #3; " in msg
    assert ACCEPTED in msg
    assert msg.endswith(f"({hint})")
    # "from None": the internal rejection is not chained.
    assert err.__cause__ is None
    assert err.__suppress_context__ is True
    return msg


def test_bad_set():
    msg = _check({1, 2}, "a set has no order to give results back in; yield a list instead")
    assert "yielded {1, 2} at" in msg


def test_bad_frozenset():
    msg = _check(
        frozenset([3]), "a set has no order to give results back in; yield a list instead"
    )
    assert "yielded frozenset({3}) at" in msg


def test_bad_generator_object():
    g = _gen()
    _check(g, "did you call a generator or async function without @dask_coro.coroutine?")
    g.close()


def test_bad_generator_expression():
    # a generator object, but the mistake is the one of an iterator
    genexpr = (x for x in [1])
    msg = _check(genexpr, "a generator expression is an iterator, consumed once; yield a list "
                 "of its items instead: [f(x) for x in xs], not (f(x) for x in xs)")
    assert "without @dask_coro.coroutine" not in msg
    assert "<genexpr> at 0x" in msg


def test_bad_coroutine_object():
    c = _acoro()
    try:
        _check(
            c, "did you call a generator or async function without @dask_coro.coroutine?"
        )
    finally:
        c.close()


def test_bad_async_generator_object():
    ag = _agen()
    _check(ag, "did you call a generator or async function without @dask_coro.coroutine?")


def test_bad_asyncio_future():
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()
        msg = _check(fut, "only distributed.Future objects can be yielded")
        assert "yielded <Future pending> at" in msg
    finally:
        loop.close()


def test_bad_concurrent_future():
    fut = concurrent.futures.Future()
    _check(fut, "only distributed.Future objects can be yielded")


def test_bad_iterator():
    msg = _check(
        iter([1]), "an iterator is consumed once; yield a list of its items instead"
    )
    assert "list_iterator" in msg
    _check(map(str, [1]), "an iterator is consumed once; yield a list of its items instead")


def test_bad_foreign_awaitable():
    class Awaitable:
        def __await__(self):
            yield  # pragma: no cover

        def __repr__(self):
            return "Awaitable()"

    msg = _check(
        Awaitable(), "an awaitable of another event loop cannot be waited for here"
    )
    assert "yielded Awaitable() at" in msg


def test_bad_uncalled_coroutine_function():
    msg = _check(child, "a coroutine function must be called: yield f(x), not f")
    assert "yielded <dask_coro.coroutine child> at" in msg


def test_bad_nested_gather():
    msg = _check(
        dask_coro.gather([1]),
        "gather() is awaited, not nested: yield its argument instead",
    )
    assert "yielded gather([1]) at" in msg


def test_message_top_level_position():
    with pytest.raises(
        BadYieldError,
        match=re.escape("coroutine 'top' yielded {1} at position (top level) of yield #0;"),
    ):
        classifier("top", 0)({1}, ())


def test_long_repr_is_shortened():
    class Long:
        def __repr__(self):
            return "x" * 500

    s = {Long()}
    with pytest.raises(BadYieldError) as info:
        classifier("c", 1)(s, ())
    shown = str(info.value).split(" yielded ", 1)[1].split(" at position ", 1)[0]
    assert len(shown) == 200
    assert shown.endswith("...")


def test_classifier_through_structure_names_position():
    obj = [dask.delayed(1), {"a": 2, "b": (3, {4})}]
    with pytest.raises(
        BadYieldError,
        match=re.escape("coroutine 'walk' yielded {4} at position [1]['b'][1] of yield #7;"),
    ):
        Structure(obj, classifier("walk", 7))


def test_classifier_through_structure_collects_leaves():
    d1, d2 = dask.delayed(1), child(2)
    s = Structure([d1, {"k": d2, "p": np.arange(2)}, "s"], classifier("c", 0))
    assert s.leaves == [d1, d2]
    assert s.paths == [(0,), (1, "k")]
