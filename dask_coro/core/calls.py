"""What the engine needs of a call, and what a body hands it.

Pure. ``InlineCall`` is the protocol of a call object the engine may run
inline (``runtime.call.CoroutineCall`` implements it); ``NOT_DONE`` and
``Failed`` are the values such a call holds before and after it ran;
``Request`` is what ``await dask_coro.gather(x)`` yields. The engine
(``engine.py``) and its policies (``stealing.py``, ``counts.py``) share them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Generator
from typing import Any, ClassVar, Protocol

from .._exceptions import BadYieldError


class _NotDone:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_DONE"


#: ``InlineCall.__dask_coro_value__`` of a call not computed inline (yet).
NOT_DONE: Any = _NotDone()


class Failed:
    """``InlineCall.__dask_coro_value__`` of a call that raised ``error``
    inline. A computed key keeps its outcome (dask's rule, as a task's error
    stays with its key): yielding the same call again raises ``error`` again
    instead of running it again, and a graph built on the call raises it."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error

    def __repr__(self) -> str:
        return f"Failed({self.error!r})"


def fail(leaf: Any, error: BaseException) -> None:
    """Call ``leaf`` raised ``error``: its outcome, kept on it."""
    leaf.__dask_coro_value__ = Failed(error)
    leaf.__dask_coro_inline__ = None


class InlineCall(Protocol):
    """What the engine needs of a call object (``Trampoline(call_type=...)``)
    to run it inline. ``runtime.call.CoroutineCall`` implements it. Plain
    slots, no tuple: the engine reads them once per call, and making a tuple
    per call costs more than the reads (fine-grained recursion makes one
    call object per call).

    ``__dask_coro_inline__``
        What to call if the call may run here, with ``*__dask_coro_args__``
        (keyword arguments bound in a ``functools.partial``), else None: it
        has a key (compute it as a task), or it was computed inline.
    ``__dask_coro_value__``
        The value, once the call computed it inline (the engine sets it, and
        clears ``__dask_coro_inline__``), so yielding the same call object
        again reuses it; ``NOT_DONE`` before.

    Read ``__dask_coro_inline__`` first: a call that may run inline is not
    done. (A ``dask.delayed.Delayed`` has ``__getattr__``, so each read of a
    ``CoroutineCall`` slot goes through it, some 250 machine instructions.)
    """

    __dask_coro_inline__: Callable[..., Any] | None
    __dask_coro_args__: tuple[Any, ...]
    __dask_coro_value__: Any


class Request:
    """What ``await dask_coro.gather(x)`` hands to the engine: compute ``x``.

    Generators and ``async def`` bodies share one protocol: awaiting a dask_coro
    awaitable goes through ``Request.__await__``, which yields the ``Request``
    itself, so the engine sees the same thing from ``yield x`` and
    ``await gather(x)``.
    """

    __slots__ = ("value",)

    #: ``in_task(request)``: what to await instead when an asyncio ``Task``
    #: (not the engine) drives the await: a body's ``asyncio.wait_for``,
    #: ``asyncio.wait``, ``create_task``. Set by the runtime (``runtime.aio``);
    #: None: ``BadYieldError``.
    in_task: ClassVar[Callable[[Request], Any] | None] = None

    def __init__(self, value: Any):
        self.value = value

    def __await__(self) -> Generator[Any, Any, Any]:
        try:
            return (yield self)
        except RuntimeError as e:
            # Only an asyncio Task refuses a Request, throwing this error in
            # at the yield (``Task.__step``: "Task got bad yield"); the engine
            # throws a child's error in here, and never drives a Task.
            if not _refused_by_task(e):
                raise
        in_task = Request.in_task
        if in_task is None:
            raise BadYieldError(
                f"{self!r} was awaited in an asyncio Task: await dask_coro.gather(...) "
                "in the coroutine's body itself"
            )
        return (yield from in_task(self).__await__())

    def __repr__(self) -> str:
        return f"gather({self.value!r})"


def _refused_by_task(e: RuntimeError) -> bool:
    """Whether ``e`` is asyncio's refusal of a Request, thrown into a
    coroutine that an asyncio Task runs (which no body is)."""
    if not (e.args and type(e.args[0]) is str and e.args[0].startswith("Task got bad yield: gather(")):
        return False
    asyncio = sys.modules.get("asyncio")
    try:
        return asyncio is not None and asyncio.current_task() is not None
    except RuntimeError:  # no running loop
        return False


class InPlace:
    """A request to run ``fn(*args)`` here, as a call of the body that yields
    it (alone, or awaits it), whatever else the trampoline runs inline: its
    value is the yield's. A feature's own step that must share this process
    and this stack (a group's wait for its next child, ``dask_coro.group``),
    never a task. Neither handed out nor promoted: it runs as soon as it is
    yielded, so nothing can steal it, and a yield under ``dask.annotate``
    runs it here too."""

    __slots__ = ("__dask_coro_inline__", "__dask_coro_args__", "__dask_coro_value__")

    def __init__(self, fn: Callable[..., Any], *args: Any):
        self.__dask_coro_inline__: Callable[..., Any] | None = fn
        self.__dask_coro_args__ = args
        self.__dask_coro_value__: Any = NOT_DONE

    def __await__(self) -> Generator[Request, Any, Any]:
        return (yield Request(self))


def unwrap(func: Any) -> Any:
    """The function of a call with keyword arguments (a ``functools.partial``)."""
    while type(func) is functools.partial:
        func = func.func
    return func


def foreign_await(func: Any, obj: Any) -> BadYieldError:
    name = func if type(func) is str else getattr(func, "__name__", "coroutine")
    return BadYieldError(
        f"coroutine {name!r} awaited {obj!r}, which only an asyncio event loop "
        "can wait for; a dask_coro coroutine may await dask_coro.gather(...) or "
        "a coroutine call. Run asyncio code in a separate task."
    )


#: An empty position list or yield (a frame's ``remote``, ``leaves`` ...),
#: shared so that ``is EMPTY`` tells an untouched one.
EMPTY: Any = ()
