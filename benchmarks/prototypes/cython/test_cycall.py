"""The Cython prototype (cycall.pyx) against the pure-Python engine on the
same bodies, as ../ccall/test_ccall.py checks the C prototype: values, an
error thrown in at the yield, the stop flag, counting, references. Skips
unless built in place (README.md). Not collected by the package's suite:
    python -m pytest -q -p no:cacheprovider benchmarks/prototypes/cython/test_cycall.py
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
cycall = pytest.importorskip("cycall", reason="the prototype is not built (see README.md)")

import dask_coro  # noqa: E402
from dask_coro._internals.dask_private import annotations_in_effect  # noqa: E402
from dask_coro.core.engine import Done, Raised, Returned, Stopped  # noqa: E402
from dask_coro.examples import fib as pyfib  # noqa: E402
from dask_coro.runtime.call import trampoline  # noqa: E402


@cycall.coroutine
def fib(i):
    if i < 2:
        return i
    a, b = yield [fib(i - 1), fib(i - 2)]
    return a + b

def seq_fib(i: int) -> int:
    return i if i < 2 else seq_fib(i - 1) + seq_fib(i - 2)


def pure(call_of, *args, **kw):
    """Run ``call_of``'s body by the pure engine (as a worker runs it inline):
    (outcome, trampoline)."""
    t = trampoline("root", inline=True, count=True, **kw)
    return t.start(call_of.__wrapped__, args, {}), t


def both(build, root: str, *args, **kw):
    """``build(decorator)`` makes the bodies; the root's outcome under each
    engine, as ("value", v) or ("error", type, args) or ("stopped",)."""
    out = []
    fns = build(dask_coro.coroutine)
    o, _ = pure(fns[root], *args, **kw)
    if type(o) is Stopped:
        out.append(("stopped",))
    else:
        assert type(o) is Done
        s = o.step
        out.append(("value", s.value) if type(s) is Returned
                   else ("error", type(s.error), s.error.args))
        assert type(s) in (Returned, Raised)
    fns = build(cycall.coroutine)
    t = cycall.Trampoline(**kw)
    try:
        v = t.run(fns[root](*args))
        out.append(("stopped",) if v is cycall.STOPPED else ("value", v))
    except Exception as e:
        out.append(("error", type(e), e.args))
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 5, 15])
def test_fib_values_and_progress_counts(n):
    t = cycall.Trampoline()
    assert t.run(fib(n)) == seq_fib(n)
    o, pt = pure(pyfib, n)
    assert o.step.value == seq_fib(n)
    # every call but the root counted, as the pure engine counts them
    started = pt.call_counts().get(pyfib.__wrapped__, (0, 0, 0))[0]
    assert t.calls.get(fib, [0, 0]) == [started, 0]
    assert started == max(2 * seq_fib(n + 1) - 2, 0)


def _errors(co):
    log = []

    @co
    def bad(i):
        log.append(("bad", i))
        raise ValueError(i)

    @co
    def deep_bad(i):  # raises after a yield, from a frame of its own
        (a,) = yield [leaf(i)]
        raise KeyError(a)

    @co
    def leaf(i):
        log.append(("leaf", i))
        return i

    @co
    def catcher(i):
        try:
            yield [leaf(1), bad(i), leaf(2)]  # leaf(2) never starts
        except ValueError as e:
            caught = e.args
        try:
            yield [deep_bad(7)]
        except KeyError as e:
            caught += e.args
        return caught, tuple(log)

    @co
    def again(i):
        c = bad(i)
        errors = []
        for _ in range(2):  # the same call yielded again raises the same error again
            try:
                yield [c]
            except ValueError as e:
                errors.append(e)
        return errors[0] is errors[1], tuple(log)

    @co
    def uncaught(i):
        a, b = yield [leaf(i), bad(i)]
        return a + b

    return {"catcher": catcher, "again": again, "uncaught": uncaught, "log": log}


@pytest.mark.parametrize("root", ["catcher", "again", "uncaught"])
def test_child_error_thrown_in_at_the_yield(root):
    pure_out, c_out = both(_errors, root, 3)
    assert pure_out == c_out
    if root == "catcher":
        assert c_out == ("value", ((3, 7), (("leaf", 1), ("bad", 3), ("leaf", 7))))
    elif root == "again":
        assert c_out == ("value", (True, (("bad", 3),)))
    else:
        assert c_out == ("error", ValueError, (3,))


def test_failed_calls_counted():
    fns = _errors(cycall.coroutine)
    t = cycall.Trampoline()
    with pytest.raises(ValueError):
        t.run(fns["uncaught"](4))
    assert {f.__name__: c for f, c in t.calls.items()} == {"leaf": [1, 0], "bad": [1, 1]}


def _cancels(co, t_of):
    """A body that asks for a stop after a few calls, and bodies with finally
    blocks, to see which started and in what order they were closed."""
    log = []

    @co
    def step(i):
        log.append(("start", i))
        if i == 3:
            t_of().stop = True  # as the runner does on cancellation, from any thread
        return i

    @co
    def mid(i):
        try:
            yield [step(i), step(i + 1)]
            yield [step(i + 10)]
        finally:
            log.append(("closed", "mid", i))

    @co
    def top(i):
        try:
            yield [mid(1), mid(2), step(99)]
        finally:
            log.append(("closed", "top"))

    return top, log


def test_stop_flag_starts_no_call_and_closes_innermost_first():
    holder = {}
    # the pure engine, as a runner drives it on cancellation: Stopped, then close()
    top, log = _cancels(dask_coro.coroutine, lambda: holder["t"])
    holder["t"] = pt = trampoline("root", inline=True, count=True)
    assert type(pt.start(top.__wrapped__, (0,), {})) is Stopped
    assert pt.close() == []
    pure_log = list(log)

    top, log = _cancels(cycall.coroutine, lambda: holder["t"])
    holder["t"] = t = cycall.Trampoline()
    assert t.run(top(0)) is cycall.STOPPED
    assert log == pure_log
    # step(3) set the flag: mid(2)'s next call, step(12), and step(99) never started;
    # the open bodies were closed innermost first
    assert log == [("start", 1), ("start", 2), ("start", 11), ("closed", "mid", 1),
                   ("start", 2), ("start", 3), ("closed", "mid", 2), ("closed", "top")]
    assert t.calls[_fn_named(t, "step")] == [5, 0]


def _fn_named(t, name):
    (f,) = [f for f in t.calls if f.__name__ == name]
    return f


def test_same_call_twice_runs_once_and_tuple_shape():
    ran = []

    @cycall.coroutine
    def one(i):
        ran.append(i)
        return i * 10

    @cycall.coroutine
    def root(i):
        c = one(i)
        a = yield (c, c, one(i + 1))
        b = yield [c]
        return a, b, c.done

    assert cycall.Trampoline().run(root(2)) == ((20, 20, 30), [20], True)
    assert ran == [2, 3]


def test_keywords_plain_values_and_what_cannot_run_inline():
    @cycall.coroutine
    def add(a, b=0):
        return a + b

    @cycall.coroutine
    def root(i):
        (a,) = yield [add(i, b=5)]
        try:
            yield [add(i, dask_key_name="named")]  # a task: needs a cluster
        except TypeError as e:
            named = str(e)
        try:
            yield [add([i])]  # not plain arguments: a task
        except TypeError as e:
            lazy = str(e)
        try:
            yield [42]  # not a call
        except TypeError as e:
            bad = str(e)
        return a, named, lazy, bad

    a, named, lazy, bad = cycall.Trampoline().run(root(1))
    assert a == 6
    assert "cannot run inline" in named and "cannot run inline" in lazy
    assert "list or tuple of calls" in bad


def test_no_reference_kept_on_args_or_values():
    x = "".join(["a", "b" * 50])  # a plain argument, an object of its own
    v = object()

    @cycall.coroutine
    def ident(x):
        return x, v

    @cycall.coroutine
    def root(x):
        (a, b) = yield [ident(x), ident(x)]
        return a is b

    before = sys.getrefcount(x), sys.getrefcount(v)
    t = cycall.Trampoline()
    for _ in range(100):
        assert t.run(root(x)) is False
    assert (sys.getrefcount(x), sys.getrefcount(v)) == before


def _stop_on_second_ask():
    asked = []

    def cancelled():
        asked.append(1)
        return len(asked) >= 2

    return cancelled


@pytest.mark.parametrize("every", [1, 3, 256])
def test_cancelled_callback_asked_every_check_every_calls(every):
    t = cycall.Trampoline(cancelled=_stop_on_second_ask(), check_every=every)
    out = t.run(fib(12))
    pt = trampoline("fib", inline=True, count=True, check_every=every,
                    cancelled=_stop_on_second_ask())
    po = pt.start(pyfib.__wrapped__, (12,), {})
    pt.close()
    calls = 2 * seq_fib(13) - 2
    if 2 * every <= calls:
        assert out is cycall.STOPPED and type(po) is Stopped
        # the call that would have been the (2 * every)-th did not start
        assert t.calls[fib][0] == 2 * every - 1
        assert pt.call_counts()[pyfib.__wrapped__][0] == 2 * every - 1
    else:
        assert out == seq_fib(12) and po.step.value == seq_fib(12)


def test_annotations_in_effect_make_a_call_a_task():
    cycall.set_annotations_var(annotations_in_effect)
    try:
        assert fib(3).inline
        token = annotations_in_effect.set({"priority": 1})
        try:
            assert not fib(3).inline
        finally:
            annotations_in_effect.reset(token)
        assert fib(3).inline
    finally:
        cycall.set_annotations_var(None)


def test_idle_threads_elsewhere_are_a_clear_error():
    from dask_coro.core.engine import Idle

    idle = Idle(0)
    t = cycall.Trampoline(idle=idle)
    assert t.run(fib(8)) == 21
    idle.n = 1
    with pytest.raises(NotImplementedError, match="stealing"):
        t.run(fib(8))


def test_a_yield_under_other_annotations_is_not_inline_the_runs_own_are():
    import dask

    @cycall.coroutine
    def root(i):
        c = fib(i)  # made outside, yielded under the annotations
        with dask.annotate(priority=5):
            try:
                yield [c]
            except TypeError as e:
                made_outside = str(e)
            try:
                yield [fib(i)]
            except TypeError as e:
                return made_outside, str(e)

    @cycall.coroutine
    def root2(i):
        (a,) = yield [fib(i)]
        return a

    cycall.set_annotations_var(annotations_in_effect)
    try:
        # a call yielded under other annotations, and a call made under them: tasks
        made_outside, made_inside = cycall.Trampoline().run(root(5))
        assert "a yield under dask.annotate" in made_outside
        assert "cannot run inline" in made_inside
        # the run's own annotations (a worker's span): calls stay inline
        token = annotations_in_effect.set({"span": ("a",)})
        try:
            assert cycall.Trampoline().run(root2(10)) == 55
        finally:
            annotations_in_effect.reset(token)
    finally:
        cycall.set_annotations_var(None)
