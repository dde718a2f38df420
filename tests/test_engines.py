"""The compiled engine and the pure one agree (docs/development.md).

Every test of the engine modules runs on both loops (``conftest.engine``);
these tests are about the two engines themselves: which one runs, making a
call in C and in Python, a trampoline on each giving the same results,
counts and stops, and the compiled one's base class surviving pickle.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import cloudpickle
import dask
import pytest

import dask_coro
from dask_coro import coroutine
from dask_coro.core import accel
from dask_coro.core.engine import Done, Idle, Stopped
from dask_coro.examples import fib
from dask_coro.runtime.call import CoroutineCall, CoroutineFunction, _MakesCalls, trampoline

compiled = pytest.mark.skipif(accel.cengine is None, reason=f"the compiled engine is not in use ({accel.why})")


@coroutine
def leaf(x, k=0):
    return x + k


def test_dask_coro_engine_says_which_runs():
    assert dask_coro.engine == accel.ENGINE
    assert accel.ENGINE in ("compiled", "pure")
    line = accel.describe()
    assert line.startswith(f"engine: {accel.ENGINE}")


def test_dask_coro_pure_forces_the_pure_engine():
    code = (
        "import dask_coro; from dask_coro.core import accel; from dask_coro.runtime import call;"
        "print(dask_coro.engine, call.CoroutineFunction.__mro__[1].__name__, accel.describe())"
    )
    env = dict(os.environ, DASK_CORO_PURE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[:2] == ["pure", "_MakesCalls"], out.stdout
    assert "DASK_CORO_PURE is set" in out.stdout
    # "0" means unset: the compiled engine runs where built
    built = importlib.util.find_spec("dask_coro.core._cengine") is not None
    env["DASK_CORO_PURE"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == ("compiled" if built else "pure")


def _slots(call):
    return {slot: getattr(call, slot, "<unset>") for slot in CoroutineCall.__slots__}


CALLS = [
    ((1,), {}),
    ((1, 2.5, "s", b"b", None, True, 3j), {}),
    ((1,), {"k": 2}),
    (([1],), {}),  # a list holds no lazy value, but is not plain: a task
    ((1,), {"k": [2]}),
    ((1,), {"dask_key_name": "leaf-x"}),
    ((1,), {"dask_key_name": None}),
    ((dask.delayed(1),), {}),
    ((), {}),
]


@compiled
@pytest.mark.parametrize("args, kwargs", CALLS, ids=[f"call{i}" for i in range(len(CALLS))])
def test_a_call_made_in_c_is_the_call_made_in_python(args, kwargs):
    assert type(CoroutineFunction.__mro__[1]).__name__ == "type"
    assert CoroutineFunction.__mro__[1] is accel.cengine.FunctionBase
    c = leaf(*args, **dict(kwargs))
    p = _MakesCalls.__call__(leaf, *args, **dict(kwargs))
    assert type(c) is type(p) is CoroutineCall
    sc, sp = _slots(c), _slots(p)
    # the same function wrapped in a partial is an equal partial, not the same object
    ic, ip = sc.pop("__dask_coro_inline__"), sp.pop("__dask_coro_inline__")
    assert sc == sp
    if ip is None or ip is leaf.run:
        assert ic is ip
    else:
        assert (ic.func, ic.args, ic.keywords) == (ip.func, ip.args, ip.keywords)


@compiled
def test_a_call_made_under_annotate_is_a_task_on_both():
    with dask.annotate(priority=3):
        c = leaf(1)
        p = _MakesCalls.__call__(leaf, 1)
    assert c.__dask_coro_inline__ is None and p.__dask_coro_inline__ is None
    assert c._ann == p._ann == {"priority": 3}


def test_inline_survives_pickle_of_the_function():
    f = coroutine(inline=False)(fib.__wrapped__)
    # by value, as a task's function defined in __main__ or a test module travels
    g = cloudpickle.loads(cloudpickle.dumps(fib))
    assert g.inline is True and g._inline is not None
    assert cloudpickle.loads(cloudpickle.dumps(f)).inline is False
    assert cloudpickle.loads(cloudpickle.dumps(fib))(3).__dask_coro_inline__ is not None


def _run(n, **kw):
    t = trampoline("fib", inline=True, count=True, awaits=False, **kw)
    out = t.start(fib.__wrapped__, (n,), {})
    return t, out


def test_the_trampoline_takes_the_loop_of_the_engine_in_use(engine):
    t, _ = _run(5)
    assert (t.fast is not None) == (engine == "compiled")
    # nothing inline, nothing compiled to run
    assert trampoline("x", inline=False).fast is None


def test_fib_and_its_counts_agree_with_sequential_python(engine):
    t, out = _run(18)
    assert type(out) is Done and out.step.value == 2584
    # fib(18) makes 2 fib(19) - 1 = 8361 calls, the root one of them
    assert t.call_counts()[fib.__wrapped__] == (8360, 8360, 0)


def test_a_stop_set_by_a_call_stops_before_the_next_one_and_run_goes_on(engine):
    ran = []

    @coroutine
    def note(i):
        ran.append(i)
        if i == 3:
            t.stop = True
        return i

    @coroutine
    def root():
        out = yield [note(i) for i in range(8)]
        return sum(out)

    t = trampoline("root", inline=True, awaits=False)
    out = t.start(root.__wrapped__, (), {})
    assert type(out) is Stopped and ran == [0, 1, 2, 3]
    t.stop = False
    out = t.run()
    assert type(out) is Done and out.step.value == 28 and ran == list(range(8))


def test_cancelled_is_asked_every_check_every_calls(engine):
    asked = []

    def cancelled():
        asked.append(t.call_counts()[fib.__wrapped__][0])
        return len(asked) == 3

    t = trampoline("fib", inline=True, count=True, cancelled=cancelled, check_every=50, awaits=False)
    out = t.start(fib.__wrapped__, (15,), {})
    assert type(out) is Stopped
    # asked before the 50th, 100th and 150th call; counts trail by less than check_every
    assert len(asked) == 3 and all(0 <= a <= 150 for a in asked), asked
    assert t.close() == []


def test_idle_capacity_hands_out_calls_on_both(engine):
    idle = Idle(1)
    t = trampoline("fib", inline=True, idle=idle, awaits=False)
    out = t.start(fib.__wrapped__, (6,), {})
    # the oldest unstarted call is handed out: a Submit that does not wait
    assert type(out).__name__ == "Submit" and not out.wait
    assert [len(p) for _, p in out.batches] == [1]


def test_a_childs_error_reaches_its_parent_with_its_traceback(engine):
    @coroutine
    def bad(x):
        raise KeyError(x)

    @coroutine
    def parent():
        try:
            yield [leaf(1), bad(2), leaf(3)]
        except KeyError as e:
            return ("caught", e.args, e.__traceback__ is not None)

    t = trampoline("parent", inline=True, awaits=False, count=True)
    out = t.start(parent.__wrapped__, (), {})
    assert out.step.value == ("caught", (2,), True)
    counts = {getattr(f, "__name__", f): c for f, c in t.call_counts().items()}
    assert counts["bad"] == (1, 0, 1) and counts["leaf"] == (1, 1, 0)


def test_worker_processes_run_the_engine_asked_for(engine):
    # what conftest.engine promises: worker processes a test starts run it too
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc) as client:
        assert set(client.run(lambda: __import__("dask_coro").engine).values()) == {engine}
        assert client.compute(fib(15)).result() == 610
