"""``@coroutine``: a function call becomes a lazy task, as with ``dask.delayed``."""

from __future__ import annotations

import asyncio
import functools
import sys
import uuid
from collections.abc import Callable, Generator, Hashable
from typing import Any

from dask.base import tokenize
from dask.delayed import Delayed, unpack_collections
from dask.highlevelgraph import HighLevelGraph
from dask.utils import funcname

from ._classify import _Rejected, is_lazy
from ._driver import Request
from ._exceptions import DaskCoroError


def gather(x: Any) -> Request:
    """Awaitable: ``await gather(x)`` in an ``async def`` coroutine computes ``x``.

    ``x`` is anything a generator coroutine may yield (see ``coroutine``); the
    result has the same shape. In a generator coroutine, ``yield x`` does the
    same.
    """
    return Request(x)


class CoroutineCall(Delayed):
    """A lazy call of a ``@coroutine`` function: a ``dask.delayed.Delayed``.

    Everything a ``Delayed`` does works (``compute``, ``persist``, indexing,
    attribute access, arithmetic, passing into other lazy calls); in addition
    it can be awaited inside an ``async def`` coroutine.
    """

    __slots__ = ()

    def __await__(self) -> Generator[Any, Any, Any]:
        return Request(self).__await__()


class CoroutineTask:
    """The callable a coroutine call puts in the graph.

    distributed runs a task on its event loop when the task's function is a
    coroutine function (``Task.is_coro`` -> ``distributed.utils.iscoroutinefunction``,
    which honours tornado's ``__tornado_coroutine__`` flag), so a worker awaits
    what ``__call__`` returns there: the worker runner. Any other scheduler
    (threaded, sync, processes) calls it as a plain function, and it runs the
    coroutine to the end in-process. One callable, right under every scheduler,
    also when a graph mixes coroutine calls with plain ``Delayed`` objects.

    It carries its key because a task running on the event loop cannot learn
    it from distributed.
    """

    __slots__ = ("func", "key")
    __tornado_coroutine__ = True

    def __init__(self, func: Callable[..., Any], key: Hashable):
        self.func = func
        self.key = key

    def with_key(self, key: Hashable) -> CoroutineTask:
        return CoroutineTask(self.func, key)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        worker = _worker_of_event_loop()
        if worker is not None:
            ts = worker.state.tasks.get(self.key)
            if ts is not None and ts.state == "executing":
                from ._runner import run_on_worker

                return run_on_worker(self, args, kwargs)
            # Called on the loop, but not as the task the worker is executing:
            # a synchronous scheduler run from inside an async task, or a key
            # renamed by graph fusion. Never hand back an unawaited coroutine.
            raise DaskCoroError(
                f"coroutine task {self.key!r} was called on a worker's event loop "
                "but is not a task executing there; compute coroutine calls from a "
                "thread (not inside an async task), and without low-level fusion"
            )
        from ._local import run_local

        return run_local(self, args, kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        # The module names the @coroutine wrapper, not self.func, so pickle and
        # cloudpickle would copy the function, and every global it uses, by
        # value into every task. Refer to an importable wrapper by name.
        module = getattr(self.func, "__module__", None)
        qualname = getattr(self.func, "__qualname__", "")
        if module and module != "__main__" and "<locals>" not in qualname:
            wrapper: Any = sys.modules.get(module)
            for part in qualname.split("."):
                wrapper = getattr(wrapper, part, None)
            if isinstance(wrapper, CoroutineFunction) and wrapper.__wrapped__ is self.func:
                return _task_by_name, (module, qualname, self.key)
        return CoroutineTask, (self.func, self.key)

    def __dask_tokenize__(self) -> tuple[str, Hashable]:
        return ("dask_coro.CoroutineTask", self.key)

    def __repr__(self) -> str:
        return f"<coroutine {funcname(self.func)} {self.key!r}>"


def _task_by_name(module: str, qualname: str, key: Hashable) -> CoroutineTask:
    import importlib

    wrapper: Any = importlib.import_module(module)
    for part in qualname.split("."):
        wrapper = getattr(wrapper, part)
    return CoroutineTask(wrapper.__wrapped__, key)


def _worker_of_event_loop() -> Any:
    """The distributed worker whose event loop is running this code, or None."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    if sys.modules.get("distributed") is None:  # not imported, or blocked
        return None
    from distributed.worker import get_worker

    try:
        return get_worker()  # thread_state, or the ContextVar Worker.execute sets
    except ValueError:
        return None


#: Argument types that hold no dask collection (exact types: a subclass could).
_PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})


class CoroutineFunction:
    """A function decorated with ``@coroutine``; calling it returns a
    ``CoroutineCall`` and runs nothing."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        pure: bool = False,
        nout: int | None = None,
        name: str | None = None,
    ):
        if not callable(func):
            raise TypeError(f"@coroutine expects a function, got {func!r}")
        if isinstance(func, CoroutineFunction):
            func = func.__wrapped__
        functools.update_wrapper(self, func)
        self.pure = pure
        self.nout = nout
        self.prefix = name or funcname(func)

    def __call__(self, *args: Any, **kwargs: Any) -> CoroutineCall:
        key = kwargs.pop("dask_key_name", None)
        if key is None:
            if self.pure:
                key = f"{self.prefix}-{tokenize(self.__wrapped__, args, kwargs)}"
            else:
                key = f"{self.prefix}-{uuid.uuid4().hex}"
        from dask._task_spec import Task

        args2 = []
        deps: list[Any] = []
        for a in args:
            if type(a) in _PLAIN:  # most arguments; unpacking them is 60% of a call
                args2.append(a)
                continue
            a2, collections = unpack_collections(a)
            args2.append(a2)
            deps.extend(collections)
        kwargs2: Any = {}
        if kwargs:
            kwargs2, collections = unpack_collections(kwargs)
            deps.extend(collections)
        task = Task(key, CoroutineTask(self.__wrapped__, key), *args2, **kwargs2)
        graph = HighLevelGraph.from_collections(key, {key: task}, dependencies=deps)
        return CoroutineCall(key, graph, length=self.nout)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return functools.partial(self, instance)

    def __repr__(self) -> str:
        return f"<dask_coro.coroutine {self.prefix}>"


def coroutine(
    func: Callable[..., Any] | None = None,
    *,
    pure: bool = False,
    nout: int | None = None,
    name: str | None = None,
) -> Any:
    """Make a function a coroutine task.

    Calling the decorated function returns a lazy ``CoroutineCall`` (a dask
    ``Delayed``) and runs nothing. When it runs, the body may be:

    - a generator: ``a, b = yield [f(1), f(2)]`` computes what was yielded and
      resumes with results of the same shape;
    - an ``async def``: ``a, b = await dask_coro.gather([f(1), f(2)])``, or
      ``await f(1)`` for one call;
    - a plain function: it simply runs as a task.

    What may be yielded: ``Delayed`` objects and coroutine calls, ``Future``
    objects, any dask collection (its computed result comes back), plain
    values (returned as is), and lists, tuples and dicts nesting any of these.
    Anything else (a set, a generator, a coroutine object, an asyncio future)
    raises ``BadYieldError`` (a ``TypeError``) at the yield.

    On a distributed worker the body runs between yields on the worker's
    thread pool; while it waits it holds no worker slot and no thread. All
    children of one yield are submitted in one message, with keys derived
    from the parent's key, the yield's index and their position. Without a
    distributed client the call runs in-process with the same results and
    exceptions.

    Errors: a child's exception is raised at the yield with its own type,
    message and traceback. Its siblings are released as soon as the coroutine
    has handled the error: those nobody else holds are cancelled. Cancelling
    the task (or closing its client) closes the body (``finally`` blocks run)
    and releases every child it started.

    Parameters
    ----------
    pure
        Derive the key from the function and its arguments (as
        ``dask.delayed(pure=True)``), so equal calls share a key. Default
        False: every call is a new task, which is what random or side-effecting
        functions need.
    nout
        The number of outputs, for unpacking a call (``a, b = f()``).
    name
        Key prefix, shown in the dashboard; defaults to the function's name.
    """
    if func is None:
        return functools.partial(coroutine, pure=pure, nout=nout, name=name)
    return CoroutineFunction(func, pure=pure, nout=nout, name=name)


@is_lazy.register(CoroutineFunction)
def _(obj: Any) -> bool:
    raise _Rejected("a coroutine function must be called: yield f(x), not f")


@is_lazy.register(Request)
def _(obj: Any) -> bool:
    raise _Rejected("gather() is awaited, not nested: yield its argument instead")
