"""Driver: step generator, async and plain bodies -> Yielded / Returned / Raised."""

from __future__ import annotations

import asyncio
import types

import pytest

from dask_coro import BadYieldError
from dask_coro.core.driver import Driver, Raised, Request, Returned, Yielded


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


# --- generator bodies --------------------------------------------------------


def test_generator_start_then_send_returns():
    def body(x):
        y = yield x + 1
        return y * 2

    d = Driver("body")
    assert d.start(body, (1,), {}) == Yielded(2)
    assert d.done is False
    assert d.send(21) == Returned(42)
    assert d.done is True


def test_generator_kwargs_and_several_yields():
    def body(a, *, b):
        seen = []
        seen.append((yield a))
        seen.append((yield b))
        return seen

    d = Driver()
    assert d.start(body, ("A",), {"b": "B"}) == Yielded("A")
    assert d.send(1) == Yielded("B")
    assert d.send(2) == Returned([1, 2])


def test_generator_that_returns_without_yielding():
    def body():
        return "done"
        yield  # pragma: no cover - makes this a generator

    d = Driver()
    assert d.start(body, (), {}) == Returned("done")
    assert d.done is True


def test_throw_caught_by_body():
    def body():
        try:
            yield "first"
        except Boom as e:
            got = yield f"caught {e}"
            return got

    d = Driver()
    assert d.start(body, (), {}) == Yielded("first")
    assert d.throw(Boom("x")) == Yielded("caught x")
    assert d.send("after") == Returned("after")


def test_throw_caught_and_return():
    def body():
        try:
            yield 1
        except Boom:
            return "recovered"

    d = Driver()
    d.start(body, (), {})
    assert d.throw(Boom()) == Returned("recovered")
    assert d.done is True


def test_throw_uncaught_is_raised_with_same_object():
    def body():
        yield 1
        return 2  # pragma: no cover

    d = Driver()
    d.start(body, (), {})
    err = Boom("uncaught")
    step = d.throw(err)
    assert type(step) is Raised
    assert step.error is err
    assert d.done is True


def test_error_in_body_after_send_is_raised():
    def body():
        x = yield 1
        raise Boom(f"got {x}")

    d = Driver()
    d.start(body, (), {})
    step = d.send(5)
    assert type(step) is Raised
    assert type(step.error) is Boom
    assert str(step.error) == "got 5"


def test_base_exception_is_captured_not_raised():
    class MyBase(BaseException):
        pass

    def body():
        yield 1
        raise MyBase("base")

    d = Driver()
    d.start(body, (), {})
    step = d.send(None)
    assert type(step) is Raised
    assert type(step.error) is MyBase


def test_close_runs_finally():
    log = []

    def body():
        try:
            yield 1
            log.append("not reached")  # pragma: no cover
        finally:
            log.append("finally")

    d = Driver()
    assert d.start(body, (), {}) == Yielded(1)
    assert log == []
    assert d.close() is None
    assert log == ["finally"]
    assert d.done is True
    # Closing again does nothing.
    assert d.close() is None
    assert log == ["finally"]


def test_close_sees_generator_exit():
    log = []

    def body():
        try:
            yield 1
        except GeneratorExit:
            log.append("exit")
            raise

    d = Driver()
    d.start(body, (), {})
    assert d.close() is None
    assert log == ["exit"]


def test_close_of_body_that_yields_in_finally_is_raised_runtime_error():
    log = []

    def body():
        try:
            yield 1
        finally:
            log.append("finally")
            yield 2

    d = Driver()
    d.start(body, (), {})
    step = d.close()
    assert type(step) is Raised
    assert type(step.error) is RuntimeError
    assert "ignored GeneratorExit" in str(step.error)
    assert log == ["finally"]
    assert d.done is True


def test_close_of_body_that_raises_in_finally():
    def body():
        try:
            yield 1
        finally:
            raise Boom("in finally")

    d = Driver()
    d.start(body, (), {})
    step = d.close()
    assert type(step) is Raised
    assert type(step.error) is Boom
    assert str(step.error) == "in finally"


def test_close_before_start_and_after_finish():
    assert Driver().close() is None

    def body():
        yield 1
        return 2

    d = Driver()
    d.start(body, (), {})
    assert d.send(None) == Returned(2)
    assert d.close() is None


def test_generator_yielding_a_request_is_unwrapped():
    # ``yield x`` and ``await gather(x)`` look the same to the driver.
    def body():
        return (yield Request("payload"))

    d = Driver()
    assert d.start(body, (), {}) == Yielded("payload")
    assert d.send(3) == Returned(3)


# --- StopIteration semantics --------------------------------------------------


def test_return_value_travels_in_stop_iteration():
    def body():
        yield 1
        return {"v": 1}

    d = Driver()
    d.start(body, (), {})
    step = d.send(None)
    assert step == Returned({"v": 1})


def test_stop_iteration_raised_in_generator_becomes_runtime_error():
    def body():
        yield 1
        raise StopIteration("leak")

    d = Driver()
    d.start(body, (), {})
    step = d.send(None)
    assert type(step) is Raised
    assert type(step.error) is RuntimeError
    assert "generator raised StopIteration" in str(step.error)
    assert type(step.error.__cause__) is StopIteration


def test_stop_iteration_thrown_and_caught_by_body():
    def body():
        try:
            yield 1
        except StopIteration as e:
            return f"caught {e}"

    d = Driver()
    d.start(body, (), {})
    assert d.throw(StopIteration("thrown")) == Returned("caught thrown")


def test_stop_iteration_thrown_and_uncaught_is_raised_as_is():
    # Regression: "throw uncaught -> Raised with the same exception object" holds for
    # every exception but StopIteration: PEP 479 turns it into RuntimeError
    # when it leaves the body, so a child's StopIteration fails the parent with
    # "generator raised StopIteration" instead of the child's own error.
    def body():
        yield 1

    d = Driver()
    d.start(body, (), {})
    err = StopIteration("thrown")
    step = d.throw(err)
    assert type(step) is Raised
    assert step.error is err


def test_stop_iteration_thrown_into_async_and_uncaught_is_raised_as_is():
    # Regression: as above, for async bodies ("coroutine raised StopIteration").
    async def body():
        await Request(1)

    d = Driver()
    d.start(body, (), {})
    err = StopIteration("thrown")
    step = d.throw(err)
    assert type(step) is Raised
    assert step.error is err


def test_stop_iteration_from_plain_function_is_raised_not_returned():
    def body():
        raise StopIteration("plain")

    d = Driver()
    step = d.start(body, (), {})
    assert type(step) is Raised
    assert type(step.error) is StopIteration
    assert step.error.args == ("plain",)


# --- async bodies -------------------------------------------------------------


def test_async_await_request():
    async def body(x):
        a = await Request(x)
        b = await Request([a, a])
        return a, b

    d = Driver("body")
    assert d.start(body, (7,), {}) == Yielded(7)
    assert d.send(8) == Yielded([8, 8])
    assert d.send("b") == Returned((8, "b"))
    assert d.done is True


def test_async_without_await_returns():
    async def body():
        return 5

    d = Driver()
    assert d.start(body, (), {}) == Returned(5)


def test_async_raises_before_await():
    async def body():
        raise Boom("early")

    d = Driver()
    step = d.start(body, (), {})
    assert type(step) is Raised
    assert type(step.error) is Boom


def test_async_nested_native_coroutine_passes_request_through():
    async def helper(v):
        return (await Request(v)) + 1

    async def body():
        return await helper("x")

    d = Driver()
    assert d.start(body, (), {}) == Yielded("x")
    assert d.send(1) == Returned(2)


def test_async_throw_caught_and_uncaught():
    async def body():
        try:
            await Request(1)
        except Boom:
            await Request(2)
        await Request(3)

    d = Driver()
    d.start(body, (), {})
    assert d.throw(Boom()) == Yielded(2)
    err = Boom("second")
    step = d.throw(err)
    assert type(step) is Raised
    assert step.error is err


def test_async_close_runs_finally():
    log = []

    async def body():
        try:
            await Request(1)
        finally:
            log.append("finally")

    d = Driver()
    d.start(body, (), {})
    assert d.close() is None
    assert log == ["finally"]


def test_async_foreign_awaitable_uncaught():
    async def body():
        await Foreign(object())
        return "not reached"  # pragma: no cover

    d = Driver("myco")
    step = d.start(body, (), {})
    assert type(step) is Raised
    assert type(step.error) is BadYieldError
    assert isinstance(step.error, TypeError)
    assert "coroutine 'myco' awaited" in str(step.error)
    assert "only an asyncio event loop can wait for" in str(step.error)
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

    d = Driver("myco")
    assert d.start(body, (), {}) == Yielded("next")
    assert len(log) == 1
    assert repr(token) in log[0]
    assert d.send(9) == Returned(9)


def test_async_foreign_awaitable_caught_repeatedly():
    async def body():
        n = 0
        for _ in range(3):
            try:
                await Foreign(None)
            except BadYieldError:
                n += 1
        return n

    d = Driver()
    assert d.start(body, (), {}) == Returned(3)


def test_async_awaiting_asyncio_future_raises_bad_yield():
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()

        async def body():
            try:
                await fut
            except BadYieldError as e:
                return f"caught: {e}"

        d = Driver("futco")
        step = d.start(body, (), {})
        assert type(step) is Returned
        assert step.value.startswith("caught: coroutine 'futco' awaited <Future pending")
    finally:
        loop.close()


def test_async_awaiting_asyncio_sleep0_raises_bad_yield():
    # asyncio.sleep(0) yields a bare None to "its" event loop.
    async def body():
        await asyncio.sleep(0)

    d = Driver("sleeper")
    step = d.start(body, (), {})
    assert type(step) is Raised
    assert type(step.error) is BadYieldError
    assert "coroutine 'sleeper' awaited None" in str(step.error)


def test_generator_yielding_foreign_object_is_yielded_not_rejected():
    # Only async bodies are checked by the driver; a generator's yields go to
    # the classifier.
    token = object()

    def body():
        yield token

    d = Driver()
    assert d.start(body, (), {}) == Yielded(token)


# --- plain functions ----------------------------------------------------------


def test_plain_function_returns_immediately():
    def body(a, b=0):
        return a + b

    d = Driver()
    assert d.start(body, (1,), {"b": 2}) == Returned(3)
    assert d.done is True
    assert d.close() is None


def test_plain_function_raising():
    err = Boom("plain")

    def body():
        raise err

    d = Driver()
    step = d.start(body, (), {})
    assert type(step) is Raised
    assert step.error is err
    assert d.done is True


def test_plain_function_returning_none():
    d = Driver()
    assert d.start(lambda: None, (), {}) == Returned(None)


def test_plain_function_returning_generator_object_is_stepped_into():
    def gen():
        yield "inner"
        return "end"

    def body():
        return gen()

    d = Driver()
    assert d.start(body, (), {}) == Yielded("inner")
    assert d.send(None) == Returned("end")


def test_step_types_compare_by_type_and_value():
    y = Yielded(1)
    assert not hasattr(y, "__dict__")  # slotted: one is made per inline call
    with pytest.raises(AttributeError):
        y.other = 2  # type: ignore[attr-defined]
    assert Yielded(1) == Yielded(1)
    assert Yielded(1) != Returned(1)
    assert Raised(ValueError) == Raised(ValueError)
    assert repr(Returned([1])) == "Returned([1])"
    assert isinstance(Driver().start(lambda: 1, (), {}), Returned)


def test_request_repr_and_await():
    r = Request([1])
    assert repr(r) == "gather([1])"
    it = r.__await__()
    assert isinstance(it, types.GeneratorType)
    assert next(it) is r
    with pytest.raises(StopIteration) as info:
        it.send("res")
    assert info.value.value == "res"
