"""The compiled engine and the pure one agree (docs/development.md).

Every test of the engine modules runs on both loops (``conftest.engine``);
these tests are about the two engines themselves: which one runs, making a
call in C and in Python, a trampoline on each giving the same results,
counts and stops, and the compiled one's base class surviving pickle.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import cloudpickle
import dask
import pytest
from bodies import leaf

import dask_coro
from dask_coro import coroutine
from dask_coro.core import accel
from dask_coro.core.engine import Done, Idle, Stopped
from dask_coro.examples import fib
from dask_coro.runtime.call import CoroutineCall, CoroutineFunction, _MakesCalls, trampoline

compiled = pytest.mark.skipif(accel.cengine is None, reason=f"the compiled engine is not in use ({accel.why})")


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
    # what conftest.engine promises: worker processes a test starts run it too.
    # fib(10): 177 calls, each a task here (inline is off in the tests), run by
    # that engine in the worker process; fib(15)'s 1,973 tasks took 7 s on one
    # thread and reached nothing more.
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc) as client:
        assert set(client.run(lambda: __import__("dask_coro").engine).values()) == {engine}
        assert client.compute(fib(10)).result() == 55


# -- the compiled engine's entries, hardened (crashes are found in a subprocess) --


def _python(code, **env):
    """Runs ``code`` in a fresh interpreter: (returncode, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True,
                          text=True, env=dict(os.environ, **env), timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def _survives(code, **env):
    rc, out, err = _python(code, **env)
    # a crash is -11 (SIGSEGV) or 139, an abort -6: any but 0 fails
    assert rc == 0, f"exit {rc}\n{out[-2000:]}\n{err[-4000:]}"
    return out


# A run stopped in the middle of a yield, its frames on the stack: root
# yields [mid()], mid yields [note(0), ..., note(7)], note(3) stops the run.
_STOPPED = r'''
from dask_coro import coroutine
from dask_coro.core import _cengine
from dask_coro.core.engine import Frame, Idle, Trampoline
from dask_coro.runtime.call import CoroutineCall, trampoline
from dask_coro.examples import fib

@coroutine
def note(i):
    if i == 3:
        T[0].stop = True
    return float(i)

@coroutine
def mid():
    out = yield [note(i) for i in range(8)]
    return sum(out)

@coroutine
def root():
    out = yield [mid()]
    return out[0]

T = [None]

def stopped(**kw):
    t = T[0] = trampoline("root", inline=True, awaits=False, **kw)
    out = t.start(root.__wrapped__, (), {})
    assert type(out).__name__ == "Stopped", out
    t.stop = False
    return t

def steps_args(t):
    run = [note.run, 1]
    return [t, t.stack[-1], run, 100, False, t.stack, t.idle, t.call_type, t.annotations_now,
            t.own_annotations]

def engine_still_runs():
    import gc
    gc.collect()
    t = trampoline("fib", inline=True, awaits=False, count=True)
    assert t.start(fib.__wrapped__, (15,), {}).step.value == 610
    t = stopped()
    assert t.run().step.value == 28.0
    gc.collect()
'''


@compiled
def test_every_function_of_the_compiled_engine_takes_wrong_arguments_without_a_crash():
    code = _STOPPED + r'''
import functools

class Other:
    __slots__ = ("x",)

BAD = [None, 0, -1, 2**70, 1.5, "s", (), [], [1, 2], {}, object(), Idle(0), object.__new__(Frame),
       CoroutineCall(), Frame, CoroutineCall, Other, Other(), int, len, lambda *a, **k: None]

DELETED = object()  # the slot deleted

def attempt(f, *a, **k):
    try:
        f(*a, **k)
    except Exception:
        pass

names = [n for n in dir(_cengine) if not n.startswith("__")]
called = []
for name in names:
    f = getattr(_cengine, name)
    if not callable(f):
        continue
    called.append(name)
    for n in range(12):
        for b in BAD:
            attempt(f, *[b] * n)
            attempt(f, *[b] * n, x=b)
    for b in BAD:
        attempt(f, b, **{"Frame": b, "call_type": b})

# steps: a run's very arguments, each in turn replaced
for k in range(10):
    for b in BAD:
        t = stopped()
        args = steps_args(t)
        args[k] = b
        attempt(_cengine.steps, *args)
# the stopped frames' slots, and the calls' of their yield, each in turn set wrong
for slot in Frame.__slots__:
    for b in [*BAD, DELETED]:
        for at in (-1, 0):
            t = stopped(count=True)
            frame = t.stack[at]
            if b is DELETED:
                attempt(delattr, frame, slot)
            else:
                setattr(frame, slot, b)
            attempt(_cengine.steps, *steps_args(t))
for slot in CoroutineCall.__slots__:
    for b in [*BAD, DELETED]:
        t = stopped()
        leaf = t.stack[-1].leaves[5]
        if b is DELETED:
            attempt(delattr, leaf, slot)
        else:
            setattr(leaf, slot, b)
        attempt(_cengine.steps, *steps_args(t))
# the stack holding something else than frames
for b in BAD:
    t = stopped()
    t.stack.insert(0, b)
    attempt(_cengine.steps, *steps_args(t))
    t = stopped()
    t.stack[0] = b
    attempt(_cengine.steps, *steps_args(t))

# making calls: FunctionBase's slot set wrong
for b in [*BAD, DELETED]:
    fb = _cengine.FunctionBase()
    if b is DELETED:
        del fb._inline
    else:
        fb._inline = b
    attempt(fb, 1)
    attempt(fb, 1, k=b)

engine_still_runs()
print(" ".join(called))
'''
    out = _survives(code)
    assert set(out.split()) == {"Exit", "FunctionBase", "fast_calls", "setup", "setup_calls", "steps"}


def _outcome(fn):
    try:
        return "returned", fn()
    except Exception as e:
        return "raised", type(e)


@compiled
@pytest.mark.parametrize("slot", ["next", "index"])
def test_a_frame_position_too_big_for_c_goes_to_the_pure_loop(slot):
    # An int a Py_ssize_t does not hold: the compiled loop leaves it to the
    # pure one (once it stopped with an OverflowError set: SystemError), and
    # the run ends as on the pure engine.
    @coroutine
    def twice():
        a = yield [leaf(1), leaf(2)]
        b = yield [leaf(3)]
        return a + b

    def run(fast):
        t = trampoline("twice", inline=True, awaits=False)
        assert t.fast is not None
        if not fast:
            t.fast = None
        t.stop = True  # stops at the first yield, before its calls
        assert type(t.start(twice.__wrapped__, (), {})) is Stopped
        t.stop = False
        frame = t.stack[-1]
        setattr(frame, slot, 2**70)
        out = t.run()
        return type(out).__name__, getattr(getattr(out, "step", None), "value", None), frame.index

    compiled_run = _outcome(lambda: run(True))
    assert compiled_run == _outcome(lambda: run(False))
    assert compiled_run[0] == "returned"
    if slot == "index":
        assert compiled_run[1] == ("Done", [1, 2, 3], 2**70 + 1)


@compiled
def test_python_code_run_inside_a_step_frees_nothing_the_step_uses():
    # A call's arguments freed by Python code the step runs before the call
    # (the count's _started), a yield's leaves by a stop's __bool__: the step
    # holds what it uses, the results are right.
    code = _STOPPED + r'''
@coroutine
def one(x):
    return x

@coroutine
def ident(x):
    return x

@coroutine
def pair():
    out = yield [one(0.5), ident(float(10**6 + 1)), ident(float(10**6 + 2))]
    return out

def pair_run(fast):
    t = trampoline("pair", inline=True, awaits=False, count=True)
    if not fast:
        t.fast = None
    started = t._started

    def _started(func, n):
        if func is one.run:
            # the next calls' arguments: replaced, freed, their memory reused
            for c in t.stack[-1].leaves[1:]:
                c.__dask_coro_args__ = (0.0,)
            junk = [float(i) for i in range(1000)]
        return started(func, n)

    t._started = _started
    return t.start(pair.__wrapped__, (), {}).step.value

assert pair_run(True) == pair_run(False) == [0.5, float(10**6 + 1), 0.0], pair_run(True)

class Stop:
    def __bool__(self):
        frame = t.stack[-1]
        frame.leaves = [0] * len(frame.leaves)  # the yield's calls freed
        frame.body = None
        junk = [object() for i in range(1000)]
        return False

t = stopped()
t.stop = Stop()
try:
    t.run()
except Exception:
    pass
engine_still_runs()
print("ok")
'''
    assert _survives(code).split() == ["ok"]


@compiled
def test_the_compiled_engine_is_set_up_once():
    # A second setup_calls with another call type took over the table of
    # slots and the free list of the first one's calls (freed calls of one
    # type reused as the other); a second setup() changed the offsets under
    # frames of the first Frame.
    code = _STOPPED + r'''
import functools
from dask_coro.core import engine
from dask_coro.runtime import call

class Other:
    __slots__ = (*CoroutineCall.__slots__, *[f"x{i}" for i in range(20)])

objects = dict(partial=functools.partial, is_own=call._is_own, own_seen=call._own_seen,
               annotations=call.annotations_in_effect)
class Same:
    __slots__ = CoroutineCall.__slots__

engine_still_runs()
for other in (Same, Other):
    try:
        _cengine.setup_calls(call_type=other, **objects)
        print("setup_calls taken")
    except (RuntimeError, TypeError) as e:
        assert (other is Other and "has a slot 'x0'" in str(e)) or (
            "setup_calls() was called already, with another call_type" in str(e)), e
_cengine.setup_calls(call_type=CoroutineCall, **objects)  # the same again: nothing changes
for _ in range(3):
    engine_still_runs()
    [Other() for _ in range(1000)]

class Frame2:
    __slots__ = Frame.__slots__

objects = dict(Trampoline=Trampoline, Frame=Frame2, Idle=Idle, NOT_DONE=engine.NOT_DONE,
               PENDING=engine._PENDING, STEPPED=engine._STEPPED, EMPTY=engine._EMPTY,
               RANGES=engine._RANGES, Failed=engine.Failed, Request=engine.Request)
try:
    _cengine.setup(**objects)
    print("setup taken")
except RuntimeError as e:
    assert "setup() was called already, with another Frame" in str(e), e
_cengine.setup(**dict(objects, Frame=Frame))
engine_still_runs()
print("ok")
'''
    assert _survives(code).split() == ["ok"]


@compiled
def test_a_class_whose_slots_the_compiled_engine_does_not_know_fails_its_setup():
    # The C loop reads and writes Frame's and the call type's slots, and
    # makes both: a slot added to the Python class (which C would leave
    # unset, or keep from a frame it reuses), or one removed, or a __dict__,
    # fails loudly at set-up, naming the class and the slot. Fresh engine
    # state: the module loaded by hand where dask_coro runs the pure engine.
    code = r'''
import functools, importlib.util
from dask_coro.core import engine
from dask_coro.core.engine import Frame, Idle, Trampoline
from dask_coro.runtime import call
from dask_coro.runtime.call import CoroutineCall

spec = importlib.util.spec_from_file_location("dask_coro.core._cengine", SO)
_cengine = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_cengine)

class FrameMore(Frame):
    __slots__ = ("extra",)

FrameLess = type("FrameLess", (), {"__slots__": tuple(s for s in Frame.__slots__ if s != "ann")})

class FrameDict(Frame):
    pass

class CallMore(CoroutineCall):
    __slots__ = ("extra",)

class CallDict(CoroutineCall):
    pass

objects = dict(Trampoline=Trampoline, Frame=Frame, Idle=Idle, NOT_DONE=engine.NOT_DONE,
               PENDING=engine._PENDING, STEPPED=engine._STEPPED, EMPTY=engine._EMPTY,
               RANGES=engine._RANGES, Failed=engine.Failed, Request=engine.Request)
calls = dict(call_type=CoroutineCall, partial=functools.partial, is_own=call._is_own,
             own_seen=call._own_seen, annotations=call.annotations_in_effect)
for fn, kw in [(_cengine.setup, dict(objects, Frame=FrameMore)),
               (_cengine.setup, dict(objects, Frame=FrameLess)),
               (_cengine.setup, dict(objects, Frame=FrameDict)),
               (_cengine.setup_calls, dict(calls, call_type=CallMore)),
               (_cengine.setup_calls, dict(calls, call_type=CallDict))]:
    try:
        fn(**kw)
        print("taken")
    except TypeError as e:
        print(e)
# the very classes of the package are taken
_cengine.setup(**objects)
_cengine.setup_calls(**calls)
print("ok")
'''.replace("SO", repr(accel.cengine.__file__))
    out = _survives(code, DASK_CORO_PURE="1").splitlines()
    assert out[-1] == "ok" and len(out) == 6, out
    more, less, fdict, cmore, cdict = out[:5]
    assert "FrameMore" in more and "'extra'" in more
    assert "FrameLess" in less and "no slot ann" in less
    assert "FrameDict" in fdict and "__dict__" in fdict
    assert "CallMore" in cmore and "'extra'" in cmore
    assert "CallDict" in cdict and "__dict__" in cdict


def _newer_pythons():
    """Newer CPython 3 minor versions found on PATH, runnable (an older one
    lacks functions the module calls: loading it fails already)."""
    found = []
    for minor in range(sys.version_info[1] + 1, 14):
        exe = shutil.which(f"python3.{minor}")
        if exe and subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0:
            found.append(exe)
    return found


@compiled
def test_the_compiled_engine_refuses_to_import_on_another_python(tmp_path):
    # Built for this CPython, the module loaded by a newer one (renamed to its
    # suffix) refuses to import, with the reason, before it touches an object.
    others = _newer_pythons()
    if not others:
        pytest.skip("no newer CPython, up to 3.13, on PATH")
    for exe in others:
        suffix = subprocess.run([exe, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                                capture_output=True, text=True, check=True).stdout.strip()
        (tmp_path / "pkg").mkdir(exist_ok=True)
        shutil.copy(accel.cengine.__file__, tmp_path / "pkg" / f"_cengine{suffix}")
        proc = subprocess.run(
            [exe, "-c", "try:\n import pkg._cengine\n print('imported')\nexcept ImportError as e:\n print(e)"],
            capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 0, (exe, proc.returncode, proc.stderr[-2000:])
        if "undefined symbol" in proc.stdout:
            continue  # the dynamic loader refused it already
        built = f"{sys.version_info[0]}.{sys.version_info[1]}"
        assert f"was built for CPython {built}, not 3." in proc.stdout, proc.stdout
