"""The compiled prototypes against the pure-Python engine on the same bodies:
values, an error thrown in at the yield, cancellation, counting, references.
Each test runs on every prototype built in place (README.md; this folder's
C one, ``_ccall``, and ``../cython``'s ``cycall``), and skips if none is; a
few test what only the C one has. Not collected by the package's suite
(pyproject's testpaths is tests/): run it with
    python -m pytest -q -p no:cacheprovider benchmarks/prototypes/ccall/test_ccall.py
"""

from __future__ import annotations

import importlib
import os
import sys
from types import SimpleNamespace

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "cython")]

import dask_coro  # noqa: E402
from dask_coro._internals.dask_private import annotations_in_effect  # noqa: E402
from dask_coro.core.engine import Done, Raised, Returned, Stopped  # noqa: E402
from dask_coro.examples import fib as pyfib  # noqa: E402
from dask_coro.runtime.call import trampoline  # noqa: E402


def _fib_under(coroutine):
    @coroutine
    def fib(i):
        if i < 2:
            return i
        a, b = yield [fib(i - 1), fib(i - 2)]
        return a + b

    return fib


def _engines() -> list:
    out = []
    for name, module in (("C", "_ccall"), ("Cython", "cycall")):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        out.append(pytest.param(
            SimpleNamespace(coroutine=mod.coroutine, Trampoline=mod.Trampoline, STOPPED=mod.STOPPED,
                            set_annotations_var=mod.set_annotations_var, fib=_fib_under(mod.coroutine)),
            id=name,
        ))
    return out


ENGINES = _engines()
if not ENGINES:
    pytest.skip("no prototype is built (see README.md)", allow_module_level=True)


@pytest.fixture(params=ENGINES)
def eng(request):
    return request.param


@pytest.fixture
def ccall():
    """The C prototype, for what only it has."""
    return pytest.importorskip("_ccall", reason="the C prototype is not built (see README.md)")


def seq_fib(i: int) -> int:
    return i if i < 2 else seq_fib(i - 1) + seq_fib(i - 2)


def pure(call_of, *args, **kw):
    """Run ``call_of``'s body by the pure engine (as a worker runs it inline):
    (outcome, trampoline)."""
    t = trampoline("root", inline=True, count=True, **kw)
    return t.start(call_of.__wrapped__, args, {}), t


def both(eng, build, root: str, *args, **kw):
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
    fns = build(eng.coroutine)
    t = eng.Trampoline(**kw)
    try:
        v = t.run(fns[root](*args))
        out.append(("stopped",) if v is eng.STOPPED else ("value", v))
    except Exception as e:
        out.append(("error", type(e), e.args))
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 5, 15])
def test_fib_values_and_progress_counts(eng, n):
    t = eng.Trampoline(cancelled=lambda: False)
    assert t.run(eng.fib(n)) == seq_fib(n)
    o, pt = pure(pyfib, n)
    assert o.step.value == seq_fib(n)
    # every call but the root counted, as the pure engine counts them
    started = pt.call_counts().get(pyfib.__wrapped__, (0, 0, 0))[0]
    assert t.calls.get(eng.fib, [0, 0]) == [started, 0]
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
def test_child_error_thrown_in_at_the_yield(eng, root):
    pure_out, c_out = both(eng, _errors, root, 3)
    assert pure_out == c_out
    if root == "catcher":
        assert c_out == ("value", ((3, 7), (("leaf", 1), ("bad", 3), ("leaf", 7))))
    elif root == "again":
        assert c_out == ("value", (True, (("bad", 3),)))
    else:
        assert c_out == ("error", ValueError, (3,))


def test_failed_calls_counted(eng):
    fns = _errors(eng.coroutine)
    t = eng.Trampoline()
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


def test_stop_flag_starts_no_call_and_closes_innermost_first(eng):
    holder = {}
    # the pure engine, as a runner drives it on cancellation: Stopped, then close()
    top, log = _cancels(dask_coro.coroutine, lambda: holder["t"])
    holder["t"] = pt = trampoline("root", inline=True, count=True)
    assert type(pt.start(top.__wrapped__, (0,), {})) is Stopped
    assert pt.close() == []
    pure_log = list(log)

    top, log = _cancels(eng.coroutine, lambda: holder["t"])
    holder["t"] = t = eng.Trampoline()
    assert t.run(top(0)) is eng.STOPPED
    assert log == pure_log
    # step(3) set the flag: mid(2)'s next call, step(12), and step(99) never started;
    # the open bodies were closed innermost first
    assert log == [("start", 1), ("start", 2), ("start", 11), ("closed", "mid", 1),
                   ("start", 2), ("start", 3), ("closed", "mid", 2), ("closed", "top")]
    assert t.calls[_fn_named(t, "step")] == [5, 0]


def _fn_named(t, name):
    (f,) = [f for f in t.calls if f.__name__ == name]
    return f


def _stop_on_second_ask():
    asked = []

    def cancelled():
        asked.append(1)
        return len(asked) >= 2

    return cancelled


@pytest.mark.parametrize("every", [1, 3, 256])
def test_cancelled_callback_asked_every_check_every_calls(eng, every):
    t = eng.Trampoline(cancelled=_stop_on_second_ask(), check_every=every)
    out = t.run(eng.fib(12))
    pt = trampoline("fib", inline=True, count=True, check_every=every,
                    cancelled=_stop_on_second_ask())
    po = pt.start(pyfib.__wrapped__, (12,), {})
    pt.close()
    calls = 2 * seq_fib(13) - 2
    if 2 * every <= calls:
        assert out is eng.STOPPED and type(po) is Stopped
        # the call that would have been the (2 * every)-th did not start
        assert t.calls[eng.fib][0] == 2 * every - 1
        assert pt.call_counts()[pyfib.__wrapped__][0] == 2 * every - 1
    else:
        assert out == seq_fib(12) and po.step.value == seq_fib(12)


def test_same_call_twice_runs_once_and_tuple_shape(eng):
    ran = []

    @eng.coroutine
    def one(i):
        ran.append(i)
        return i * 10

    @eng.coroutine
    def root(i):
        c = one(i)
        a = yield (c, c, one(i + 1))
        b = yield [c]
        return a, b, c.done

    assert eng.Trampoline().run(root(2)) == ((20, 20, 30), [20], (20,))
    assert ran == [2, 3]


def test_keywords_plain_values_and_what_cannot_run_inline(eng):
    @eng.coroutine
    def add(a, b=0):
        return a + b

    @eng.coroutine
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

    a, named, lazy, bad = eng.Trampoline().run(root(1))
    assert a == 6
    assert "cannot run inline" in named and "cannot run inline" in lazy
    assert "list or tuple of calls" in bad


def test_annotations_in_effect_make_a_call_a_task(eng):
    eng.set_annotations_var(annotations_in_effect)
    try:
        assert eng.fib(3).inline
        token = annotations_in_effect.set({"priority": 1})
        try:
            assert not eng.fib(3).inline
        finally:
            annotations_in_effect.reset(token)
        assert eng.fib(3).inline
    finally:
        eng.set_annotations_var(None)


def test_no_reference_kept_on_args_or_values(eng):
    x = "".join(["a", "b" * 50])  # a plain argument, an object of its own
    v = object()

    @eng.coroutine
    def ident(x):
        return x, v

    @eng.coroutine
    def root(x):
        (a, b) = yield [ident(x), ident(x)]
        return a is b

    before = sys.getrefcount(x), sys.getrefcount(v)
    t = eng.Trampoline()
    for _ in range(100):
        assert t.run(root(x)) is False
    assert (sys.getrefcount(x), sys.getrefcount(v)) == before


def test_bad_arguments(ccall):
    import fibc  # beside _ccall

    with pytest.raises(TypeError, match="expects a function"):
        ccall.coroutine(3)
    with pytest.raises(TypeError, match="takes a call"):
        ccall.Trampoline().run(3)
    with pytest.raises(TypeError, match="callable"):
        ccall.Trampoline(cancelled=3)
    with pytest.raises(ValueError, match="check_every"):
        ccall.Trampoline(check_every=0)
    with pytest.raises(TypeError, match="__init__"):
        ccall.Trampoline.__new__(ccall.Trampoline).run(fibc.fib(3))


def test_idle_threads_elsewhere_are_a_clear_error(eng):
    from dask_coro.core.engine import Idle

    idle = Idle(0)
    t = eng.Trampoline(idle=idle)
    assert t.run(eng.fib(8)) == 21
    idle.n = 1
    with pytest.raises(NotImplementedError, match="stealing"):
        t.run(eng.fib(8))


def test_a_yield_under_other_annotations_is_not_inline_the_runs_own_are(eng):
    import dask

    @eng.coroutine
    def root(i):
        c = eng.fib(i)  # made outside, yielded under the annotations
        with dask.annotate(priority=5):
            try:
                yield [c]
            except TypeError as e:
                made_outside = str(e)
            try:
                yield [eng.fib(i)]
            except TypeError as e:
                return made_outside, str(e)

    @eng.coroutine
    def root2(i):
        (a,) = yield [eng.fib(i)]
        return a

    eng.set_annotations_var(annotations_in_effect)
    try:
        # a call yielded under other annotations, and a call made under them: tasks
        made_outside, made_inside = eng.Trampoline().run(root(5))
        assert "a yield under dask.annotate" in made_outside
        assert "cannot run inline" in made_inside
        # the run's own annotations (a worker's span): calls stay inline
        token = annotations_in_effect.set({"span": ("a",)})
        try:
            assert eng.Trampoline().run(root2(10)) == 55
        finally:
            annotations_in_effect.reset(token)
    finally:
        eng.set_annotations_var(None)


def test_delayed_subclass_calls(ccall):
    import fibc  # beside _ccall
    from dask.delayed import Delayed

    c = fibc.fibd(3)
    assert isinstance(c, Delayed) and not isinstance(fibc.fib(3), Delayed)
    assert ccall.Trampoline().run(fibc.fibd(15)) == seq_fib(15)
    with pytest.raises(AttributeError):
        c._key  # no key or graph in the prototype: Delayed.__getattr__ answers


@pytest.mark.parametrize("delayed", [False, True])
def test_a_cycle_through_a_call_is_collected(ccall, delayed):
    import gc
    import weakref

    class Holder:
        pass

    @ccall.coroutine
    def make(i):
        return Holder()

    @ccall.coroutine
    def root(i):
        c = make(i)
        (h,) = yield [c]
        h.call = c  # value -> call -> value
        return weakref.ref(h)

    root = ccall.coroutine(root.func, delayed=delayed)
    make = ccall.coroutine(make.func, delayed=delayed)
    ref = ccall.Trampoline().run(root(1))
    gc.collect()
    assert ref() is None


def test_a_yielded_list_changed_while_its_calls_run_is_a_clear_error(eng):
    shared = []

    @eng.coroutine
    def clears(i):
        shared.clear()
        return i

    @eng.coroutine
    def root(i):
        shared[:] = [clears(1), clears(2)]
        try:
            yield shared
        except RuntimeError as e:
            return str(e)

    assert "changed while its calls ran" in eng.Trampoline().run(root(0))
