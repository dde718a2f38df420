"""``dask_coro.result`` inside the engine (dask_coro/core/engine.py), driven
directly as the worker runner drives it: no cluster, no threads.

A body that calls ``result(x)`` at any call depth parks its stack in a
greenlet; the loop goes on in another one, and hands back when the yield's
results are in. Remote leaves here are ``Delayed`` objects the test answers
with ``resume``/``throw``, as a runner would.
"""

from __future__ import annotations

import dask
import pytest
from bodies import cleared
from greenlet import GreenletExit, getcurrent

from dask_coro import BadYieldError, coroutine, current_key, result
from dask_coro.core.engine import Done, Raised, Returned, Submit, current_trampoline
from dask_coro.runtime.call import trampoline

# Each test runs on both engines, compiled and pure (conftest.engine).
pytestmark = pytest.mark.usefixtures("engine")

LOG: list = []


_clear_log = cleared(LOG)


def make():
    return trampoline("root", inline=True)


def start(func, *args, tramp=None, **kwargs):
    t = tramp or make()
    return t, t.start(func.__wrapped__, args, kwargs, "root-scope")


def returned(out):
    assert type(out) is Done, out
    assert type(out.step) is Returned, out.step
    return out.step.value


def remote(value):
    return dask.delayed(lambda v: v, pure=False)(value)


def answer(t, out, values):
    """Resume the waiting top frame with ``values`` for its remote leaves."""
    assert type(out) is Submit and out.wait, out
    return t.resume(values)


# --------------------------------------------------------------------------
# bodies


@coroutine
def leaf(x):
    LOG.append(x)
    return x


def load_all(xs):
    return result([leaf(x) for x in xs])


def score(xs):
    return sum(load_all(xs))


@coroutine
def pipeline(groups):
    return [score(g) for g in groups]


@coroutine
def rfib(i):
    if i < 2:
        return i
    return _rfib_helper(i)


def _rfib_helper(i):
    a, b = result([rfib(i - 1), rfib(i - 2)])
    return a + b


@coroutine
def gen_fib(i):
    if i < 2:
        return i
    a, b = yield [gen_fib(i - 1), gen_fib(i - 2)]
    return a + b


# --------------------------------------------------------------------------
# inline: everything runs here


def test_plain_root_waits_two_frames_deep():
    t, out = start(pipeline, [[1, 2], [3]])
    assert returned(out) == [3, 3]
    assert LOG == [1, 2, 3]
    assert t.stack == [] and t.parked == 0


@pytest.mark.parametrize("n", [0, 1, 2, 15])
def test_recursion_through_plain_helpers(n):
    t, out = start(rfib, n)
    assert returned(out) == returned(start(gen_fib, n)[1])
    assert t.stack == [] and t.parked == 0


@coroutine
def mixed(n):
    a = yield leaf(n)
    b = _rfib_helper(10)  # waits from a helper of a generator body
    c = yield [leaf(1), rfib(5)]
    d = result(leaf(2))  # and from the body itself
    return a, b, c, d


def test_result_and_yield_mixed_in_one_body():
    _t, out = start(mixed, 3)
    assert returned(out) == (3, 55, [1, 5], 2)


@coroutine
async def async_body(xs):
    first = await leaf(0)
    return first, score(xs)


def test_async_body_waits_from_a_helper():
    _t, out = start(async_body, [4, 5])
    assert returned(out) == (0, 9)


@coroutine
def shapes():
    return result({"a": leaf(1), "b": (leaf(2), [leaf(3), 4])}), result(leaf(5)), result(7)


def test_results_come_back_in_the_shape_waited_for():
    _t, out = start(shapes)
    assert returned(out) == ({"a": 1, "b": (2, [3, 4])}, 5, 7)


@coroutine
def plain_then_body():
    first = result(leaf("p"))
    return gen_after(first)


def gen_after(first):
    x = yield leaf("g")
    return first, x


def test_a_plain_call_that_waits_then_returns_a_generator_runs_it():
    _t, out = start(plain_then_body)
    assert returned(out) == ("p", "g")


# --------------------------------------------------------------------------
# remote leaves: the body parks until the runner answers


def test_remote_leaves_park_the_body_until_resumed():
    @coroutine
    def waits_remote():
        LOG.append("before")
        got = _helper_remote()
        LOG.append(("after", got))
        return got

    t, out = start(waits_remote)
    # The remote leaves start first, while the inline one runs.
    assert type(out) is Submit and not out.wait
    assert t.parked == 1 and LOG == ["before"]
    (frame, positions) = out.batches[0]
    assert frame is out.frame and positions == [0, 1]
    out = t.run()
    assert type(out) is Submit and out.wait and out.batches == []
    assert LOG == ["before", 3]
    out = answer(t, out, [10, 20])
    assert returned(out) == [10, 20, 3]
    assert LOG == ["before", 3, ("after", [10, 20, 3])]
    assert t.parked == 0 and t.stack == []


def _helper_remote():
    return result([remote(1), remote(2), leaf(3)])


@coroutine
def child_waits_remote(tag):
    return _deep_remote(tag)


def _deep_remote(tag):
    (v,) = result([remote(tag)])
    return (tag, v)


@coroutine
def parent_of_parked_children():
    return (yield [child_waits_remote("a"), child_waits_remote("b")])


def test_children_that_park_each_get_a_frame_and_resume_in_order():
    t, out = start(parent_of_parked_children)
    # Before the first child waits, the second is promoted (it could run
    # while the stack waits): it is handed out as a task.
    assert type(out) is Submit and out.wait
    labels = [(f.label, list(p)) for f, p in out.batches]
    assert labels == [("root", [1]), ("child_waits_remote", [0])]
    assert t.parked == 1
    out = t.resume(["A"])
    # The first child finished; the parent waits for the second, a task.
    assert type(out) is Submit and out.wait and t.parked == 0
    out = t.resume([("b", "B")])
    assert returned(out) == [("a", "A"), ("b", "B")]


def test_keys_of_a_parked_call_are_those_its_frame_would_have():
    t, out = start(parent_of_parked_children)
    child = out.frame
    assert child.up is t.stack[0] and child.at == 0
    assert child.ident("root") == ("root", 0, (0,))
    assert child.index == 0


# --------------------------------------------------------------------------
# errors


@coroutine
def boom(msg):
    raise ValueError(msg)


def _catches():
    try:
        result([leaf(1), boom("inline")])
    except ValueError as e:
        return f"caught {e}"


@coroutine
def catches_at_result():
    return _catches()


def test_child_error_is_raised_at_result():
    _t, out = start(catches_at_result)
    assert returned(out) == "caught inline"


def test_remote_error_is_raised_at_result_with_its_type():
    @coroutine
    def body():
        try:
            result(remote(1))
        except KeyError as e:
            return f"caught {e!r}"

    t, out = start(body)
    assert type(out) is Submit and t.parked == 1
    out = t.throw(KeyError("remote"))
    assert returned(out) == "caught KeyError('remote')"
    assert t.parked == 0


def test_uncaught_error_fails_the_root():
    @coroutine
    def body():
        return _helper_boom()

    def _helper_boom():
        return result(boom("up"))

    _t, out = start(body)
    assert type(out) is Done and type(out.step) is Raised
    assert str(out.step.error) == "up"


def test_bad_input_raises_bad_yield_error_naming_it_and_where():
    @coroutine
    def body():
        try:
            result([leaf(1), {"k": {1, 2}}])
        except BadYieldError as e:
            return str(e)

    _t, out = start(body)
    msg = returned(out)
    assert "{1, 2}" in msg and "[1]['k']" in msg and "a set has no order" in msg
    assert LOG == []  # nothing of the bad yield ran


def test_result_outside_any_trampoline_has_none():
    assert current_trampoline() is None


# --------------------------------------------------------------------------
# cancellation: parked bodies unwind innermost first


@coroutine
def guarded(tag):
    try:
        return _outer(tag)
    finally:
        LOG.append(f"{tag}:body")


def _outer(tag):
    try:
        return _inner(tag)
    finally:
        LOG.append(f"{tag}:outer")


def _inner(tag):
    try:
        return result(remote(tag))
    except GreenletExit:
        LOG.append(f"{tag}:GreenletExit")
        raise
    finally:
        LOG.append(f"{tag}:inner")


@coroutine
def parks_nested():
    try:
        return (yield [guarded("a")])
    finally:
        LOG.append("root")


def test_close_unwinds_parked_bodies_innermost_first():
    t, out = start(parks_nested)
    assert type(out) is Submit and t.parked == 1
    assert t.close() == []
    assert LOG == ["a:GreenletExit", "a:inner", "a:outer", "a:body", "root"]
    assert t.parked == 0 and t.stack == []


@coroutine
def ignores_greenlet_exit():
    try:
        result(remote(1))
    except GreenletExit:
        LOG.append("ignored")
    return "went on"


def test_a_body_that_ignores_greenlet_exit_is_reported():
    t, out = start(ignores_greenlet_exit)
    assert type(out) is Submit
    (error,) = [e for e in t.close()]
    assert "ignored GreenletExit" in str(error)
    assert LOG == ["ignored"]


@coroutine
def waits_in_finally():
    try:
        yield remote(1)
    finally:
        try:
            result(leaf("late"))
        except GreenletExit:
            LOG.append("refused")


def test_result_while_closing_raises_greenlet_exit():
    t, out = start(waits_in_finally)
    assert type(out) is Submit
    assert t.close() == []
    assert LOG == ["refused"]


# --------------------------------------------------------------------------
# context: current_key and compute-once inside helpers


def test_current_key_inside_helpers():
    import contextvars

    from dask_coro._context import running_key

    @coroutine
    def body():
        return _key_deep()

    def _key_deep():
        result(leaf(1))
        return current_key()

    ctx = contextvars.copy_context()
    ctx.run(running_key.set, "the-key")
    t = make()
    out = ctx.run(t.start, body.__wrapped__, (), {}, None)
    assert returned(out) == "the-key"


@coroutine
def twice():
    x = leaf("once")
    a = result(x)
    b = result([x, x])
    return a, b


def test_a_call_waited_for_twice_runs_once():
    _t, out = start(twice)
    assert returned(out) == ("once", ["once", "once"])
    assert LOG == ["once"]


def test_loop_greenlets_are_reused():
    from dask_coro.core import greenlets

    start(rfib, 12)
    pool = list(greenlets._pool())
    start(rfib, 12)
    assert greenlets._pool() and set(map(id, greenlets._pool())) <= set(map(id, pool)) | set(
        map(id, greenlets._pool())
    )
    assert len(greenlets._pool()) <= greenlets._POOL_SIZE
    assert getcurrent().parent is None  # the test runs on the thread's main greenlet
