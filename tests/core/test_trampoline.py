"""Trampoline: step generator, async and plain bodies (tests of the former Driver).

The engine answers ``Submit`` (compute the top frame's remote leaves and
resume) or ``Done`` (``Returned`` / ``Raised``). ``Stepper`` below runs a
``Trampoline`` with nothing inline (``call_type=None``) and every non-container
object a remote leaf, and speaks the old driver's vocabulary: what a body
yielded comes back as ``Yielded(value)`` in the shape it was yielded, and
``send(value)`` answers it in that shape.
"""

from __future__ import annotations

import asyncio
import types
from functools import reduce
from operator import getitem

import pytest

from dask_coro import BadYieldError
from dask_coro.core.engine import (
    Done,
    Frame,
    Raised,
    Request,
    Returned,
    Submit,
    Trampoline,
)


class Boom(Exception):
    pass


class Foreign:
    """An awaitable of "another event loop": its __await__ yields a plain object."""

    def __init__(self, token):
        self.token = token

    def __await__(self):
        return (yield self.token)

    def __repr__(self):
        return "Foreign()"


class Yielded:
    """The body yielded ``value`` (rebuilt from the leaves the engine handed out)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return type(other) is Yielded and other.value == self.value

    def __repr__(self):
        return f"Yielded({self.value!r})"


def _all_remote(name, index):
    """Every object that is not a list, tuple or dict is a leaf to compute."""
    return lambda obj, path: True


class Stepper:
    """The old ``Driver`` interface over a ``Trampoline``."""

    def __init__(self, name="coroutine"):
        self.t = Trampoline(name, call_type=None, classify=_all_remote)
        self.root: Frame | None = None

    @property
    def done(self):
        """The root body ended (returned, raised or was closed)."""
        return self.root is None or self.root.done

    def start(self, func, args, kwargs):
        out = self.t.start(func, args, kwargs)
        self.root = self.t.stack[0] if self.t.stack else None
        return self._step(out)

    def send(self, value):
        """Answer the current yield with ``value``, in the shape yielded."""
        top = self.t.stack[-1]
        paths = [top.path(p) for p in top.remote]
        return self._step(self.t.resume([reduce(getitem, path, value) for path in paths]))

    def throw(self, error):
        return self._step(self.t.throw(error))

    def close(self):
        """What the open bodies raised while closing (a list)."""
        return self.t.close()

    def _step(self, out):
        if type(out) is Done:
            assert not self.t.stack
            return out.step
        assert type(out) is Submit, out
        # Nothing runs inline: every yield waits, and hands out all its leaves.
        top = self.t.stack[-1]
        assert out.wait and out.frame is top
        assert out.batches == [(top, list(range(len(top.leaves))))]
        assert list(top.remote) == list(range(len(top.leaves)))
        return Yielded(top.shape.rebuild(top.leaves))


def value_of(step):
    """The value of a ``Returned`` step."""
    assert type(step) is Returned, step
    return step.value


def error_of(step):
    """The error of a ``Raised`` step."""
    assert type(step) is Raised, step
    return step.error


# --- generator bodies --------------------------------------------------------



def started(body, *args, **kwargs):
    """A Stepper that started ``body`` (its first step taken)."""
    d = Stepper()
    d.start(body, args, kwargs)
    return d

def test_generator_start_then_send_returns():
    def body(x):
        y = yield x + 1
        return y * 2

    d = Stepper("body")
    assert d.start(body, (1,), {}) == Yielded(2)
    assert d.done is False
    assert value_of(d.send(21)) == 42
    assert d.done is True


def test_generator_kwargs_and_several_yields():
    def body(a, *, b):
        seen = []
        seen.append((yield a))
        seen.append((yield b))
        return seen

    d = Stepper()
    assert d.start(body, ("A",), {"b": "B"}) == Yielded("A")
    assert d.send(1) == Yielded("B")
    assert value_of(d.send(2)) == [1, 2]


def test_generator_that_returns_without_yielding():
    def body():
        return "done"
        yield  # pragma: no cover - makes this a generator

    d = Stepper()
    assert value_of(d.start(body, (), {})) == "done"
    assert d.done is True


def test_throw_caught_by_body():
    def body():
        try:
            yield "first"
        except Boom as e:
            got = yield f"caught {e}"
            return got

    d = Stepper()
    assert d.start(body, (), {}) == Yielded("first")
    assert d.throw(Boom("x")) == Yielded("caught x")
    assert value_of(d.send("after")) == "after"


def test_throw_caught_and_return():
    def body():
        try:
            yield 1
        except Boom:
            return "recovered"

    d = started(body)
    assert value_of(d.throw(Boom())) == "recovered"
    assert d.done is True


def test_throw_uncaught_is_raised_with_same_object():
    def body():
        yield 1
        return 2  # pragma: no cover

    d = started(body)
    err = Boom("uncaught")
    step = d.throw(err)
    error = error_of(step)
    assert error is err
    assert d.done is True


def test_error_in_body_after_send_is_raised():
    def body():
        x = yield 1
        raise Boom(f"got {x}")

    d = started(body)
    step = d.send(5)
    error = error_of(step)
    assert type(error) is Boom
    assert str(error) == "got 5"


def test_base_exception_is_captured_not_raised():
    class MyBase(BaseException):
        pass

    def body():
        yield 1
        raise MyBase("base")

    d = started(body)
    step = d.send(None)
    error = error_of(step)
    assert type(error) is MyBase


def test_close_runs_finally():
    log = []

    def body():
        try:
            yield 1
            log.append("not reached")  # pragma: no cover
        finally:
            log.append("finally")

    d = Stepper()
    assert d.start(body, (), {}) == Yielded(1)
    assert log == []
    assert d.close() == []
    assert log == ["finally"]
    assert d.done is True
    # Closing again does nothing.
    assert d.close() == []
    assert log == ["finally"]


def test_close_sees_generator_exit():
    log = []

    def body():
        try:
            yield 1
        except GeneratorExit:
            log.append("exit")
            raise

    d = started(body)
    assert d.close() == []
    assert log == ["exit"]


def test_close_of_body_that_yields_in_finally_is_raised_runtime_error():
    log = []

    def body():
        try:
            yield 1
        finally:
            log.append("finally")
            yield 2

    d = started(body)
    (error,) = d.close()
    assert type(error) is RuntimeError
    assert "yielded in its cleanup after it was cancelled" in str(error)
    assert "ignored GeneratorExit" in str(error.__cause__)
    assert log == ["finally"]
    assert d.done is True


def test_close_of_body_that_raises_in_finally():
    def body():
        try:
            yield 1
        finally:
            raise Boom("in finally")

    d = started(body)
    (error,) = d.close()
    assert type(error) is Boom
    assert str(error) == "in finally"
    assert d.done is True


def test_close_before_start_and_after_finish():
    # Changed by design: there is no Driver object to close before start; a
    # fresh Trampoline has no frames, and closing it closes nothing.
    t = Trampoline("fresh", call_type=None, classify=_all_remote)
    assert t.close() == []
    assert t.stack == []

    def body():
        yield 1
        return 2

    d = started(body)
    assert value_of(d.send(None)) == 2
    assert d.close() == []


def test_generator_yielding_a_request_is_unwrapped():
    # ``yield x`` and ``await gather(x)`` look the same to the engine.
    def body():
        return (yield Request("payload"))

    d = Stepper()
    assert d.start(body, (), {}) == Yielded("payload")
    assert value_of(d.send(3)) == 3


# --- StopIteration semantics --------------------------------------------------


def test_return_value_travels_in_stop_iteration():
    def body():
        yield 1
        return {"v": 1}

    d = started(body)
    step = d.send(None)
    assert value_of(step) == {"v": 1}


def test_stop_iteration_raised_in_generator_becomes_runtime_error():
    def body():
        yield 1
        raise StopIteration("leak")

    d = started(body)
    step = d.send(None)
    error = error_of(step)
    assert type(error) is RuntimeError
    assert "generator raised StopIteration" in str(error)
    assert type(error.__cause__) is StopIteration


def test_stop_iteration_thrown_and_caught_by_body():
    def body():
        try:
            yield 1
        except StopIteration as e:
            return f"caught {e}"

    d = started(body)
    assert value_of(d.throw(StopIteration("thrown"))) == "caught thrown"


def test_stop_iteration_thrown_and_uncaught_is_raised_as_is():
    # Regression: "throw uncaught -> Raised with the same exception object" holds for
    # every exception but StopIteration: PEP 479 turns it into RuntimeError
    # when it leaves the body, so a child's StopIteration fails the parent with
    # "generator raised StopIteration" instead of the child's own error.
    def body():
        yield 1

    d = started(body)
    err = StopIteration("thrown")
    step = d.throw(err)
    error = error_of(step)
    assert error is err


def test_stop_iteration_thrown_into_async_and_uncaught_is_raised_as_is():
    # Regression: as above, for async bodies ("coroutine raised StopIteration").
    async def body():
        await Request(1)

    d = started(body)
    err = StopIteration("thrown")
    step = d.throw(err)
    error = error_of(step)
    assert error is err


def test_stop_iteration_from_plain_function_is_raised_not_returned():
    def body():
        raise StopIteration("plain")

    d = Stepper()
    step = d.start(body, (), {})
    error = error_of(step)
    assert type(error) is StopIteration
    assert error.args == ("plain",)


# --- async bodies -------------------------------------------------------------


def test_async_await_request():
    async def body(x):
        a = await Request(x)
        b = await Request([a, a])
        return a, b

    d = Stepper("body")
    assert d.start(body, (7,), {}) == Yielded(7)
    assert d.send(8) == Yielded([8, 8])
    # The answer comes in the shape yielded: one value per leaf.
    assert value_of(d.send(["b", "c"])) == (8, ["b", "c"])
    assert d.done is True


def test_async_without_await_returns():
    async def body():
        return 5

    d = Stepper()
    assert value_of(d.start(body, (), {})) == 5


def test_async_raises_before_await():
    async def body():
        raise Boom("early")

    d = Stepper()
    step = d.start(body, (), {})
    error = error_of(step)
    assert type(error) is Boom


def test_async_nested_native_coroutine_passes_request_through():
    async def helper(v):
        return (await Request(v)) + 1

    async def body():
        return await helper("x")

    d = Stepper()
    assert d.start(body, (), {}) == Yielded("x")
    assert value_of(d.send(1)) == 2


def test_async_throw_caught_and_uncaught():
    async def body():
        try:
            await Request(1)
        except Boom:
            await Request(2)
        await Request(3)

    d = started(body)
    assert d.throw(Boom()) == Yielded(2)
    err = Boom("second")
    step = d.throw(err)
    error = error_of(step)
    assert error is err


def test_async_close_runs_finally():
    log = []

    async def body():
        try:
            await Request(1)
        finally:
            log.append("finally")

    d = started(body)
    assert d.close() == []
    assert log == ["finally"]


def test_async_foreign_awaitable_uncaught():
    async def body():
        await Foreign(object())
        return "not reached"  # pragma: no cover

    d = Stepper("myco")
    step = d.start(body, (), {})
    error = error_of(step)
    assert type(error) is BadYieldError
    assert isinstance(error, TypeError)
    assert "coroutine 'myco' awaited" in str(error)
    assert "only an asyncio event loop can wait for" in str(error)
    assert d.done is True


def test_async_foreign_awaitable_caught_by_body():
    token = object()
    log = []

    async def body():
        try:
            await Foreign(token)
        except BadYieldError as e:
            log.append(str(e))
        return await Request("next")

    d = Stepper("myco")
    assert d.start(body, (), {}) == Yielded("next")
    assert len(log) == 1
    assert repr(token) in log[0]
    assert value_of(d.send(9)) == 9


def test_async_foreign_awaitable_caught_repeatedly():
    async def body():
        n = 0
        for _ in range(3):
            try:
                await Foreign(None)
            except BadYieldError:
                n += 1
        return n

    d = Stepper()
    assert value_of(d.start(body, (), {})) == 3


def test_async_awaiting_asyncio_future_raises_bad_yield():
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()

        async def body():
            try:
                await fut
            except BadYieldError as e:
                return f"caught: {e}"

        d = Stepper("futco")
        step = d.start(body, (), {})
        assert value_of(step).startswith("caught: coroutine 'futco' awaited <Future pending")
    finally:
        loop.close()


def test_async_awaiting_asyncio_sleep0_raises_bad_yield():
    # asyncio.sleep(0) yields a bare None to "its" event loop.
    async def body():
        await asyncio.sleep(0)

    d = Stepper("sleeper")
    step = d.start(body, (), {})
    error = error_of(step)
    assert type(error) is BadYieldError
    assert "coroutine 'sleeper' awaited None" in str(error)


def test_generator_yielding_foreign_object_is_yielded_not_rejected():
    # Only async bodies are checked by the driver; a generator's yields go to
    # the classifier.
    token = object()

    def body():
        yield token

    d = Stepper()
    assert d.start(body, (), {}) == Yielded(token)


# --- plain functions ----------------------------------------------------------


def test_plain_function_returns_immediately():
    def body(a, b=0):
        return a + b

    d = Stepper()
    assert value_of(d.start(body, (1,), {"b": 2})) == 3
    assert d.done is True
    assert d.close() == []


def test_plain_function_raising():
    err = Boom("plain")

    def body():
        raise err

    d = Stepper()
    step = d.start(body, (), {})
    error = error_of(step)
    assert error is err
    assert d.done is True


def test_plain_function_returning_none():
    d = Stepper()
    assert value_of(d.start(lambda: None, (), {})) is None


def test_plain_function_returning_generator_object_is_stepped_into():
    def gen():
        yield "inner"
        return "end"

    def body():
        return gen()

    d = Stepper()
    assert d.start(body, (), {}) == Yielded("inner")
    assert value_of(d.send(None)) == "end"


def test_step_types_are_slotted_and_print_their_value():
    # Changed by design: Returned / Raised / Done / Submit / Request are made
    # per yield or per run and compare by identity (no __eq__); the old
    # driver's Yielded step is gone (the engine answers Submit).
    steps = [
        Returned(1),
        Raised(ValueError()),
        Done(Returned(1)),
        Submit([], True, None),
        Request(1),
    ]
    for step in steps:
        assert not hasattr(step, "__dict__")  # slotted: one is made per call
        with pytest.raises(AttributeError):
            step.other = 2  # type: ignore[attr-defined]
    assert repr(Returned([1])) == "Returned([1])"
    assert repr(Raised(ValueError("x"))) == "Raised(ValueError('x'))"
    out = Trampoline("plain", call_type=None, classify=_all_remote).start(lambda: 1, (), {})
    assert type(out) is Done
    assert value_of(out.step) == 1


def test_request_repr_and_await():
    r = Request([1])
    assert repr(r) == "gather([1])"
    it = r.__await__()
    assert isinstance(it, types.GeneratorType)
    assert next(it) is r
    with pytest.raises(StopIteration) as info:
        it.send("res")
    assert info.value.value == "res"
