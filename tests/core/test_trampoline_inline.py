"""The inline trampoline (dask_coro/core/engine.py), driven directly as the worker
runner drives it: no cluster, no threads.

``start``/``run``/``resume``/``throw`` return ``Done`` (the root finished),
``Submit`` (start remote leaves; wait for the top frame's if ``wait``) or
``Stopped`` (``cancelled()`` said so). Side effects of bodies are recorded in
plain lists, passed as module state (everything runs in this thread).
"""

from __future__ import annotations

import contextvars
import threading
from collections import namedtuple

import dask
import pytest
from bodies import cleared, yields_one_by_one
from dask.delayed import Delayed

import dask_coro
from dask_coro import BadYieldError, coroutine, current_key
from dask_coro.core.engine import Done, Idle, Raised, Returned, Stopped, Submit
from dask_coro.core.plan import derive_key
from dask_coro.examples import afib, fib
from dask_coro.runtime.call import trampoline

# Each test runs on both engines, compiled and pure (conftest.engine).
pytestmark = pytest.mark.usefixtures("engine")

# --------------------------------------------------------------------------
# helpers

LOG: list = []  # what bodies did, in order; cleared by the autouse fixture


_clear_log = cleared(LOG)


def make(idle=None, cancelled=None, check_every=256):
    return trampoline(
        "root",
        inline=True,
        idle=idle if idle is not None else Idle(0),
        cancelled=cancelled if cancelled is not None else (lambda: False),
        check_every=check_every,
    )


def start(func, *args, tramp=None, scope="root-scope", **kwargs):
    t = tramp or make()
    return t, t.start(func.__wrapped__, args, kwargs, scope)


def returned(out):
    assert type(out) is Done, out
    assert type(out.step) is Returned, out.step
    return out.step.value


def raised(out):
    assert type(out) is Done, out
    assert type(out.step) is Raised, out.step
    return out.step.error


def positions(out):
    """The batches of a Submit as (frame name, positions)."""
    return [(f.label, list(p)) for f, p in out.batches]


@coroutine
def rec(x):
    """A plain call: records that it ran."""
    LOG.append(x)
    return x


@coroutine
def grec(x):
    """A generator call that records, yields one inline call, and returns."""
    LOG.append(x)
    y = yield rec(f"{x}.child")
    return (x, y)


@coroutine
def boom(msg):
    LOG.append(f"boom {msg}")
    raise ValueError(msg)


@coroutine
def gen_boom_before_yield(msg):
    LOG.append(f"gboom {msg}")
    raise KeyError(msg)
    yield  # pragma: no cover - makes it a generator


@coroutine
def gen_boom_after_yield(msg):
    yield rec(f"before {msg}")
    raise ValueError(msg)


def delayed_leaf(value):
    return dask.delayed(lambda v: v, pure=False)(value)


# --------------------------------------------------------------------------
# all inline


@pytest.mark.parametrize("func, n, expected", [(fib, 15, 610), (afib, 12, 144)])
def test_recursion_runs_all_inline(func, n, expected):
    t, out = start(func, n)
    assert returned(out) == expected  # Done at once: no Submit, no Stopped
    assert t.stack == []


def test_root_that_does_not_yield():
    _t, out = start(rec, "plain")
    assert returned(out) == "plain"
    assert LOG == ["plain"]


Point = namedtuple("Point", "x y")


@coroutine
def shapes():
    d = yield {"a": rec(1), "b": [rec(2), (rec(3), "plain")], "c": None}
    t = yield (rec(4), rec(5))
    p = yield Point(rec(6), 7)
    single = yield rec(8)
    mixed = yield [rec(9), 10, "s", [rec(11)]]
    empty = yield []
    nested = yield [grec("g"), {"k": grec("h")}]
    return d, t, p, single, mixed, empty, nested


def test_results_keep_the_yielded_shape():
    _t, out = start(shapes)
    d, tup, p, single, mixed, empty, nested = returned(out)
    assert d == {"a": 1, "b": [2, (3, "plain")], "c": None}
    assert type(d["b"][1]) is tuple
    assert tup == (4, 5) and type(tup) is tuple
    assert p == Point(6, 7) and type(p) is Point
    assert single == 8
    assert mixed == [9, 10, "s", [11]]
    assert empty == []
    assert nested == [("g", "g.child"), {"k": ("h", "h.child")}]
    # Depth first, in order.
    assert LOG == [1, 2, 3, 4, 5, 6, 8, 9, 11, "g", "g.child", "h", "h.child"]


@coroutine
def tuple_fib(i):
    """fib yielding tuples: its first yield is taken where the call starts,
    the later ones where its body is resumed (the engine's two fast paths)."""
    if i < 2:
        return i
    a, b = yield (tuple_fib(i - 1), tuple_fib(i - 2))
    got = yield (rec(a), rec(b))
    assert type(got) is tuple
    return got[0] + got[1]


@coroutine
def tuple_shapes():
    first = yield (rec(1), grec("g"))
    second = yield (rec(2),)
    return first, second


def test_tuple_yields_of_calls_resume_with_tuples_on_every_path():
    t, out = start(tuple_fib, 10)
    assert returned(out) == 55
    assert t.stack == []
    _t, out = start(tuple_shapes)
    first, second = returned(out)
    # The same shapes as dask.compute gives for the same tuples of Delayed.
    expect = dask.compute((dask.delayed(1), dask.delayed(("g", "g.child"))), (dask.delayed(2),))
    assert (first, second) == expect
    assert type(first) is tuple and type(second) is tuple and type(first[1]) is tuple


@coroutine
def tuple_steal_root():
    return (yield (rec("a"), rec("b"), rec("c")))


def test_tuple_yield_of_calls_is_stolen_as_a_list_is():
    idle = Idle(1)
    t, out = start(tuple_steal_root, tramp=make(idle=idle))
    assert type(out) is Submit and out.wait is False
    assert positions(out) == [("root", [2])]
    idle.n = 0
    out = t.run()
    assert LOG == ["a", "b"]
    assert type(out) is Submit and out.wait is True
    value = returned(t.resume(["c"]))
    assert value == ("a", "b", "c") and type(value) is tuple


@coroutine
def tuple_under_annotate():
    with dask.annotate(priority=5):
        return (yield (rec(1), rec(2)))


def test_tuple_yield_of_calls_under_annotate_is_remote():
    _t, out = start(tuple_under_annotate)
    assert type(out) is Submit and out.wait is True
    (frame, pos), = out.batches
    assert list(pos) == [0, 1] and frame.ann == {"priority": 5}
    assert LOG == []


@coroutine
def yields_one_delayed():
    value = yield delayed_leaf(5)
    return value * 2


def test_delayed_leaf_is_submitted_and_waited_for():
    t, out = start(yields_one_delayed)
    assert type(out) is Submit
    assert out.wait is True
    assert out.frame is t.stack[-1] is t.stack[0]
    assert positions(out) == [("root", [0])]
    ((frame, _),) = out.batches
    assert isinstance(frame.leaves[0], Delayed)
    assert frame.remote == [0]
    assert returned(t.resume([21])) == 42


@coroutine
def mixed_yield():
    return (yield [delayed_leaf("r0"), rec("i1"), delayed_leaf("r2"), rec("i3")])


def test_mixed_yield_submits_remote_first_then_runs_inline_then_waits():
    t, out = start(mixed_yield)
    # Remote leaves handed out first, without waiting, before any inline call.
    assert type(out) is Submit and out.wait is False
    assert positions(out) == [("root", [0, 2])]
    assert LOG == []
    out = t.run()
    assert LOG == ["i1", "i3"]
    # Then wait for them: nothing more to hand out.
    assert type(out) is Submit and out.wait is True
    assert out.batches == []
    assert out.frame is t.stack[0]
    assert returned(t.resume(["R0", "R2"])) == ["R0", "i1", "R2", "i3"]


# --------------------------------------------------------------------------
# promotion before waiting


@coroutine
def waits_remotely(tag):
    LOG.append(tag)
    value = yield delayed_leaf(tag)
    return value


@coroutine
def middle():
    LOG.append("middle")
    a, c = yield [waits_remotely("deep"), rec("middle-sibling")]
    return a, c


@coroutine
def top_of_promotion():
    a, b = yield [middle(), rec("root-sibling")]
    return a, b


def test_unstarted_calls_of_every_frame_promoted_before_a_wait():
    t, out = start(top_of_promotion)
    assert type(out) is Submit and out.wait is True
    names = [f.label for f in t.stack]
    assert names == ["root", "middle", "waits_remotely"]
    # The deep leaf and every unstarted sibling on the stack, oldest frame first.
    assert positions(out) == [("root", [1]), ("middle", [1]), ("waits_remotely", [0])]
    assert out.frame is t.stack[-1]
    assert LOG == ["middle", "deep"]  # the siblings never ran inline
    # The frames' names for their children's keys: (up's ident, yield, path).
    root, mid, deep = t.stack
    assert mid.ident("K") == ("K", 0, (0,))
    assert deep.ident("K") == (("K", 0, (0,)), 0, (0,))

    out = t.resume(["D"])  # the deep leaf: middle now waits for its sibling
    assert type(out) is Submit and out.wait is True and out.batches == []
    assert out.frame is mid
    out = t.resume(["MS"])
    assert type(out) is Submit and out.wait is True and out.batches == []
    assert out.frame is root
    assert returned(t.resume(["RS"])) == (("D", "MS"), "RS")
    assert LOG == ["middle", "deep"]


@coroutine
def dict_parent():
    return (yield {"x": [rec(0), waits_remotely("w")]})


def test_ident_path_of_a_nested_structure():
    t, out = start(dict_parent)
    assert type(out) is Submit
    child = t.stack[-1]
    assert child.ident("K") == ("K", 0, ("x", 1))


@coroutine
def chain(n):
    if n == 0:
        return (yield delayed_leaf("bottom"))
    return (yield chain(n - 1)) + 1


def test_deep_inline_chain_that_waits_at_the_bottom():
    """Inline frames are a list, not Python recursion: a chain deeper than
    the recursion limit runs, and the bottom frame still has a name to
    derive its children's keys from."""
    t, out = start(chain, 3000)
    assert type(out) is Submit and out.wait is True
    assert len(t.stack) == 3001
    ident = out.frame.ident("K")
    key = derive_key("leaf", ident, 0, ())
    assert key == derive_key("leaf", out.frame.ident("K"), 0, ())  # stable
    # Frames at different places have different names.
    assert out.frame.ident("K") != t.stack[-2].ident("K")
    assert returned(t.resume([0])) == 3000


# --------------------------------------------------------------------------
# stealing


@coroutine
def three():
    return (yield [rec(1), rec(2), rec(3)])


def test_idle_capacity_never_takes_the_call_about_to_run():
    # A sequential loop has one unstarted call at a time: handing it out
    # would only make the loop wait for a task. Idle capacity stays unused.
    idle = Idle(1)
    _, out = start(yields_one_by_one, rec, 300, tramp=make(idle=idle))
    assert returned(out) == sum(range(300))
    assert LOG == list(range(300))
    assert idle.n == 1


def test_idle_capacity_steals_the_last_unstarted_call():
    idle = Idle(1)
    t, out = start(three, tramp=make(idle=idle))
    assert type(out) is Submit and out.wait is False
    assert positions(out) == [("root", [2])]
    assert LOG == []
    idle.n = 0  # the caller counts what it handed out
    out = t.run()
    assert LOG == [1, 2]
    assert type(out) is Submit and out.wait is True and out.batches == []
    assert returned(t.resume(["three"])) == [1, 2, "three"]


IDLE = Idle(0)


@coroutine
def make_idle(n):
    IDLE.n = n  # capacity shows up while a child runs
    return "idle"


@coroutine
def steal_child(n):
    return (yield [make_idle(n), rec("c1"), rec("c2")])


@coroutine
def steal_root(n):
    return (yield [steal_child(n), rec("r1"), rec("r2")])


@coroutine
def idle_at_the_end():
    IDLE.n = 1  # capacity shows up while the first half's last call runs
    return "first"


@coroutine
def second_half():
    return (yield [rec("a"), rec("b")])


@coroutine
def halves():
    return (yield [idle_at_the_end(), second_half()])


def test_a_look_that_found_nothing_looks_again_at_the_next_yield_of_calls():
    # Capacity shows up when the only unstarted call is the one about to run
    # (second_half): nothing to hand out. The yield that call makes has
    # calls to hand out, and one is, however few calls ran since.
    IDLE.n = 0
    t, out = start(halves, tramp=make(idle=IDLE))
    assert type(out) is Submit and out.wait is False
    assert positions(out) == [("second_half", [1])]
    assert LOG == []
    IDLE.n = 0
    out = t.run()
    assert LOG == ["a"]
    assert type(out) is Submit and out.wait is True and out.batches == []
    assert returned(t.resume(["B"])) == ["first", ["a", "B"]]


@pytest.mark.parametrize(
    "n, expected",
    [
        (1, [("root", [2])]),  # the oldest frame's last unstarted call
        (2, [("root", [1, 2])]),
        (3, [("root", [1, 2]), ("steal_child", [2])]),
    ],
)
def test_stealing_takes_oldest_frames_first(n, expected):
    IDLE.n = 0
    t, out = start(steal_root, n, tramp=make(idle=IDLE))
    assert type(out) is Submit and out.wait is False
    assert positions(out) == expected
    stolen = {(name, p) for name, ps in expected for p in ps}
    IDLE.n = 0
    values = {("root", 1): "R1", ("root", 2): "R2", ("steal_child", 2): "C2"}
    while True:
        out = (
            t.run()
            if out.wait is False
            else t.resume([values[(out.frame.label, p)] for p in out.frame.remote])
        )
        if type(out) is Done:
            break
        assert type(out) is Submit and out.batches == []
    child, r1, r2 = returned(out)
    assert child == ["idle", "c1", "C2" if ("steal_child", 2) in stolen else "c2"]
    assert r1 == ("R1" if ("root", 1) in stolen else "r1")
    assert r2 == "R2"
    # What was stolen never ran here.
    ran = set(LOG)
    assert ("c2" in ran) == (("steal_child", 2) not in stolen)
    assert ("r1" in ran) == (("root", 1) not in stolen)
    assert "r2" not in ran


# --------------------------------------------------------------------------
# errors


@coroutine
def catches(bad):
    try:
        yield [rec("first"), bad, rec("later")]
    except (ValueError, KeyError) as e:
        return type(e), e.args
    return "unreachable"


@pytest.mark.parametrize(
    "make_bad, etype",
    [
        (lambda: boom("b"), ValueError),  # a plain function raising
        (lambda: gen_boom_before_yield("b"), KeyError),  # before its first yield
        (lambda: gen_boom_after_yield("b"), ValueError),  # after a yield of its own
    ],
    ids=["plain", "generator-before-yield", "generator-after-yield"],
)
def test_child_error_raised_at_parent_yield_later_siblings_never_start(make_bad, etype):
    _t, out = start(catches, make_bad())
    assert returned(out) == (etype, ("b",))
    assert "later" not in LOG
    assert LOG[0] == "first"


@coroutine
def uncaught():
    yield [rec("first"), boom("x"), rec("later")]
    return "unreachable"


def test_uncaught_child_error_ends_the_root_with_it():
    _t, out = start(uncaught)
    error = raised(out)
    assert type(error) is ValueError and str(error) == "x"
    assert LOG == ["first", "boom x"]


@coroutine
def passes_through():
    value = yield boom("deep")
    return value


@coroutine
def catches_two_levels_up():
    try:
        yield [passes_through(), rec("later")]
    except ValueError as e:
        return str(e)


def test_error_crosses_a_frame_that_does_not_catch_it():
    _t, out = start(catches_two_levels_up)
    assert returned(out) == "deep"
    assert "later" not in LOG


@coroutine
def body_raises_after_resume():
    yield [rec(1)]
    raise RuntimeError("root failed")


def test_root_raising_after_an_inline_yield():
    _t, out = start(body_raises_after_resume)
    error = raised(out)
    assert type(error) is RuntimeError and str(error) == "root failed"


@coroutine
def catches_remote_error():
    try:
        yield [delayed_leaf(1), rec("inline")]
    except OSError as e:
        caught = str(e)
    after = yield rec("after")
    return caught, after


def test_remote_error_thrown_at_the_yield():
    t, out = start(catches_remote_error)
    assert type(out) is Submit and out.wait is False
    out = t.run()
    assert type(out) is Submit and out.wait is True
    assert returned(t.throw(OSError("remote failed"))) == ("remote failed", "after")


@coroutine
def bad_yield(handle):
    try:
        yield [rec("valid"), {1, 2}]
    except BadYieldError as e:
        if handle:
            return type(e), str(e)
        raise
    return "unreachable"


@coroutine
def catches_child_bad_yield():
    try:
        yield bad_yield(False)
    except TypeError as e:
        return type(e)


def test_bad_yield_raises_at_the_yield():
    _t, out = start(bad_yield, True)
    etype, msg = returned(out)
    assert etype is BadYieldError
    assert "'root'" in msg and "position [1]" in msg and "yield #0" in msg
    assert LOG == []  # nothing of that yield ran
    # In an inline child: raised at its yield, then at its parent's.
    _t, out = start(catches_child_bad_yield)
    assert returned(out) is BadYieldError
    assert LOG == []


# --------------------------------------------------------------------------
# close, cancelled


@coroutine
def closing(depth):
    try:
        if depth == 0:
            value = yield delayed_leaf("wait here")
        else:
            value = yield [closing(depth - 1), rec(f"sibling {depth}")]
        return value
    finally:
        LOG.append(f"finally {depth}")


def test_close_runs_finally_blocks_innermost_first():
    t, out = start(closing, 2)
    assert type(out) is Submit and out.wait is True
    assert len(t.stack) == 3
    assert t.close() == []
    assert LOG == ["finally 0", "finally 1", "finally 2"]
    assert t.stack == []


@coroutine
def finally_raises():
    try:
        yield delayed_leaf(1)
    finally:
        raise RuntimeError("cleanup failed")


@coroutine
def over_finally_raises():
    try:
        yield finally_raises()
    finally:
        LOG.append("outer finally")


def test_close_reports_what_finally_blocks_raise_and_goes_on():
    t, out = start(over_finally_raises)
    assert type(out) is Submit
    errors = t.close()
    assert [type(e) for e in errors] == [RuntimeError]
    assert LOG == ["outer finally"]


@coroutine
def many(n):
    try:
        return (yield [rec(i) for i in range(n)])
    finally:
        LOG.append("finally")


def test_cancelled_stops_after_check_every_calls():
    asked = []

    def cancelled():
        asked.append(len(LOG))
        return True

    t, out = start(many, 20, tramp=make(cancelled=cancelled, check_every=4))
    assert type(out) is Stopped
    assert asked == [3]  # asked once, before the 4th call
    assert LOG == [0, 1, 2]
    t.close()
    assert LOG[-1] == "finally"


def test_not_cancelled_runs_to_the_end_asking_now_and_then():
    asked = []
    _t, out = start(
        many, 20, tramp=make(cancelled=lambda: asked.append(1) or False, check_every=4)
    )
    assert returned(out) == list(range(20))
    assert len(asked) == 5


# --------------------------------------------------------------------------
# compute once; which calls run inline


@coroutine
def same_call_twice():
    c = rec("once")
    a, b = yield [c, c]
    again = yield c
    more = yield {"x": c}
    return a, b, again, more, c


def test_same_call_object_computed_once():
    _t, out = start(same_call_twice)
    a, b, again, more, c = returned(out)
    assert (a, b, again, more) == ("once", "once", "once", {"x": "once"})
    assert LOG == ["once"]
    assert c.__dask_coro_done__ == ("once",)
    # Passed into a lazy call afterwards: its value, not a recomputation.
    assert dask.delayed(lambda v: v + "!")(c).compute(scheduler="sync") == "once!"
    assert LOG == ["once"]


@coroutine
def generator_call_reused():
    c = grec("g")
    first = yield c
    second = yield [c, grec("h")]
    return first, second


def drive(t, out, value_of):
    """Run to the end as the runner would: build the keys of what is handed
    out (the runner plans them), answer each wait with ``value_of(leaf)``."""
    while type(out) is Submit:
        for frame, ps in out.batches:
            for p in ps:
                frame.leaves[p].key
        if out.wait:
            out = t.resume([value_of(out.frame.leaves[p]) for p in out.frame.remote])
        else:
            out = t.run()
    return out


@coroutine
def same_waiting_call_twice():
    c = waits_remotely("side")
    return (yield [c, c])


def test_same_call_twice_in_one_yield_while_it_waits_runs_once():
    """The first occurrence runs inline and waits on the cluster: the second,
    unstarted, is the same call and must not be handed out to run again."""
    t, out = start(same_waiting_call_twice)
    assert type(out) is Submit
    assert ("root", [1]) not in positions(out)
    out = drive(t, out, lambda leaf: "R")
    assert returned(out) == ["R", "R"]
    assert LOG == ["side"]


@coroutine
def same_call_stolen():
    c = rec("c")
    return (yield [c, rec(1), c])


def test_same_call_twice_one_occurrence_stolen():
    """Stealing hands out the last occurrence; the first must then wait for
    that task, not run the call again (or fail to)."""
    idle = Idle(1)
    t, out = start(same_call_stolen, tramp=make(idle=idle))
    assert type(out) is Submit and positions(out) == [("root", [2])]
    stolen = out.batches[0][0].leaves[2]
    assert stolen.key  # the runner plans it: it has a key now
    idle.n = 0
    out = drive(t, t.run(), lambda leaf: "R" if leaf is stolen else "?")
    assert returned(out) == ["R", 1, "R"]
    assert LOG == [1]


def test_generator_call_reused_after_it_ran():
    _t, out = start(generator_call_reused)
    assert returned(out) == (("g", "g.child"), [("g", "g.child"), ("h", "h.child")])
    assert LOG == ["g", "g.child", "h", "h.child"]


KEYED: list = []


@coroutine(inline=False)
def never_inline(x):
    LOG.append(x)
    return x


@coroutine
def yields_keyed(kind):
    if kind == "key":
        c = rec("asked")
        KEYED.append(c.key)  # somebody asked for its key
    elif kind == "name":
        c = rec("named", dask_key_name="my-name")
    elif kind == "delayed-arg":
        c = rec(dask.delayed(1))
    elif kind == "delayed-kwarg":
        c = rec(x=dask.delayed(1))
    elif kind == "list-arg":
        c = rec([1, 2])
    elif kind == "lazy-call-arg":
        c = rec(rec("inner"))
    elif kind == "inline-false":
        c = never_inline("no")
    elif kind == "annotated":
        with dask.annotate(priority=5):
            c = rec("annotated")
    value = yield [c, rec("inline")]
    return value


@pytest.mark.parametrize(
    "kind",
    [
        "key",
        "name",
        "delayed-arg",
        "delayed-kwarg",
        "list-arg",
        "lazy-call-arg",
        "inline-false",
        "annotated",
    ],
)
def test_calls_that_are_remote(kind):
    t, out = start(yields_keyed, kind)
    assert type(out) is Submit and out.wait is False
    assert positions(out) == [("root", [0])]
    assert LOG == []
    out = t.run()
    assert LOG == ["inline"]
    assert type(out) is Submit and out.wait is True
    assert returned(t.resume(["R"])) == ["R", "inline"]


@coroutine
def plain_kwargs():
    return (
        yield [
            rec(x=1),
            rec(x=2.5),
            rec(x="s"),
            rec(x=b"b"),
            rec(x=True),
            rec(x=None),
            rec(x=1j),
        ]
    )


def test_plain_arguments_and_kwargs_run_inline():
    _t, out = start(plain_kwargs)
    assert returned(out) == [1, 2.5, "s", b"b", True, None, 1j]
    assert LOG == [1, 2.5, "s", b"b", True, None, 1j]


@coroutine
def arg_of_lazy_call_later():
    c = rec("arg")
    d = dask.delayed(str.upper)(c)  # c's key is needed now: c is a task
    return (yield [c, d])


def test_call_passed_into_another_lazy_call_is_remote():
    _t, out = start(arg_of_lazy_call_later)
    assert type(out) is Submit
    assert positions(out) == [("root", [0, 1])]
    assert LOG == []


# --------------------------------------------------------------------------
# ended


def test_ended_holds_only_frames_with_an_ext():
    t, out = start(top_of_promotion, scope="root-scope")
    frames = list(t.stack)
    while type(out) is Submit:
        for frame, _ in out.batches:
            if frame.scope is None:
                frame.scope = f"scope of {frame.label}"  # as the runner does
        assert all(f.scope is not None for f in t.ended)
        out = t.resume([f"v{p}" for p in out.frame.remote]) if out.wait else t.run()
    returned(out)
    assert t.ended
    assert all(f.scope is not None for f in t.ended)
    assert {f.label for f in t.ended} <= {f.label for f in frames}
    assert frames[0] in t.ended


def test_ended_excludes_frames_run_only_inline():
    t, out = start(shapes, scope="root-scope")
    returned(out)
    assert t.ended and all(f.scope == "root-scope" for f in t.ended)
    t, out = start(shapes, scope=None)
    returned(out)
    assert t.ended == []


# --------------------------------------------------------------------------
# async bodies


@coroutine
async def async_parent():
    single = await rec("single")
    many = await dask_coro.gather({"a": rec(1), "b": [grec("g")]})
    try:
        await dask_coro.gather([rec("first"), boom("async"), rec("later")])
    except ValueError as e:
        caught = str(e)
    remote = await waits_remotely("remote")
    return single, many, caught, remote


def test_async_bodies_inline_the_same_way():
    t, out = start(async_parent)
    assert type(out) is Submit and out.wait is True
    assert positions(out) == [("waits_remotely", [0])]
    assert returned(t.resume(["R"])) == (
        "single",
        {"a": 1, "b": [("g", "g.child")]},
        "async",
        "R",
    )
    assert "later" not in LOG


# --------------------------------------------------------------------------
# local mode


@coroutine
def local_parent():
    mine = current_key()
    child = yield [local_child(), fib(5)]
    return mine, child


@coroutine
def local_child():
    return current_key()


@pytest.mark.inline
def test_local_mode_results_errors_and_compute_once():
    """Without a distributed client (``scheduler="sync"``): the same results,
    exceptions and compute-once as on a cluster, with inline on."""
    assert dask.config.get("coro.inline.enabled") is True
    assert fib(12).compute(scheduler="sync") == 144
    assert afib(10).compute(scheduler="sync") == 55
    assert catches_two_levels_up().compute(scheduler="sync") == "deep"
    assert "later" not in LOG
    with pytest.raises(ValueError, match=r"^x$"):
        uncaught().compute(scheduler="sync")
    LOG.clear()
    a, b, again, more, _c = same_call_twice().compute(scheduler="sync")
    assert (a, b, again, more) == ("once", "once", "once", {"x": "once"})
    assert LOG == ["once"]
    mine, (child, f5) = local_parent(dask_key_name="local-root").compute(
        scheduler="sync"
    )
    assert mine == "local-root"
    assert f5 == 5
    # Inline (the root's key) or a task of its own (a key derived from it).
    assert child == "local-root" or child[:-17] == derive_key("local_child", "local-root", 0, (0,))


@pytest.mark.inline
def test_local_mode_same_waiting_call_twice_runs_once():
    assert same_waiting_call_twice().compute(scheduler="sync") == ["side", "side"]
    assert LOG == ["side"]


# --------------------------------------------------------------------------
# A call keeps its outcome; stop before the next call


@coroutine
def fails_once(tag):
    LOG.append(tag)
    if LOG.count(tag) == 1:
        raise ValueError(tag)
    return tag


@coroutine
def yields_a_failed_call_again():
    c = fails_once("x")
    got = []
    for _ in range(2):
        try:
            got.append((yield c))
        except ValueError as e:
            got.append(repr(e))
    return got


def test_a_call_that_raised_inline_keeps_its_error():
    _, out = start(yields_a_failed_call_again)
    assert returned(out) == ["ValueError('x')"] * 2
    assert LOG == ["x"]  # run once


def test_a_graph_built_on_a_call_that_raised_raises_its_error():
    c = fails_once("y")
    _, out = start(yields_one_call, c)
    assert type(raised(out)) is ValueError
    # Its task (a dependent's input) raises the same error, without a rerun.
    with pytest.raises(ValueError, match="y"):
        dask.compute(c, scheduler="sync")
    assert LOG == ["y"]


@coroutine
def yields_one_call(c):
    return (yield c)


def test_stop_is_read_before_every_inline_call():
    t = make()
    calls = []

    @coroutine
    def leaf(i):
        calls.append(i)
        if i == 2:
            t.stop = True  # as the worker runner sets it, from another thread
        return i

    @coroutine
    def many():
        for i in range(1000):
            yield leaf(i)

    out = t.start(many.__wrapped__, (), {}, "root-scope")
    assert type(out) is Stopped
    assert calls == [0, 1, 2]
    assert t.close() == []


def test_paused_run_goes_on_with_the_call_that_was_next():
    """A stop the caller clears is a pause (the worker runner gives the
    thread to an older tree's step): ``run()`` goes on with the next inline
    call, every call run once, in order, in every kind of yield."""
    t = make()
    calls = []

    @coroutine
    def leaf(i):
        calls.append(i)
        if i % 3 == 2:
            t.stop = True  # a pause asked for from another thread
        return i

    @coroutine
    def pair(i):
        a, b = yield [leaf(i), leaf(i + 1)]
        return a + b

    @coroutine
    def many():
        total = 0
        for i in range(0, 12, 2):
            total += yield pair(i)
        more = yield {"x": leaf(100), "y": [leaf(101), leaf(102)]}
        return total, more

    out = t.start(many.__wrapped__, (), {}, "root-scope")
    stops = 0
    while type(out) is Stopped:
        stops += 1
        t.stop = False
        out = t.run()
    assert returned(out) == (sum(range(12)), {"x": 100, "y": [101, 102]})
    assert calls == [*range(12), 100, 101, 102]
    assert stops == 5  # after leaf 2, 5, 8, 11 and 101 (read before the next call)


# --------------------------------------------------------------------------
# values computed in place, and the calls they need, handed out


@coroutine
def pair_logged():
    LOG.append("pair")
    yield []
    return (40, 2)


@coroutine
def item_and_call():
    c = pair_logged()
    return (yield [c[0], c])


@coroutine
def sums(n):
    return (yield sum(rec(i) for i in range(n)))


def _in_place(idle):
    from dask_coro.core.scope import Scope
    from dask_coro.runtime.inplace import localizer

    def scope_of(frame):
        if frame.scope is None:
            frame.scope = Scope(frame.ident("root"))
        return frame.scope

    return trampoline(
        "root", inline=True, idle=idle, cancelled=lambda: False, localize=localizer(scope_of, None)
    )


def _handed(out):
    return [(f.label, p, [type(f.leaves[i]).__name__ for i in p]) for f, p in out.batches]


def test_a_value_computed_in_place_whose_call_was_handed_out_is_handed_out_too():
    """``yield [c[0], c]`` with idle capacity: ``c`` goes out as a task;
    ``c[0]``, next, would run ``c`` again in place: it goes out too (planned
    on ``c``'s key), and ``c``'s body never runs here."""
    t = _in_place(Idle(1 << 20))
    out = t.start(item_and_call.__wrapped__, (), {}, None)
    assert type(out) is Submit and not out.wait
    assert _handed(out) == [("root", [1], ["CoroutineCall"])]
    for frame, positions in out.batches:
        for p in positions:
            frame.leaves[p].key  # planned: the call has a key now
    out = t.run()
    assert type(out) is Submit and out.wait
    assert _handed(out) == [("root", [0], ["LocalCall"])]
    assert LOG == []


def test_calls_of_a_value_computed_in_place_are_still_stolen():
    # Needed by nothing else on the stack, they go out from its own frame.
    t = _in_place(Idle(1))
    out = t.start(sums.__wrapped__, (5,), {}, None)
    assert type(out) is Submit and not out.wait
    assert _handed(out) == [("evaluate", [4], ["CoroutineCall"])]


# --------------------------------------------------------------------------
# context variables: each call in a context of its own, the loop in the run's


CV: contextvars.ContextVar[str] = contextvars.ContextVar("dask_coro_test_inline", default="unset")


@coroutine
def cv_sets(x):
    CV.set(x)
    return CV.get()


@coroutine
def cv_sets_at_once(x):
    CV.set(x)
    return CV.get()
    yield  # a generator body that returns at its first step


@coroutine
def cv_reads():
    return CV.get()


@coroutine
def cv_sets_then_yields(x):
    CV.set(x)
    got = yield [cv_reads(), cv_sets(x + "-child"), cv_reads()]
    return CV.get(), got


@coroutine
def cv_sets_after_a_yield(x):
    before = yield [cv_reads()]
    CV.set(x)
    return before, CV.get()


def _cv_sets_then_waits(x):
    CV.set(x)
    got = dask_coro.result([cv_reads(), cv_sets(x + "-child"), cv_reads()])
    return CV.get(), got


@coroutine
def cv_sets_then_waits(x):
    return _cv_sets_then_waits(x)  # from a plain helper: the call parks in wait()


@coroutine
def cv_parent():
    CV.set("parent")
    first = yield [cv_sets("a"), cv_reads(), cv_sets_at_once("g"), cv_reads(), cv_sets_then_yields("b"),
                   cv_reads(), cv_sets_then_waits("c"), cv_reads(), cv_sets("d")]
    second = yield [cv_reads(), cv_sets_then_yields("e"), cv_sets_after_a_yield("h"), cv_reads()]
    CV.set("parent-again")  # the root's own, between two yields: its children see it
    third = yield (cv_reads(), cv_sets("f"), cv_reads())
    return first, second, third, CV.get()


CV_WANT = (
    ["a", "parent", "g", "parent", ("b", ["b", "b-child", "b"]), "parent", ("c", ["c", "c-child", "c"]), "parent",
     "d"],
    ["parent", ("e", ["e", "e-child", "e"]), (["parent"], "h"), "parent"],
    ("parent-again", "f", "parent-again"),
    "parent-again",
)


def test_a_context_variable_a_call_sets_reaches_neither_its_parent_nor_its_siblings():
    """Steps that change nothing share one copy of the parent's context; a
    call that sets a variable (before a yield, or before it waits in a plain
    helper) keeps it from step to step, and its next sibling starts again
    from the parent's."""
    out = contextvars.copy_context().run(lambda: start(cv_parent)[1])  # the root's sets stay there
    assert returned(out) == CV_WANT


def test_the_loop_leaves_its_caller_in_the_context_it_was_called_in():
    """The root steps in the context the run was started in, and keeps what
    it set there; nothing its calls set reaches it; when the run is done the
    caller is back in that very context (a ``Context.run`` around the run
    exits cleanly); in a thread that had no context before, the run's is
    the one its loop's greenlet makes."""
    before = CV.get()
    ctx = contextvars.copy_context()
    out = ctx.run(lambda: start(cv_parent)[1])
    assert returned(out) == CV_WANT
    assert ctx.get(CV) == "parent-again"
    assert CV.get() == before
    got = []
    thread = threading.Thread(target=lambda: got.append(returned(start(cv_parent)[1])))
    thread.start()
    thread.join()
    assert got == [CV_WANT]
