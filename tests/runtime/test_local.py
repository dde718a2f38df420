"""The in-process driver: coroutine calls computed without a distributed Client.

No Client is created in this file; the autouse fixture checks that none leaked
in from elsewhere (the in-process driver only runs without one).
"""

from __future__ import annotations

import gc
import random
import sys
import traceback
import types
import weakref
from collections import namedtuple

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pytest
from bodies import cleared
from dask.delayed import Delayed
from helpers import places
from workloads import total_and_data

import dask_coro
from dask_coro import BadYieldError, CoroutineCall, NotInTaskError, coroutine, current_key
from dask_coro.core.plan import derive_key
from dask_coro.examples import afib, fib, inc, my_len


@pytest.fixture(autouse=True)
def no_client():
    def check():
        mod = sys.modules.get("distributed.client")
        if mod is not None:
            assert mod._get_global_client() is None
        assert dask.config.get("scheduler", None) is None

    check()
    yield
    check()


class Boom(Exception):
    pass


# --- workloads ------------------------------------------------------------------


@coroutine
async def afib_await(i):
    if i < 2:
        return i
    a = await afib_await(i - 1)
    b = await afib_await(i - 2)
    return a + b


GENERATED: list[list[int]] = []


@coroutine
def generate_data():
    L = list(range(random.randint(0, 10)))
    GENERATED.append(L)
    return L


@coroutine
def process_all():
    L = generate_data()
    n = yield my_len(L)
    processed = [inc(L[i]) for i in range(n)]
    total = yield sum(processed)
    return total


@coroutine
def process_all_then_data():
    return (yield from total_and_data(generate_data()))


@coroutine
def ident(x):
    return x


@coroutine
def fail(msg):
    raise Boom(msg)


@coroutine
def key_of_self():
    return current_key()


# --- fib ------------------------------------------------------------------------


def test_fib_compute():
    assert fib(10).compute() == 55


def test_fib_dask_compute():
    assert dask.compute(fib(10)) == (55,)
    assert dask.compute(fib(10), fib(6), 3) == (55, 8, 3)


def test_fib_sync_scheduler():
    assert fib(10).compute(scheduler="sync") == 55


def test_fib_threads_scheduler():
    assert fib(8).compute(scheduler="threads") == 21


def test_fib_base_cases():
    assert fib(0).compute() == 0
    assert fib(1).compute() == 1


def test_afib_gather():
    assert afib(10).compute() == 55
    assert afib(10).compute(scheduler="sync") == 55


def test_afib_await_call():
    assert afib_await(10).compute() == 55


def test_call_is_lazy():
    ran = []

    @coroutine
    def f(x):
        ran.append(x)
        return x

    call = f(1)
    assert isinstance(call, CoroutineCall)
    assert isinstance(call, Delayed)
    assert ran == []
    assert call.compute() == 1
    assert ran == [1]


# --- process_all: compute once ----------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 14, 19])
def test_process_all_generates_once(seed):
    random.seed(seed)
    GENERATED.clear()
    total = process_all().compute()
    assert len(GENERATED) == 1
    (L,) = GENERATED
    assert total == sum(x + 1 for x in L)


def test_process_all_empty_and_nonempty_lists():
    # With these seeds generate_data makes an empty list at least once and a
    # non-empty one at least once (the seeds give 6, 2, 0, 1, 10 with CPython's
    # Mersenne Twister); both paths must give the right total.
    lengths = []
    for seed in [0, 1, 2, 14, 19]:
        random.seed(seed)
        GENERATED.clear()
        total = process_all().compute()
        assert len(GENERATED) == 1
        lengths.append(len(GENERATED[0]))
        assert total == sum(x + 1 for x in GENERATED[0])
    assert 0 in lengths
    assert max(lengths) > 0


def test_process_all_many_runs():
    random.seed(1234)
    for _ in range(5):
        GENERATED.clear()
        total = dask.compute(process_all())[0]
        assert len(GENERATED) == 1
        assert total == sum(x + 1 for x in GENERATED[0])


def test_process_all_later_yield_of_data_reuses_result():
    random.seed(7)
    GENERATED.clear()
    total, data = process_all_then_data().compute()
    assert len(GENERATED) == 1
    assert data == GENERATED[0]
    assert total == sum(x + 1 for x in data)


RAN: list[int] = []
_clear = cleared(RAN)


@coroutine
def once(x):
    """``x * 10``, each run recorded in ``RAN``: a call meant to run once."""
    RAN.append(x)
    return x * 10


def test_same_call_yielded_in_two_yields_runs_once():
    @coroutine
    def parent():
        x = once(4)
        a = yield x
        b = yield x
        c = yield [x, x + 1]
        return a, b, c

    assert parent().compute() == (40, 40, [40, 41])
    assert RAN == [4]


def test_shared_dependency_within_one_yield_runs_once():
    ran = []

    @coroutine
    def source():
        ran.append(1)
        return [1, 2, 3]

    @coroutine
    def parent():
        L = source()
        return (yield [my_len(L), L[0], L[2]])

    assert parent().compute() == [3, 1, 3]
    assert ran == [1]


def test_results_released_when_lazy_value_dropped():
    class Big:
        pass

    refs = []

    @coroutine
    def make():
        b = Big()
        refs.append(weakref.ref(b))
        return b

    @coroutine
    def name_of(b):
        return type(b).__name__

    @coroutine
    def parent():
        L = make()
        n1 = yield name_of(L)
        gc.collect()
        alive_while_held = refs[0]() is not None
        n2 = yield name_of(L)  # reuses L's result
        del L
        yield 0
        yield 0
        gc.collect()
        return n1, n2, alive_while_held, refs[0]() is None, len(refs)

    assert parent().compute() == ("Big", "Big", True, True, 1)


# --- what may be yielded --------------------------------------------------------


def test_yield_plain_values():
    @coroutine
    def parent():
        a = yield 5
        b = yield "s"
        c = yield None
        d = yield [1, (2, 3), {"k": None}]
        e = yield np.arange(3)
        return a, b, c, d, e

    a, b, c, d, e = parent().compute()
    assert (a, b, c, d) == (5, "s", None, [1, (2, 3), {"k": None}])
    assert e.tolist() == [0, 1, 2]


def test_yield_dict_keys_with_equal_reprs():
    # Regression: the renamed key of a leaf is derived from repr(path); two dict keys
    # that print alike give two leaves the same key, and both get one result.
    class Tag:
        def __init__(self, v):
            self.v = v

        def __repr__(self):
            return "Tag"

    t1, t2 = Tag(1), Tag(2)

    @coroutine
    def parent():
        return (yield {t1: ident("one"), t2: ident("two")})

    out = parent().compute()
    assert out[t1] == "one"
    assert out[t2] == "two"


def test_yield_dict_with_two_nan_keys():
    # Regression: same as above with float("nan") keys (distinct keys, both "nan").
    n1, n2 = float("nan"), float("nan")

    @coroutine
    def parent():
        return (yield {n1: ident(1), n2: ident(2)})

    out = parent().compute()
    assert [out[n1], out[n2]] == [1, 2]


def test_yield_empty_containers():
    @coroutine
    def parent():
        return (yield [[], (), {}])

    assert parent().compute() == [[], (), {}]


def test_yield_nested_structures():
    P = namedtuple("P", "x y")

    @coroutine
    def parent():
        out = yield {
            "a": (ident(1), [ident(2), 3]),
            "b": {"c": ident("x"), "d": "plain"},
            "p": P(ident(4), 5),
        }
        return out

    out = parent().compute()
    assert out == {"a": (1, [2, 3]), "b": {"c": "x", "d": "plain"}, "p": P(4, 5)}
    assert type(out["a"]) is tuple
    assert type(out["p"]) is P


def test_yield_dask_array():
    @coroutine
    def parent():
        s = yield da.ones(10, chunks=5).sum()
        arr = yield da.arange(4, chunks=2) * 2
        return s, arr

    s, arr = parent().compute()
    assert s == 10.0
    assert arr.tolist() == [0, 2, 4, 6]


def test_yield_dask_bag():
    @coroutine
    def parent():
        b = db.from_sequence([1, 2, 3, 4], npartitions=2)
        return (yield [b.map(lambda x: x * 2), b.sum()])

    assert parent().compute() == [[2, 4, 6, 8], 10]


def test_yield_dask_dataframe():
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")

    pdf = pd.DataFrame({"a": [1, 2, 3, 4], "b": [10, 20, 30, 40]})

    @coroutine
    def parent():
        ddf = dd.from_pandas(pdf, npartitions=2)
        total, frame = yield [ddf.a.sum(), ddf[ddf.a > 2]]
        return total, frame

    total, frame = parent().compute()
    assert total == 10
    pd.testing.assert_frame_equal(frame, pdf[pdf.a > 2])


def test_yield_dataframe_from_delayed_coroutine_result():
    # Regression: dd.from_delayed's graph holds Alias nodes under a key other than
    # their own; the plan renames by the node's key and the yield fails with
    # "ValueError: Missing dependency fromdelayed-...".
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")

    @coroutine
    def frame():
        return pd.DataFrame({"a": [1, 2, 3]})

    @coroutine
    def parent():
        ddf = dd.from_delayed([frame()], meta={"a": "i8"}, verify_meta=False)
        return (yield ddf.a.sum())

    assert parent().compute() == 6


def test_collection_on_earlier_result_computes_it_once():
    # Regression: a collection built on a result an earlier yield computed (here
    # da.from_delayed(L)) computes it again: graph optimization fuses L's task
    # into the chunk task under a new key, so ``known`` does not match. With a
    # random generate_data the array then holds other data than ``n`` counted.
    ran = []

    @coroutine
    def make():
        ran.append(1)
        return np.arange(5)

    @coroutine
    def parent():
        L = make()
        n = yield my_len(L)
        arr = da.from_delayed(L, shape=(n,), dtype=int)
        s = yield arr.sum()
        b = yield db.from_delayed([L]).sum()
        return n, s, b

    assert parent().compute() == (5, 10, 10)
    assert ran == [1]


def test_yield_dask_delayed():
    @dask.delayed
    def add(a, b):
        return a + b

    @coroutine
    def parent():
        x = add(1, 2)
        a, b = yield [x, add(x, 10)]
        c = yield dask.delayed(7)
        d = yield add(ident(1), x)  # a plain Delayed depending on a coroutine
        return a, b, c, d

    assert parent().compute() == (3, 13, 7, 4)


def test_yield_delayed_with_tuple_keys():
    @coroutine
    def parent():
        parts = da.arange(6, chunks=2).to_delayed().tolist()
        r = yield parts
        return [p.tolist() for p in r]

    assert parent().compute() == [[0, 1], [2, 3], [4, 5]]


def test_async_gather_structures():
    @coroutine
    async def parent():
        d = await dask_coro.gather({"x": ident(1), "y": [ident(2), 3]})
        s = await dask_coro.gather(da.ones(4, chunks=2).sum())
        p = await dask_coro.gather(7)
        e = await dask_coro.gather(ident(5) + 1)  # a plain Delayed
        return d, s, p, e

    assert parent().compute() == ({"x": 1, "y": [2, 3]}, 4.0, 7, 6)


# --- errors -------------------------------------------------------------------------


def test_child_error_caught_in_parent_which_continues():
    @coroutine
    def parent():
        try:
            yield [ident(1), fail("child broke")]
        except Boom as e:
            caught = (type(e), str(e))
        after = yield ident(3)
        return caught, after

    assert parent().compute() == ((Boom, "child broke"), 3)


def test_child_error_caught_in_async_parent():
    @coroutine
    async def parent():
        try:
            await fail("async child")
        except Boom as e:
            msg = str(e)
        return msg, await ident(2)

    assert parent().compute() == ("async child", 2)


def test_child_error_unhandled_fails_compute():
    @coroutine
    def parent():
        yield fail("unhandled")
        return "not reached"  # pragma: no cover

    with pytest.raises(Boom, match=r"^unhandled$"):
        parent().compute()


def test_grandchild_error_propagates_through_levels():
    @coroutine
    def middle():
        yield fail("deep")

    @coroutine
    def top():
        return (yield middle())

    with pytest.raises(Boom, match=r"^deep$"):
        top().compute()
    with pytest.raises(Boom, match=r"^deep$"):
        dask.compute(top(), scheduler="sync")


def test_child_error_traceback_names_child():
    @coroutine
    def parent():
        yield fail("tb")

    with pytest.raises(Boom) as info:
        parent().compute()
    names = [f.f_code.co_name for f, _ in traceback.walk_tb(info.value.__traceback__)]
    assert "fail" in names


def test_builtin_error_type_kept():
    @coroutine
    def divide(a, b):
        return a / b

    @coroutine
    def parent():
        try:
            yield divide(1, 0)
        except ZeroDivisionError as e:
            return f"caught {e}"

    assert parent().compute() == "caught division by zero"
    with pytest.raises(ZeroDivisionError):
        divide(1, 0).compute()


def test_child_stop_iteration_caught_in_parent():
    # A child's StopIteration reaches its parent as a task's Future raises it
    # on a cluster (RuntimeError, the original as its cause), on every path
    # (docs/coroutines.md, "One answer on every path").
    @coroutine
    def stops():
        return next(iter([]))

    @coroutine
    def parent():
        try:
            yield stops()
        except RuntimeError as e:
            return f"caught {type(e.__cause__).__name__}"

    assert parent().compute() == "caught StopIteration"


def test_child_stop_iteration_unhandled_is_the_runtime_error_a_task_gives():
    # Not caught at the yield, it fails the compute as that RuntimeError, not
    # as "generator raised StopIteration" (PEP 479) around the child's error.
    @coroutine
    def stops():
        raise StopIteration("child stop")

    @coroutine
    def parent():
        return (yield stops())

    with pytest.raises(RuntimeError, match=r"^coroutine raised StopIteration$") as info:
        parent().compute(scheduler="sync")
    assert type(info.value.__cause__) is StopIteration and str(info.value.__cause__) == "child stop"


def test_parent_finally_runs_on_unhandled_child_error():
    log = []

    @coroutine
    def parent():
        try:
            yield fail("x")
        finally:
            log.append("finally")

    with pytest.raises(Boom):
        parent().compute()
    assert log == ["finally"]


def test_error_in_parent_body():
    @coroutine
    def parent():
        a = yield ident(1)
        raise KeyError(f"parent {a}")

    with pytest.raises(KeyError, match=r"parent 1"):
        parent().compute()


def test_bad_yield_set_raises_at_yield_and_can_be_caught():
    @coroutine
    def parent():
        ok = yield ident(1)
        try:
            yield {1, 2}
        except BadYieldError as e:
            msg = str(e)
        return ok, msg

    ok, msg = parent().compute()
    assert ok == 1
    assert msg.startswith("coroutine 'parent' yielded {1, 2} at position (top level) of yield #1;")
    assert msg.endswith("(a set has no order to give results back in; yield a list instead)")


def test_bad_yield_nested_position():
    @coroutine
    def parent():
        yield [ident(1), {"a": frozenset([1])}]

    with pytest.raises(
        BadYieldError,
        match=r"^coroutine 'parent' yielded frozenset\(\{1\}\) at position \[1\]\['a'\] of yield #0;",
    ):
        parent().compute()


def test_bad_yield_is_type_error():
    @coroutine
    def parent():
        yield iter([1])

    with pytest.raises(TypeError, match=r"an iterator is consumed once"):
        parent().compute()


def test_bad_yield_uncalled_coroutine_function():
    @coroutine
    def parent():
        yield ident

    with pytest.raises(BadYieldError, match=r"yield f\(x\), not f"):
        parent().compute()


def test_bad_yield_generator_object_message():
    def plain_gen():
        yield 1  # pragma: no cover

    @coroutine
    def parent():
        g = plain_gen()
        try:
            yield g
        except BadYieldError as e:
            g.close()
            return str(e)

    assert parent().compute().endswith(
        "(did you call a generator or async function without @dask_coro.coroutine?)"
    )


def test_async_foreign_await_raises_bad_yield():
    class Foreign:
        def __await__(self):
            return (yield "foreign")

    @coroutine
    async def parent():
        try:
            await Foreign()
        except BadYieldError as e:
            caught = str(e)
        return caught, await ident(1)

    caught, one = parent().compute()
    assert caught.startswith("coroutine 'parent' awaited 'foreign', which is neither an asyncio")
    assert one == 1

    @coroutine
    async def uncaught():
        await Foreign()

    with pytest.raises(BadYieldError, match=r"^coroutine 'uncaught' awaited 'foreign'"):
        uncaught().compute()


# --- current_key ----------------------------------------------------------------------


def test_current_key_equals_call_key():
    call = key_of_self()
    assert call.compute() == call.key


def test_current_key_stable_across_yields():
    @coroutine
    def parent():
        k1 = current_key()
        yield ident(1)
        k2 = current_key()
        yield [ident(2), ident(3)]
        return k1, k2, current_key()

    call = parent()
    assert call.compute() == (call.key, call.key, call.key)


def test_current_key_async():
    @coroutine
    async def parent():
        k1 = current_key()
        await ident(1)
        return k1, current_key()

    call = parent()
    assert call.compute() == (call.key, call.key)


def test_current_key_of_child_is_its_derived_key():
    @coroutine
    def parent():
        a, b = yield [key_of_self(), {"k": key_of_self()}]
        return a, b["k"], current_key()

    call = parent()
    a, b, mine = call.compute()
    assert mine == call.key
    assert places([a, b]) == {
        derive_key("key_of_self", call.key, 0, (0,)),
        derive_key("key_of_self", call.key, 0, (1, "k")),
    }
    assert a[:-17] == derive_key("key_of_self", call.key, 0, (0,))


def test_current_key_restored_after_compute():
    call = key_of_self()
    call.compute()
    with pytest.raises(NotInTaskError, match=r"outside of a task"):
        current_key()


def test_current_key_outside_task():
    with pytest.raises(NotInTaskError, match=r"^current_key\(\) was called outside of a task"):
        current_key()
    assert issubclass(NotInTaskError, RuntimeError)


def test_dask_key_name():
    call = ident(1, dask_key_name="my-key")
    assert call.key == "my-key"
    assert key_of_self(dask_key_name="named-1").compute() == "named-1"


# --- CoroutineCall is a Delayed ---------------------------------------------------------


def test_indexing():
    assert ident([1, 2, 3])[1].compute() == 2
    assert ident({"a": 5})["a"].compute() == 5


def test_attribute_access():
    @coroutine
    def obj():
        return types.SimpleNamespace(attr=5, method=lambda: "m")

    assert obj().attr.compute() == 5
    assert obj().method().compute() == "m"


def test_arithmetic():
    assert (ident(2) + 1).compute() == 3
    assert (1 + ident(2)).compute() == 3
    assert (ident(2) * ident(5)).compute() == 10
    assert (-ident(2)).compute() == -2
    assert (ident(7) // 2).compute() == 3


def test_passed_into_delayed_and_coroutine():
    assert dask.delayed(lambda v: v * 10)(ident(2)).compute() == 20
    assert inc(ident(2)).compute() == 3
    assert inc(x=ident(2)).compute() == 3
    assert my_len([ident(1), ident(2)]).compute() == 2
    assert ident({"k": [ident(1)]}).compute() == {"k": [1]}


def test_nout_unpacking():
    @coroutine(nout=2)
    def pair(x):
        return x, x + 1

    a, b = pair(1)
    assert a.compute() == 1
    assert b.compute() == 2
    assert dask.compute(a, b) == (1, 2)
    assert len(pair(1)) == 2


def test_no_nout_not_iterable():
    with pytest.raises(TypeError, match="unspecified length"):
        a, b = ident((1, 2))  # noqa: RUF059 - the unpacking is what raises


def test_pure_keys():
    @coroutine(pure=True)
    def p(x):
        return x

    assert p(1).key == p(1).key
    assert p(1).key != p(2).key
    assert p(1).key.startswith("p-")
    assert p(1).compute() == 1


def test_default_keys_distinct():
    assert ident(1).key != ident(1).key
    assert ident(1).key.startswith("ident-")


def test_name_prefix():
    @coroutine(name="custom")
    def f():
        return current_key()

    call = f()
    assert call.key.startswith("custom-")
    assert call.compute() == call.key
    assert repr(coroutine(name="custom")(lambda: 1)) == "<dask_coro.coroutine custom>"


def test_decorating_twice_unwraps():
    def raw(x):
        return x * 3

    twice = coroutine(coroutine(raw))
    assert twice.__wrapped__ is raw
    assert twice(2).compute() == 6


def test_decorator_rejects_non_callable():
    with pytest.raises(TypeError, match=r"^@coroutine expects a function, got 5$"):
        coroutine(5)


def test_wraps_metadata():
    @coroutine
    def documented(x):
        """Docstring."""
        return x

    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Docstring."
    assert isinstance(documented, dask_coro.CoroutineFunction)


def test_decorating_a_method():
    class C:
        def __init__(self, k):
            self.k = k

        @coroutine
        def times(self, x):
            y = yield ident(x)
            return y * self.k

        @coroutine
        async def atimes(self, x):
            return (await ident(x)) * self.k

    c = C(3)
    assert c.times(2).compute() == 6
    assert c.atimes(4).compute() == 12
    assert isinstance(c.times(2), CoroutineCall)
    # Accessed on the class it is the coroutine function itself.
    assert C.times(c, 5).compute() == 15


def test_plain_function_body():
    @coroutine
    def plain(a, b=1):
        return a + b

    assert plain(1, b=2).compute() == 3
    assert plain(1).compute() == 2


def test_child_runs_with_computed_arguments():
    @coroutine
    def parent():
        x = ident(5)
        return (yield inc(inc(x)))

    assert parent().compute() == 7


def test_compute_inside_running_event_loop():
    import asyncio

    async def main():
        return fib(6).compute(scheduler="sync")

    assert asyncio.run(main()) == 8


# -- inline calls in the in-process driver ---------------------------------------


@coroutine
def chain(n):
    if n == 0:
        return 0
    return 1 + (yield chain(n - 1))


@pytest.mark.inline
def test_inline_recursion_deeper_than_the_python_stack():
    # 5x the recursion limit: the trampoline keeps the stack of inline calls
    # in a list, not in Python frames.
    n = 5 * sys.getrecursionlimit()
    assert chain(n).compute() == n


@pytest.mark.inline
def test_inline_fib_25_in_process():
    assert fib(25).compute() == 75025
    assert afib(18).compute() == 2584


@pytest.mark.inline
def test_inline_false_makes_every_call_a_task():
    # A call that is a task goes through dask's graph (get_sync), which in
    # turn runs the in-process driver with the task's own key.
    keys = []
    task_leaf = key_recorder(keys, inline=False, name="task_leaf")
    inline_leaf = key_recorder(keys)

    @coroutine
    def parent():
        a = yield task_leaf(1)
        b = yield inline_leaf(2)
        return a + b

    root = parent(dask_key_name="root")
    assert root.compute() == 3
    assert [*places(keys[:1]), keys[1]] == [derive_key("task_leaf", "root", 0, ()), "root"]


def key_recorder(keys: list, **options):
    """A coroutine ``leaf(x) -> x`` that appends the key it runs under."""

    @coroutine(**options)
    def leaf(x):
        keys.append(current_key())
        return x

    return leaf


@pytest.mark.inline
def test_annotated_and_named_calls_are_tasks():
    keys = []
    leaf = key_recorder(keys)

    @coroutine
    def parent():
        with dask.annotate(priority=1):
            a = leaf(1)
        b = leaf(2, dask_key_name="mine")
        c = leaf(3)
        return (yield [a, b, c])

    assert parent(dask_key_name="root").compute() == [1, 2, 3]
    # Tasks (in the order dask runs them), then the inline call.
    assert places(keys[:2]) == {
        derive_key("leaf", "root", 0, (0,)),
        "mine",  # the key its caller named, kept
    }
    assert keys[2] == "root"  # plain arguments, no annotation: inline


def test_inline_off_in_config_makes_every_call_a_task():
    # tests run with coro.inline.enabled off unless marked inline
    keys = []
    leaf = key_recorder(keys)

    @coroutine
    def parent():
        return (yield leaf(1))

    assert parent(dask_key_name="root").compute() == 1
    assert len(keys) == 1 and places(keys) == {derive_key("leaf", "root", 0, ())}


@pytest.mark.inline
def test_inline_call_with_bad_argument_value_raises_at_the_yield():
    class Oops(Exception):
        pass

    @coroutine
    def fails(x):
        raise Oops(x)

    @coroutine
    def parent():
        try:
            yield [fails("a"), fails("b")]
        except Oops as e:
            return f"caught {e}"

    assert parent().compute() == "caught a"


@pytest.mark.inline
def test_call_computed_inline_is_not_computed_again_as_an_argument():
    @dask.delayed
    def plus_one(v):
        return v + 1

    @coroutine
    def parent():
        c = once(4)
        a = yield c  # inline
        b = yield plus_one(c)  # c's graph is now its value
        d = yield c  # reused
        return a, b, d

    assert parent().compute() == (40, 41, 40)
    assert RAN == [4]
