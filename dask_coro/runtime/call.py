"""``@coroutine``: a function call becomes a lazy task, as with ``dask.delayed``."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import threading
import types
import uuid
import weakref
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from dask.base import tokenize
from dask.delayed import unpack_collections
from dask.highlevelgraph import HighLevelGraph
from dask.typing import Key
from dask.utils import funcname

from .. import _config
from .._exceptions import Rejected
from .._internals.dask_private import DataNode, Task, annotations_in_effect
from ..core import accel
from ..core.classify import classifier, is_lazy
from ..core.engine import NOT_DONE, Failed, Frame, Idle, Request, Trampoline, current_trampoline
from ..core.plan import func_token
from . import extensions
from .errors import task_error
from .ops import _DASK, _KEY, _LENGTH, BuiltLazily, bind_operators


def gather(x: Any) -> Request:
    """Awaitable: ``await gather(x)`` in an ``async def`` coroutine computes ``x``.

    ``x`` is anything a generator coroutine may yield (see ``coroutine``); the
    result has the same shape. In a generator coroutine, ``yield x`` does the
    same.
    """
    return Request(x)


# Delayed's own slots (runtime.ops holds them): CoroutineCall fills them when
# dask first asks for its key or graph (see CoroutineCall._build).
#: No options (``CoroutineTask.options``): shared, never changed.
_NO_OPTIONS: Mapping[str, Any] = {}
_BUILD_LOCK = threading.RLock()  # building a call builds the calls in its arguments


class CoroutineCall(BuiltLazily):
    """A lazy call of a ``@coroutine`` function: a ``dask.delayed.Delayed``.

    Everything a ``Delayed`` does works (``compute``, ``persist``, indexing,
    attribute access, arithmetic, passing into other lazy calls); in addition
    it can be awaited inside an ``async def`` coroutine.

    Making one costs a few attribute stores: its key and graph are built the
    first time anything asks for them. A call nobody asked the key of, whose
    arguments hold no lazy value, may run inline: it is an
    ``core.engine.InlineCall``, ``__dask_coro_inline__`` is then the
    function; after it ran, ``__dask_coro_value__`` holds the result
    (``__dask_coro_done__`` is ``(result,)``, else None), so yielding it
    again, or building a graph on it, reuses the result.
    """

    # Made by ``CoroutineFunction.__call__``, which stores five slots for a
    # call that may run inline: ``_name`` and ``_ann`` only when set (read them
    # with ``getattr(call, slot, None)``), ``_length`` comes from the function.
    __slots__ = (
        "_fn",
        "__dask_coro_args__",
        "_kwargs",
        "_name",
        "__dask_coro_inline__",
        "__dask_coro_value__",
        "_ann",
    )
    _fn: CoroutineFunction | None
    __dask_coro_args__: tuple[Any, ...]
    _kwargs: dict[str, Any]
    _name: Key | None
    __dask_coro_inline__: Callable[..., Any] | None
    __dask_coro_value__: Any
    _ann: dict[str, Any] | None

    @property
    def __dask_coro_done__(self) -> tuple[Any] | None:
        """``(value,)`` once the call computed ``value`` inline, else None
        (also when it raised: ``__dask_coro_value__`` is then ``Failed``)."""
        value = self.__dask_coro_value__
        return None if value is NOT_DONE or type(value) is Failed else (value,)

    # No Delayed.__init__: ``CoroutineCall()`` makes an empty call, in C.
    __init__ = object.__init__

    @property
    def _length(self) -> int | None:
        fn = self._fn
        if fn is not None:
            return fn.nout
        return _LENGTH.__get__(self)

    def _build(self) -> Any:
        with _BUILD_LOCK:  # one key, even if two threads ask at once
            try:
                return _KEY.__get__(self)
            except AttributeError:
                pass
            fn = self._fn
            assert fn is not None  # an unpickled call has its key already
            args, kwargs = self.__dask_coro_args__, self._kwargs
            # Any dask key; HighLevelGraph.from_collections is annotated for str
            # names only, but takes any key as Delayed's own graphs do.
            key: Any = getattr(self, "_name", None)
            if key is None:
                if fn.pure:
                    key = f"{fn.prefix}-{tokenize(fn.__wrapped__, args, kwargs)}"
                else:
                    key = f"{fn.prefix}-{uuid.uuid4().hex}"
            value = self.__dask_coro_value__
            done = self.__dask_coro_done__
            if type(value) is Failed:
                # It raised inline: its key keeps that outcome, so its task
                # (and every dependent) raises the same error.
                graph = HighLevelGraph.from_collections(
                    key, {key: Task(key, _reraise, DataNode(None, value.error))}, dependencies=()
                )
            elif done is not None:
                # Computed inline already: dependents get the value, not a rerun.
                graph = HighLevelGraph.from_collections(
                    key, {key: DataNode(key, done[0])}, dependencies=()
                )
            else:
                # The annotations in effect where the call was made (none
                # included), as a Delayed's layer takes them when it is made,
                # not those where dask first asks for its graph.
                token = annotations_in_effect.set(getattr(self, "_ann", None))
                try:
                    graph = _graph(fn, key, args, kwargs)
                finally:
                    annotations_in_effect.reset(token)
            _DASK.__set__(self, graph)
            _KEY.__set__(self, key)
            self.__dask_coro_inline__ = None  # it has a name now: compute it as a task
            return key

    def __await__(self) -> Generator[Any, Any, Any]:
        return Request(self).__await__()

    def __reduce__(self) -> tuple[Any, ...]:
        return _built_call, (self.key, self.dask, self._length)


bind_operators(CoroutineCall)  # x[i], x + y, sum(calls): LazyOp, built lazily too


def _reraise(error: BaseException) -> Any:
    """The task of a call that raised ``error`` inline."""
    raise error


def _built_call(key: Any, graph: Any, length: int | None) -> CoroutineCall:
    call = CoroutineCall()
    _KEY.__set__(call, key)
    _DASK.__set__(call, graph)
    _LENGTH.__set__(call, length)
    for slot in CoroutineCall.__slots__:
        setattr(call, slot, None)
    call.__dask_coro_value__ = NOT_DONE
    return call


def _graph(fn: CoroutineFunction, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> HighLevelGraph:
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
    task = Task(key, CoroutineTask(fn.run, key, fn.options), *args2, **kwargs2)
    return HighLevelGraph.from_collections(key, {key: task}, dependencies=deps)


class Runner(Protocol):
    """Runs a coroutine task: ``runner(task, args, kwargs)``."""

    def __call__(self, task: CoroutineTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...


class CoroutineTask:
    """The callable a coroutine call puts in the graph.

    distributed runs a task on its event loop when the task's function is a
    coroutine function (``Task.is_coro`` -> ``distributed.utils.iscoroutinefunction``,
    which honours tornado's ``__tornado_coroutine__`` flag), so a worker awaits
    what ``__call__`` returns there: the worker runner's coroutine. Any other
    scheduler (threaded, sync, processes) calls it as a plain function, and it
    runs the coroutine to the end in-process. One callable, right under every
    scheduler, also when a graph mixes coroutine calls with plain ``Delayed``
    objects.

    It carries its key because a task running on the event loop cannot learn
    it from distributed, and its function's options (``@coroutine(name=value)``:
    those the features declare, ``extensions.Extension.options``), which a
    worker that unpickled the function by value cannot look up; the run
    hands them to the features as ``run.options``.

    ``runners`` is injected by ``dask_coro.runtime`` (the runners import this
    module, never the other way round): ``on_worker`` answers the coroutine
    that runs the task on the worker whose event loop calls it, or None when
    not called on a worker's event loop; ``local`` runs it to the end here.
    """

    __slots__ = ("func", "key", "options")
    __tornado_coroutine__ = True
    runners: ClassVar[tuple[Runner, Runner]]

    def __init__(self, func: Callable[..., Any], key: Key, options: Mapping[str, Any] | None = None):
        self.func = func
        self.key = key
        self.options: Mapping[str, Any] = options or _NO_OPTIONS

    def with_key(self, key: Key) -> CoroutineTask:
        return CoroutineTask(self.func, key, self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Every coro.* setting here, before anything runs: a bad one fails
        # this task, and so reaches whoever computes it (a cheap comparison
        # while the settings stay as last checked).
        _config.check()
        on_worker, local = self.runners
        awaitable = on_worker(self, args, kwargs)
        if awaitable is not None:
            return awaitable
        return local(self, args, kwargs)

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
            if isinstance(wrapper, CoroutineFunction) and wrapper.run is self.func:
                return _task_by_name, (module, qualname, self.key, _version())
        return _task_by_value, (self.func, self.key, _version(), dict(self.options) or None)

    def __dask_tokenize__(self) -> tuple[str, str]:
        # What it computes, not its key: a child's key holds a token of its
        # task (core.keys), and the key is renamed after that.
        # The user's function: a shim (``_Callable``) adds nothing to what runs.
        func = self.func
        if isinstance(func, _Callable):
            func = func.func
        return ("dask_coro.CoroutineTask", func_token(func))

    def __repr__(self) -> str:
        return f"<coroutine {funcname(self.func)} {self.key!r}>"


def _version() -> str:
    version: str = sys.modules["dask_coro"].__version__
    return version


def _mismatch(made_by: str | None) -> tuple[Exception, bool] | None:
    """A task pickled by another dask_coro version (a client, or a worker
    submitting children) is refused where it is unpickled: the scheduler
    refuses the graph, a worker fails the task. A mismatch would otherwise
    fail somewhere later and obscurely."""
    here = _version()
    if made_by is None or made_by == here:
        return None
    from .._exceptions import VersionMismatchError

    where = _this_process()
    error = VersionMismatchError(
        f"this coroutine task was made with dask_coro {made_by}, but {where} "
        f"has dask_coro {here}: install the same version of dask_coro on the client, "
        "the scheduler and every worker"
    )
    return error, where.startswith("the scheduler")


def _refusing(mismatch: tuple[Exception, bool], key: Key) -> CoroutineTask:
    error, on_scheduler = mismatch
    if on_scheduler:
        raise error  # distributed refuses the graph: the client's compute raises it
    # On a worker an error while unpickling a task's spec is not reported as
    # the task's error: fail when it runs instead.
    return CoroutineTask(functools.partial(_raise, error), key)


def _raise(error: Exception, *args: Any, **kwargs: Any) -> Any:
    raise error


def _this_process() -> str:
    if "distributed" in sys.modules:
        from .._internals.distributed.worker import process_role

        return process_role()
    return f"process {os.getpid()}"


def _task_by_value(
    func: Callable[..., Any], key: Key, made_by: str | None = None, options: Mapping[str, Any] | None = None
) -> CoroutineTask:
    mismatch = _mismatch(made_by)
    if mismatch is not None:
        return _refusing(mismatch, key)
    return CoroutineTask(func, key, options)


def _task_by_name(module: str, qualname: str, key: Key, made_by: str | None = None) -> CoroutineTask:
    mismatch = _mismatch(made_by)
    if mismatch is not None:
        return _refusing(mismatch, key)
    wrapper: Any = importlib.import_module(module)
    for part in qualname.split("."):
        wrapper = getattr(wrapper, part)
    return CoroutineTask(wrapper.run, key, wrapper.options)


_SPAN_ONLY = {"span": None}.keys()  # computed in place under these (runtime.inplace)
#: The annotations in effect last seen that were a run's own (on a worker,
#: the span Worker.execute puts the task in): calls made under them may run
#: inline. dask.annotate makes a new dict each time; nobody changes one after.
_own_seen: list[Any] = [None]
# Bound once: ``annotations_in_effect.get()`` looks the method up on each call,
# some 500 machine instructions of a ~4,000 call in CPython 3.11.
_annotations_now = annotations_in_effect.get
#: Argument types that hold no dask collection (exact types: a subclass could).
_PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})


def _is_own(ann: dict[str, Any]) -> bool:
    """Whether ``ann`` are the annotations the running coroutine started
    under (``Trampoline.own_annotations``), not ones set in its body."""
    tramp = current_trampoline()
    if tramp is None:
        return False
    own = tramp.own_annotations
    return ann is own or ann == own


def _plain_values(kwargs: dict[str, Any]) -> bool:
    return all(type(v) in _PLAIN for v in kwargs.values())


#: What a call of a coroutine function starts (``body_kind``).
GENERATOR, ASYNC, PLAIN = "generator", "async", "plain"
_CO_GENERATOR = inspect.CO_GENERATOR
_CO_COROUTINE = inspect.CO_COROUTINE


def body_kind(func: Callable[..., Any]) -> str:
    """What calling ``func`` starts: ``GENERATOR`` or ``ASYNC``, a body the
    runners drive, or ``PLAIN``, a function whose return value is the call's
    value, a generator or coroutine object included (as with
    ``dask.delayed(func)``).

    The kind is the function's, not its return value's, read as
    ``inspect.isgeneratorfunction`` and ``inspect.iscoroutinefunction`` read
    it, through ``functools.partial`` and bound methods, and further: through
    ``__wrapped__`` (a decorator made with ``functools.wraps`` keeps its
    function's kind) and to the ``__call__`` of a callable object. Anything
    else (a builtin, a class, a numpy function, ``operator.itemgetter``) is
    plain.
    """
    for _ in range(100):  # a chain of wrappers; a cycle of them ends here
        if isinstance(func, functools.partial):
            func = func.func
        elif isinstance(func, types.MethodType):
            func = func.__func__
        elif isinstance(func, types.FunctionType):
            flags = func.__code__.co_flags
            if flags & _CO_GENERATOR:
                return GENERATOR
            if flags & _CO_COROUTINE:
                return ASYNC
            wrapped = getattr(func, "__wrapped__", None)
            if wrapped is None:
                return PLAIN
            func = wrapped
        elif isinstance(func, type):
            return PLAIN  # calling a class makes an instance
        elif isinstance(wrapped := getattr(func, "__wrapped__", None), types.FunctionType):
            func = wrapped  # e.g. functools.lru_cache
        else:
            call = type(func).__call__
            if not isinstance(call, types.FunctionType):
                return PLAIN  # implemented in C
            func = call
    return PLAIN


def _name_of(func: Callable[..., Any]) -> str:
    """A key prefix for ``func``: its name, or its type's for a callable
    object without one (``itemgetter``, not ``operator.itemgetter(1)``)."""
    if isinstance(func, functools.partial) or hasattr(func, "__name__"):
        return funcname(func)
    return funcname(type(func))


class _Callable:
    """What the calls of a coroutine function run when the function is not
    a plain Python function: a partial, a bound method, a builtin, a
    callable object (a dataclass instance is not even hashable). The
    runners count calls and keep wrappers by function, so this is hashable
    and weakly referable; it bears the function's name, module and
    qualified name (a task refers to an importable wrapper by them)."""

    def __init__(self, func: Callable[..., Any], kind: str):
        self.func = func
        self.kind = kind
        self.__name__ = _name_of(func)
        self.__qualname__ = getattr(func, "__qualname__", self.__name__)
        self.__module__ = getattr(func, "__module__", None) or ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.func, self.kind)

    def __repr__(self) -> str:
        return f"<{self.kind} {self.func!r}>"


class _Plain(_Callable):
    """A plain function's calls: a generator or coroutine object it returns
    is its value, handed back as it is (the runners drive whatever a call
    returns that is one)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.func(*args, **kwargs)
        if type(out) is types.GeneratorType or type(out) is types.CoroutineType:
            return _returning(out)
        return out


def _returning(value: Any) -> Generator[Any, Any, Any]:
    """A body that returns ``value`` at its first step."""
    return value
    yield  # a generator function  # pragma: no cover


class _MakesCalls:
    """Calling a coroutine function makes a call, in Python: the pure
    engine's ``CoroutineFunction.__call__`` (the reference). The compiled
    engine's ``FunctionBase`` does the same in C (``core/_cengine.c``,
    ``make_call``); ``CoroutineFunction`` derives from whichever runs
    (``core.accel``)."""

    _inline: Callable[..., Any] | None

    def __call__(self, *args: Any, **kwargs: Any) -> CoroutineCall:
        # The hot path of fine-grained recursion: no key, no graph, no
        # tokenizing here (CoroutineCall._build does that when asked), five
        # slot stores for a call that may run inline.
        call = CoroutineCall()
        call._fn = self
        call.__dask_coro_args__ = args
        call._kwargs = kwargs
        call.__dask_coro_value__ = NOT_DONE
        func = self._inline
        if kwargs:
            name = kwargs.pop("dask_key_name", None)
            if name is not None:
                call._name = name
                func = None
            elif not _plain_values(kwargs):
                func = None
        # What dask.annotate set here, as a layer would take it: an annotated
        # call is a task, its annotations are for the scheduler. But for the
        # run's own (Worker.execute runs every task of a named span inside
        # dask.annotate(span=...), and its children belong to it anyway).
        ann = _annotations_now()
        if ann:
            call._ann = ann
            if ann is not _own_seen[0]:
                if _is_own(ann):
                    # On a worker every call of a run sees the dict its
                    # task's span put in effect: look it up once, not per call.
                    _own_seen[0] = ann
                else:
                    func = None
        if func is not None:
            if len(args) == 1:  # the common case, without a loop
                t = type(args[0])
                plain = t is int or t in _PLAIN
            else:
                plain = True
                for a in args:
                    t = type(a)
                    if t is not int and t not in _PLAIN:
                        plain = False
                        break
            if plain:
                call.__dask_coro_inline__ = functools.partial(func, **kwargs) if kwargs else func
                return call
        call.__dask_coro_inline__ = None
        return call


if TYPE_CHECKING:
    _CallsBase = _MakesCalls
else:
    _CallsBase = _MakesCalls if accel.cengine is None else accel.cengine.FunctionBase


class CoroutineFunction(_CallsBase):
    """A function decorated with ``@coroutine``; calling it returns a
    ``CoroutineCall`` and runs nothing."""

    __wrapped__: Callable[..., Any]  # set by functools.update_wrapper
    run: Callable[..., Any]
    kind: str

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        pure: bool = False,
        nout: int | None = None,
        name: str | None = None,
        inline: bool = True,
        **options: Any,
    ):
        if not callable(func):
            raise TypeError(f"@coroutine expects a function, got {func!r}")
        if isinstance(func, CoroutineFunction):
            func = func.__wrapped__
        run: Callable[..., Any]
        if isinstance(func, _Callable):  # a graph's task, unpickled by value
            run, func = func, func.func
            self.kind = run.kind
        else:
            self.kind = body_kind(func)
            if type(func) is types.FunctionType and self.kind != PLAIN:
                run = func  # the common case, called as it is
            else:
                run = (_Plain if self.kind == PLAIN else _Callable)(func, self.kind)
        #: What calls of this function run: the function itself, or a shim
        #: that makes it hashable and weakly referable, and keeps a plain
        #: function's generator a value (see ``body_kind``).
        self.run = run
        # Any callable dask.delayed takes: its __dict__ (a callable object's
        # fields) is not ours to copy, and it may lack __name__.
        functools.update_wrapper(
            self, func, updated=functools.WRAPPER_UPDATES if type(func) is types.FunctionType else ()
        )
        WRAPPERS[run] = self
        self.pure = pure
        self.nout = nout
        self.prefix = name or _name_of(func)
        if not isinstance(inline, bool):
            raise TypeError(f"@coroutine(inline=...) expects True or False, got {inline!r}")
        self.inline = inline
        extensions.check_options(options)
        #: The options the features declare (``extensions.Extension.options``),
        #: carried to each run of a call (``CoroutineTask.options``).
        self.options: Mapping[str, Any] = options or _NO_OPTIONS

    @property
    def inline(self) -> bool:
        return self._inline is not None

    @inline.setter
    def inline(self, value: bool) -> None:
        # What __call__ reads: the function to run inline, or None.
        self._inline = self.run if value else None

    # ``_inline`` is a slot of the compiled engine's base: kept by pickle too.
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_inline": self._inline}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        inline = state.pop("_inline", None)
        self.__dict__.update(state)
        self._inline = inline

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return functools.partial(self, instance)

    def __repr__(self) -> str:
        return f"<dask_coro.coroutine {self.prefix}>"


if accel.cengine is not None:
    accel.cengine.fast_calls(CoroutineFunction)
    accel.cengine.setup_calls(
        call_type=CoroutineCall,
        partial=functools.partial,
        is_own=_is_own,
        own_seen=_own_seen,
        annotations=annotations_in_effect,
    )
    accel.call_type = CoroutineCall


def coroutine(
    func: Callable[..., Any] | None = None,
    *,
    pure: bool = False,
    nout: int | None = None,
    name: str | None = None,
    inline: bool = True,
    **options: Any,
) -> Any:
    """Make a function a coroutine task.

    Calling the decorated function returns a lazy ``CoroutineCall`` (a dask
    ``Delayed``) and runs nothing. When it runs, the body may be:

    - a generator: ``a, b = yield [f(1), f(2)]`` computes what was yielded and
      resumes with results of the same shape;
    - an ``async def``: ``a, b = await dask_coro.gather([f(1), f(2)])``, or
      ``await f(1)`` for one call;
    - a plain function: it runs as a task, and may wait at any call depth
      with ``dask_coro.result(x)`` (a yield, from plain code).

    The kind is the function's (``body_kind``), not what a call returns: a
    plain function that returns a generator object returns it as its value,
    as ``dask.delayed(f)`` does. ``func`` may be any callable
    ``dask.delayed`` takes: a ``functools.partial``, a bound method, a
    builtin, a class, a numpy function, ``operator.itemgetter(1)``, an
    object with ``__call__`` (hashable or not).

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

    Inline calls (``coro.inline.enabled``, on by default): a yielded coroutine
    call whose arguments are plain values (numbers, strings, bytes, None) runs
    inline, as a plain call in the parent's thread-pool step on the same
    worker, with no task, no key and no scheduler message, which makes
    fine-grained recursion about a hundred times cheaper per call. It becomes
    a real task (key derived as above) when the scheduler reports idle
    threads (work stealing, so every worker gets work), and before the
    coroutine running it waits on the cluster. Results, exceptions and
    cancellation are the same; ``current_key()`` inside an inline call is the
    key of the task running it, and progress and tree count inline calls
    per function (not one node per call).

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
    inline
        False: calls of this function are never run inline, each is a task of
        its own (to see each call in the dashboard and in ``tree``, or to give
        it ``dask.annotate`` resources). Default True: inline where
        ``coro.inline.enabled`` allows.
    **options
        Options a feature declares (``Extension.options``) and reads for
        each run of a call of this function; an unknown one is a
        ``TypeError``. ``keep_resources`` (``resources/``), True: a task of
        this function keeps the worker resources it was given
        (``resources={"GPU": 1}``) while it waits, for a body that keeps
        state on the device between yields. Default False: while it waits
        it gives them back, so its children (or any task) may use them, and
        it takes them again before its body goes on, waiting for them as a
        task waits for its resources (see docs/dask-features.md).
    """
    if func is None:
        return functools.partial(coroutine, pure=pure, nout=nout, name=name, inline=inline, **options)
    return CoroutineFunction(func, pure=pure, nout=nout, name=name, inline=inline, **options)


@is_lazy.register(CoroutineFunction)
def _(obj: Any) -> bool:
    raise Rejected("a coroutine function must be called: yield f(x), not f")


@is_lazy.register(Request)
def _(obj: Any) -> bool:
    raise Rejected("gather() is awaited, not nested: yield its argument instead")


def trampoline(
    name: str,
    *,
    inline: bool,
    idle: Idle | None = None,
    cancelled: Callable[[], bool] | None = None,
    on_ended: Callable[[Frame], None] | None = None,
    check_every: int = 256,
    localize: Callable[[Frame, Any], Any] | None = None,
    count: bool = False,
    awaits: bool = True,
    short: Callable[[Any], bool] | None = None,
) -> Trampoline:
    """The engine wired for coroutine calls, as both runners use it: with
    ``inline``, ``CoroutineCall`` objects run inline (see ``Trampoline``),
    and so do the yielded values ``localize`` computes in place
    (``runtime.inplace.localizer``). With ``awaits``, the runner runs an
    event loop for ``async def`` bodies (``core.engine.Await``). A call run
    inline that raises gives its parent the error it would give as a task
    (``runtime.errors.task_error``). ``short(call)``: an inline call never
    handed out to idle threads (``Trampoline``)."""
    if not inline:
        localize = None
    return Trampoline(
        name,
        call_type=CoroutineCall if inline else None,
        classify=classifier,
        idle=idle,
        cancelled=cancelled,
        on_ended=on_ended,
        check_every=check_every,
        localize=localize,
        count=count,
        annotations=_annotations_now,
        awaits=awaits,
        child_error=task_error,
        short=short if inline else None,
    )


#: The ``@coroutine`` wrapper of each decorated function: a graph's coroutine
#: task names the plain function; computed in place (``runtime.inplace``), its
#: calls take the wrapper's ``inline``, ``pure`` and ``nout``.
WRAPPERS: weakref.WeakKeyDictionary[Callable[..., Any], CoroutineFunction] = weakref.WeakKeyDictionary()
