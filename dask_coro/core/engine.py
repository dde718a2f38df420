"""The stepping engine: run a coroutine body, and the calls it may run inline.

Pure: no distributed, no threads, no event loop. One ``Trampoline`` drives a
stack of ``Frame`` objects, one per running body: a generator function
(``x = yield lazy``), an ``async def`` function (``x = await gather(lazy)``,
which yields a ``Request``) or a plain function (no yield at all). Every body
is started, sent to and thrown into in one place, ``Trampoline._loop``, and
closed in one, ``Trampoline.close``.

When a body yields, each leaf of what it yielded is either

- *inline*: a call object of ``call_type`` that says how to run it here
  (``InlineCall``): run as a plain call, depth first and in order, with no
  task, no key and no scheduler message; or
- *remote*: anything else (a ``Delayed``, a ``Future``, a collection, a call
  whose arguments hold lazy values): the caller (worker runner, local runner)
  computes it and hands the results back.

The engine never talks to a cluster: it returns ``Submit`` to ask the caller
to start remote leaves, and to wait for the top frame's when ``wait``. Before
any wait, every inline leaf not started yet anywhere on the stack is turned
remote (*promoted*), so that work which could run does run while this stack
waits, and a child that waits on a sibling cannot deadlock. While the caller
reports idle capacity elsewhere (``idle.n > 0``), the oldest unstarted leaves
are promoted without waiting: this is how work is stolen (Cilk's lazy task
creation).

Semantics kept: results come back in the yielded shape; a child's exception
is raised at its parent's yield (siblings not started then never start);
closing the trampoline closes every open body, innermost first.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

from dask.typing import Key

from .._exceptions import BadYieldError
from .scope import Scope
from .structure import Path, Structure

#: How to run a call inline: ``(func, args, kwargs)``.
InlineSpec = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class InlineCall(Protocol):
    """What the engine needs of a call object (``Trampoline(call_type=...)``)
    to run it inline. ``runtime.call.CoroutineCall`` implements it.

    ``__dask_coro_inline__``
        ``(func, args, kwargs)`` if the call may run here, else None (it has
        a key: compute it as a task).
    ``__dask_coro_done__``
        ``(value,)`` once the call computed ``value`` inline (the engine sets
        it), so yielding the same call object again reuses the value.
    """

    __dask_coro_inline__: InlineSpec | None
    __dask_coro_done__: tuple[Any] | None


class Request:
    """What ``await dask_coro.gather(x)`` hands to the engine: compute ``x``.

    Generators and ``async def`` bodies share one protocol: awaiting a dask_coro
    awaitable goes through ``Request.__await__``, which yields the ``Request``
    itself, so the engine sees the same thing from ``yield x`` and
    ``await gather(x)``.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __await__(self) -> Generator[Request, Any, Any]:
        return (yield self)

    def __repr__(self) -> str:
        return f"gather({self.value!r})"


class Returned:
    """The root body finished with ``value``."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Returned({self.value!r})"


class Raised:
    """The root body finished by raising ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error

    def __repr__(self) -> str:
        return f"Raised({self.error!r})"


class Frame:
    """One running body on the stack, and the state of its current yield.

    ``func`` names the body in messages (the function, or a name). ``at`` is
    the position of this body's call in its parent's current yield. For the
    current yield: ``leaves``/``results`` by position, ``todo`` the positions
    to run inline (``next`` of them started), ``remote`` the positions the
    caller computes (``sent`` of them handed out). ``scope`` is the caller's
    state for this frame, set when it first starts remote leaves of it.
    """

    __slots__ = (
        "body",
        "is_async",
        "func",
        "done",
        "up",
        "at",
        "index",
        "shape",
        "leaves",
        "results",
        "todo",
        "next",
        "remote",
        "sent",
        "scope",
    )

    # Set by each yield (slots, declared for the type checker):
    shape: Any  # list, tuple, None (one call) or a Structure
    leaves: Any  # the yielded leaves, by position
    results: list[Any]
    todo: Sequence[int]  # positions to run inline
    next: int  # how many of ``todo`` started

    def __init__(self, func: Any, up: Frame | None, at: int, body: Any) -> None:
        self.body = body  # a generator or coroutine object; None once ended
        self.is_async = type(body) is _COROUTINE
        self.func = func
        self.done = False
        self.up = up
        self.at = at
        self.index = -1
        self.scope: Scope[Any] | None = None
        self.remote: Sequence[int] = _EMPTY
        self.sent = 0
        # The rest is set by each yield.

    @property
    def label(self) -> str:
        """The body's name for messages."""
        func = self.func
        return func if type(func) is str else getattr(func, "__name__", "coroutine")

    def path(self, pos: int) -> Path:
        """Where leaf ``pos`` sits in what this frame yielded."""
        shape = self.shape
        if type(shape) is Structure:
            return shape.paths[pos]
        return () if shape is None else (pos,)

    def ident(self, root: Key) -> Any:
        """A stable name for this frame, for deriving its children's keys: the
        root's key, then (yield index, path) of each call down to this one."""
        chain = []
        frame = self
        while frame.up is not None:  # iterative: inline stacks may be deep
            chain.append(frame)
            frame = frame.up
        out: Any = root
        for depth, frame in enumerate(reversed(chain), 1):
            up = frame.up
            assert up is not None
            out = (out, up.index, up.path(frame.at))
            if depth % _FOLD == 0:
                # Fold the nested name into a digest now and then: keys are
                # derived from its repr, which recurses once per level.
                out = "frame-" + hashlib.blake2b(repr(out).encode(), digest_size=16).hexdigest()
        return out


class Done:
    """The root body finished: ``step`` is ``Returned`` or ``Raised``."""

    __slots__ = ("step",)

    def __init__(self, step: Returned | Raised):
        self.step = step


class Submit:
    """Start ``batches`` (``[(frame, positions)]``) remotely; then, if ``wait``,
    wait for the remote leaves of ``frame`` (the top one) and call ``resume``
    (or ``throw``), else call ``run``."""

    __slots__ = ("batches", "wait", "frame")

    def __init__(self, batches: list[tuple[Frame, list[int]]], wait: bool, frame: Frame):
        self.batches = batches
        self.wait = wait
        self.frame = frame


class Stopped:
    """``cancelled()`` said so: the caller closes the trampoline."""

    __slots__ = ()


Outcome = Done | Submit | Stopped


class Idle:
    """Idle capacity elsewhere, as the caller last learned it: ``n`` leaves
    may be promoted now. The trampoline only reads it."""

    __slots__ = ("n",)

    def __init__(self, n: int = 0):
        self.n = n


_NO_IDLE = Idle(0)


class Trampoline:
    """Drives a root body and the calls it runs inline.

    Parameters
    ----------
    name
        The root's name, for error messages.
    call_type
        The type of an inline-able call (an ``InlineCall``), or None to run
        nothing inline.
    classify
        ``classify(name, index) -> (obj, path) -> bool``, as for ``Structure``.
    idle
        Capacity elsewhere, as the caller last learned it (see ``Idle``).
    cancelled
        Asked every ``check_every`` calls run inline; True stops the run.
    on_ended
        Called, at once, with each frame with a ``scope`` whose yield ended
        (resumed, or abandoned by an error) or whose body ended, so the caller
        can release what that yield needed; by default such frames are
        appended to ``ended``.
    """

    def __init__(
        self,
        name: str,
        *,
        call_type: type | None,
        classify: Callable[[str, int], Callable[[Any, Path], bool]],
        idle: Idle | None = None,
        cancelled: Callable[[], bool] | None = None,
        check_every: int = 256,
        on_ended: Callable[[Frame], None] | None = None,
    ):
        self.name = name
        self.call_type: Any = call_type
        self.classify = classify
        self.idle = idle or _NO_IDLE
        self.cancelled = cancelled
        self.check_every = check_every
        self.stack: list[Frame] = []
        #: Without ``on_ended``: frames with a ``scope`` whose yield ended, or
        #: whose body ended, since the caller last cleared the list.
        self.ended: list[Frame] = []
        self._ended = on_ended or self.ended.append

    # -- the caller's side ---------------------------------------------------

    def start(
        self,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        scope: Scope[Any] | None = None,
    ) -> Outcome:
        """Call the root ``func``; step into the body if it made one. ``scope``
        is the caller's state for the root frame (frames without one get it
        when the caller first starts remote leaves of them)."""
        try:
            body = func(*args, **kwargs)
        except BaseException as e:  # a body may raise anything
            return Done(Raised(e))
        typ = type(body)
        if typ is not _GENERATOR and typ is not _COROUTINE:
            return Done(Returned(body))  # a plain function
        root = Frame(self.name, None, 0, body)
        root.scope = scope
        self.stack = [root]
        return self._loop(body.send, None)

    def run(self) -> Outcome:
        """Go on after a ``Submit`` that does not wait."""
        return self._loop(None, None)

    def resume(self, values: list[Any]) -> Outcome:
        """The remote leaves of the top frame computed ``values`` (in the order
        of its ``remote`` positions)."""
        top = self.stack[-1]
        results = top.results
        for pos, v in zip(top.remote, values, strict=True):
            results[pos] = v
        top.remote = []
        top.sent = 0
        return self._loop(None, None)

    def throw(self, error: BaseException) -> Outcome:
        """A remote leaf of the top frame failed (or could not be started):
        raise ``error`` at its yield."""
        top = self.stack[-1]
        self._abandon(top)
        return self._loop(top.body.throw, error)

    def close(self) -> list[BaseException]:
        """Close every open body, innermost first (``GeneratorExit`` at its
        yield, ``finally`` blocks run); what they raised closing."""
        errors = []
        while self.stack:
            frame = self.stack.pop()
            body, frame.body = frame.body, None
            if body is not None and not frame.done:
                frame.done = True
                try:
                    body.close()
                except BaseException as e:
                    errors.append(e)
            if frame.scope is not None:
                self._ended(frame)
        return errors

    # -- the loop ------------------------------------------------------------

    def _loop(self, method: Callable[[Any], Any] | None, arg: Any) -> Outcome:
        """``method(arg)`` steps the top frame's body (its ``send`` or
        ``throw``); None: go on with the top frame's current yield.

        The one place bodies are stepped, and the hot path of fine-grained
        recursion: a call that returns without yielding never gets a frame
        (``fresh`` is its position in the top frame's yield while its first
        step runs), and no step object is made per yield or return."""
        stack = self.stack
        push = stack.append
        idle = self.idle
        call_type = self.call_type
        countdown = self.check_every
        calm = 0
        top = stack[-1]
        fresh = -1  # >= 0: the body stepped is a call of top's leaf ``fresh``, no frame yet
        body: Any = None  # with fresh: that body, made by calling ``func``
        func: Any = None
        while True:
            if method is not None:
                # -- step a body: the one place ------------------------------
                try:
                    out = method(arg)
                except StopIteration as stop:
                    out = stop.value
                    ended = _RETURNED
                except BaseException as e:  # a body may raise anything
                    if (
                        type(e) is RuntimeError
                        and isinstance(arg, StopIteration)
                        and e.__cause__ is arg
                    ):
                        # PEP 479 turned the StopIteration we threw, which the
                        # body did not catch, into RuntimeError: report ours.
                        e = arg
                    out = e
                    ended = _RAISED
                else:
                    ended = 0
                    if type(out) is Request:
                        out = out.value
                    elif type(method.__self__) is _COROUTINE:  # type: ignore[attr-defined]
                        # An async body awaited something foreign (an asyncio
                        # future, ...): raise at that await, as it would see.
                        method = method.__self__.throw  # type: ignore[attr-defined]
                        arg = _foreign_await(func if fresh >= 0 else top.func, out)
                        continue
                method = None
                if not ended:
                    if fresh >= 0:
                        top = Frame(func, top, fresh, body)
                        push(top)
                        fresh = -1
                        body = None
                    # -- set up the yield ``out`` ----------------------------
                    vt: type[Any] | None = type(out)
                    if vt is list or vt is tuple:
                        # The common yield, set up here: inline calls only.
                        for x in out:
                            if type(x) is not call_type or (
                                x.__dask_coro_inline__ is None and x.__dask_coro_done__ is None
                            ):
                                break
                        else:
                            top.index += 1
                            top.shape = vt
                            top.leaves = out
                            top.results = [_PENDING] * len(out)
                            top.todo = range(len(out))
                            top.next = 0
                            vt = None
                    if vt is not None:
                        error = self._yielded(top, out)
                        if error is not None:  # the yield itself was bad
                            method, arg = top.body.throw, error
                            continue
                        if top.remote and top.todo:
                            # Start the remote leaves now; they run while the
                            # inline ones do.
                            top.sent = len(top.remote)
                            return Submit([(top, list(top.remote))], False, top)
                    out = None
                else:
                    # -- a body ended: ``out`` is its value or error ----------
                    if fresh >= 0:
                        at, fresh, body = fresh, -1, None
                    else:
                        stack.pop()
                        top.done = True
                        top.body = None
                        if top.scope is not None:
                            self._ended(top)
                        if not stack:
                            return Done(Raised(out) if ended is _RAISED else Returned(out))
                        at = top.at
                        top = stack[-1]
                    if ended is _RAISED:
                        self._abandon(top)
                        method, arg = top.body.throw, out
                        continue
                    top.results[at] = out
                    top.leaves[at].__dask_coro_done__ = (out,)
                    out = None
            # -- go on with top's current yield: the next inline leaf, else
            # wait for the remote ones, else resume it ----------------------
            todo = top.todo
            while top.next < len(todo):
                calm -= 1
                if idle.n > 0 and calm <= 0:
                    batches = self._steal(idle.n)
                    if batches:
                        return Submit(batches, False, top)
                    todo = top.todo
                    calm = 64  # nothing to hand out: look again in 64 calls
                pos = todo[top.next]
                top.next += 1
                leaf = top.leaves[pos]
                done = leaf.__dask_coro_done__
                if done is not None:
                    top.results[pos] = done[0]
                    continue
                spec = leaf.__dask_coro_inline__
                if spec is None:
                    # Handed out meanwhile at another position (the same call
                    # object yielded twice, stolen there): wait for that task.
                    self._to_remote(top, (pos,))
                    continue
                countdown -= 1
                if not countdown:
                    countdown = self.check_every
                    if self.cancelled is not None and self.cancelled():
                        return Stopped()
                func, args, kwargs = spec
                try:
                    out = func(*args, **kwargs) if kwargs else func(*args)
                except BaseException as e:
                    self._abandon(top)
                    method, arg = top.body.throw, e
                    break
                typ = type(out)
                if typ is _GENERATOR or typ is _COROUTINE:
                    fresh, body = pos, out
                    method, arg = out.send, None
                    break
                top.results[pos] = out
                leaf.__dask_coro_done__ = (out,)
            else:
                if top.remote:
                    if top.sent < len(top.remote) or self._has_unstarted():
                        return Submit(self._promote_all(), True, top)
                    return Submit([], True, top)
                shape = top.shape
                results = top.results
                value: Any
                if shape is list:
                    value = results
                elif shape is tuple:
                    value = tuple(results)
                elif shape is None:
                    value = results[0]
                else:
                    value = shape.rebuild(results)
                # The next yield resets the rest of the frame.
                top.leaves = top.results = _EMPTY
                if top.scope is not None:
                    self._ended(top)
                del results
                method, arg = top.body.send, value
                del value

    def _yielded(self, frame: Frame, value: Any) -> Exception | None:
        """Set up ``frame``'s new yield. Returns the error to raise at the
        yield if it was rejected, else None."""
        frame.index += 1
        frame.next = 0
        frame.remote = _EMPTY
        frame.sent = 0
        call_type = self.call_type
        if type(value) is call_type and (
            value.__dask_coro_inline__ is not None or value.__dask_coro_done__ is not None
        ):
            frame.shape = None
            frame.leaves = (value,)
            frame.results = [_PENDING]
            frame.todo = _ONE
            return None
        try:
            structure = Structure(value, self.classify(frame.label, frame.index))
        except Exception as e:
            frame.todo = _EMPTY
            frame.leaves = _EMPTY
            return e
        frame.shape = structure
        frame.leaves = structure.leaves
        frame.results = [_PENDING] * len(structure.leaves)
        todo: list[int] = []
        remote: list[int] = []
        for pos, leaf in enumerate(structure.leaves):
            if type(leaf) is call_type and (
                leaf.__dask_coro_inline__ is not None or leaf.__dask_coro_done__ is not None
            ):
                todo.append(pos)
            else:
                remote.append(pos)
        frame.todo = todo
        frame.remote = remote
        return None

    def _running(self) -> set[int]:
        """The calls being run by frames on the stack, by id: the same call
        object at another, unstarted position must not be handed out (it
        would run twice); it reuses the value when its turn comes."""
        return {id(f.up.leaves[f.at]) for f in self.stack[1:] if f.up is not None}

    def _steal(self, n: int) -> list[tuple[Frame, list[int]]]:
        """Promote up to ``n`` unstarted leaves, the oldest frames' first (the
        biggest work, as Cilk's thieves take), from the end of each frame's
        list; never the top frame's next leaf, which this stack is about to
        run (handing it out would only make the stack wait for it)."""
        batches = []
        running = self._running()
        top = self.stack[-1]
        for frame in self.stack:
            start = frame.next + 1 if frame is top else frame.next
            if len(frame.todo) <= start:
                continue
            todo = list(frame.todo)
            rest = todo[start:]
            taken = [p for p in rest if id(frame.leaves[p]) not in running][-n:]
            if not taken:
                continue
            frame.todo = todo[:start] + [p for p in rest if p not in taken]
            n -= self._to_remote(frame, taken)
            if frame.sent < len(frame.remote):
                batches.append((frame, list(frame.remote[frame.sent :])))
                frame.sent = len(frame.remote)
            if n <= 0:
                break
        return batches

    def _has_unstarted(self) -> bool:
        running = self._running()
        return any(
            id(f.leaves[p]) not in running for f in self.stack for p in f.todo[f.next :]
        )

    def _promote_all(self) -> list[tuple[Frame, list[int]]]:
        """Turn every unstarted inline leaf remote; the leaves not handed out
        yet, by frame."""
        batches = []
        running = self._running()
        for frame in self.stack:
            rest = frame.todo[frame.next :]
            if rest:
                keep = [p for p in rest if id(frame.leaves[p]) in running]
                frame.todo = [*frame.todo[: frame.next], *keep]
                self._to_remote(frame, [p for p in rest if id(frame.leaves[p]) not in running])
            if frame.sent < len(frame.remote):
                batches.append((frame, list(frame.remote[frame.sent :])))
                frame.sent = len(frame.remote)
        return batches

    @staticmethod
    def _to_remote(frame: Frame, positions: Sequence[int]) -> int:
        """Hand ``positions`` to the caller, but for calls computed already;
        how many were handed."""
        if frame.remote is _EMPTY:
            frame.remote = []
        remote = frame.remote
        assert isinstance(remote, list)
        n = 0
        for p in positions:
            done = frame.leaves[p].__dask_coro_done__
            if done is not None:
                frame.results[p] = done[0]
            else:
                remote.append(p)
                n += 1
        return n

    def _abandon(self, frame: Frame) -> None:
        """``frame``'s current yield ends in an error: start nothing more of it."""
        frame.leaves = _EMPTY
        frame.results = _EMPTY
        frame.todo = _EMPTY
        frame.next = 0
        frame.remote = _EMPTY
        frame.sent = 0
        frame.shape = None
        if frame.scope is not None:
            self._ended(frame)


def _foreign_await(func: Any, obj: Any) -> BadYieldError:
    name = func if type(func) is str else getattr(func, "__name__", "coroutine")
    return BadYieldError(
        f"coroutine {name!r} awaited {obj!r}, which only an asyncio event loop "
        "can wait for; a dask_coro coroutine may await dask_coro.gather(...) or "
        "a coroutine call. Run asyncio code in a separate task."
    )


_EMPTY: Any = ()
_PENDING: Any = object()
_FOLD = 100  # levels of a frame name nested before it is folded
_GENERATOR = types.GeneratorType
_COROUTINE = types.CoroutineType
_ONE = range(1)
_RETURNED = 1
_RAISED = 2
