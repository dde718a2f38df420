"""Step a coroutine body: start, send, throw, close -> Step.

Pure: no dask, no distributed, no threads, no event loop. The same driver runs a
generator function (``x = yield lazy``), an ``async def`` function
(``x = await dask_coro.gather(lazy)``) and a plain function (no yield at all).

Generators and ``async def`` share one protocol: awaiting a dask_coro awaitable
goes through ``Request.__await__``, which yields the ``Request`` itself, so the
driver sees the same thing from ``yield x`` and ``await gather(x)``.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Generator
from typing import Any

from .._exceptions import BadYieldError


class Request:
    """What ``await dask_coro.gather(x)`` hands to the driver: compute ``x``."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __await__(self) -> Generator[Request, Any, Any]:
        return (yield self)

    def __repr__(self) -> str:
        return f"gather({self.value!r})"


class _Step:
    # Plain slotted classes, not frozen dataclasses: a step is made per call
    # a trampoline runs inline, and a frozen dataclass's __init__ costs 3x.
    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._field() == self._field()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), id(self._field())))  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._field()!r})"  # type: ignore[attr-defined]


class Yielded(_Step):
    """The body is suspended and asks for ``value`` to be computed."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def _field(self) -> Any:
        return self.value


class Returned(_Step):
    """The body finished with ``value``."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def _field(self) -> Any:
        return self.value


class Raised(_Step):
    """The body finished by raising ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error

    def _field(self) -> Any:
        return self.error


Step = Yielded | Returned | Raised

_BODY_TYPES = (types.GeneratorType, types.CoroutineType)


class Driver:
    """Drives one call of a coroutine function.

    Every method runs user code and returns the next ``Step``; none raises what
    the user code raised. After ``Returned`` or ``Raised`` the driver is done.
    """

    __slots__ = ("_body", "_is_async", "name", "done")

    def __init__(self, name: str = "coroutine"):
        self._body: Any = None
        self._is_async = False
        self.name = name
        self.done = False

    @property
    def label(self) -> str:
        """The body's name for messages (``name`` may be its function)."""
        name = self.name
        return name if type(name) is str else getattr(name, "__name__", "coroutine")

    def start(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Step:
        """Call ``func``; step into it if it made a generator or coroutine object."""
        try:
            result = func(*args, **kwargs)
        except BaseException as e:  # noqa: B036 - a body may raise anything
            return self._finish(Raised(e))
        if not isinstance(result, _BODY_TYPES):
            return self._finish(Returned(result))
        return self.begin(result)

    def begin(self, body: Any) -> Step:
        """Step into ``body``, the generator or coroutine object a call made."""
        self._body = body
        self._is_async = type(body) is types.CoroutineType
        return self._advance(body.send, None)

    def send(self, value: Any) -> Step:
        """Resume the body at its current yield with ``value``."""
        return self._advance(self._body.send, value)

    def throw(self, error: BaseException) -> Step:
        """Raise ``error`` inside the body at its current yield."""
        step = self._advance(self._body.throw, error)
        if (
            type(step) is Raised
            and isinstance(error, StopIteration)
            and type(step.error) is RuntimeError
            and step.error.__cause__ is error
        ):
            # PEP 479 turned the StopIteration we threw, which the body did not
            # catch, into RuntimeError; report the error itself.
            return Raised(error)
        return step

    def close(self) -> Raised | None:
        """Close a suspended body (``GeneratorExit`` at the yield, finally blocks
        run). Returns ``Raised`` if the body raised anything while closing."""
        if self.done or self._body is None:
            return None
        self.done = True
        try:
            self._body.close()
        except BaseException as e:  # noqa: B036
            return Raised(e)
        return None

    def _advance(self, method: Callable[[Any], Any], arg: Any) -> Step:
        while True:
            try:
                out = method(arg)
            except StopIteration as stop:
                return self._finish(Returned(stop.value))
            except BaseException as e:  # noqa: B036
                return self._finish(Raised(e))
            if type(out) is Request:
                return Yielded(out.value)
            if not self._is_async:
                return Yielded(out)
            # An async body awaited something foreign (an asyncio future, a
            # tornado future, ...): raise at that await, as the body would see.
            method = self._body.throw
            arg = BadYieldError(
                f"coroutine {self.label!r} awaited {out!r}, which only an asyncio "
                "event loop can wait for; a dask_coro coroutine may await "
                "dask_coro.gather(...) or a coroutine call. Run asyncio code in a "
                "separate task."
            )

    def _finish(self, step: Step) -> Step:
        self.done = True
        self._body = None
        return step
