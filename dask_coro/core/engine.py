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

Waiting from plain code (``dask_coro.result``): the loop always runs on a
greenlet of its own (``_serve``), taken from a per-thread pool, so any body,
at any call depth, can call ``Trampoline.wait(x)``. That is a yield of the
body that called it: the body's stack stays *parked* in the loop's greenlet,
and the loop goes on in another greenlet of the pool. When the parked yield's
results are in, the loop hands back to the parked greenlet (``_Transfer``),
whose old loop, still on its stack, carries on as if the body had returned
from a plain call. A parked greenlet can only be resumed on the thread that
made it: while ``parked`` is non-zero, every call into the trampoline must
come from that thread. Code that never calls ``wait`` parks nothing and
costs one greenlet switch per call into the trampoline.

This module is the stepping, and the reference for the compiled loop
(``_cengine.c``), which takes the same named steps for the common case:
``Trampoline._steps`` steps a body in the context the rules give it
(``_Scratch.step_in``), makes a frame (``_frame``), sets up a yield
(``_yield``, else ``_yielded``), runs the next inline call and delivers its
value (``_deliver``); the hot paths take these steps written out (a Python
call per step costs more than most inline calls). What is not stepping lives
beside it, where the loop reaches it only off the hot path: ``calls.py``
(what the engine needs of a call, ``Request``), ``stealing.py`` (which
unstarted calls are handed out, and when; ``Idle``), ``counts.py`` (calls
counted for progress) and ``greenlets.py`` (parked bodies, the loop
greenlets). ``Trampoline`` inherits the methods of the two policies, so the
loop calls them as before.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Sequence
from contextvars import Context, ContextVar, copy_context
from typing import Any

from dask.typing import Key
from greenlet import GreenletExit, getcurrent

from . import accel
from .calls import EMPTY as _EMPTY
from .calls import NOT_DONE as NOT_DONE
from .calls import Failed as Failed
from .calls import InlineCall as InlineCall
from .calls import InPlace as InPlace
from .calls import Request as Request
from .calls import fail as _fail
from .calls import foreign_await as foreign_await
from .calls import unwrap as _unwrap
from .counts import Counting
from .greenlets import (
    _ATTR,
    _CONTINUE,
    _dispatch,
    _is_running,
    _kill,
    _Parked,
    _pool,
    _resumed,
    _Transfer,
)
from .scope import Scope
from .stealing import _NO_IDLE, Stealing, _needs_handed_out
from .stealing import Idle as Idle
from .structure import Path, Structure


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
    ``ann`` is what the current yield asks of the scheduler for every remote
    leaf (the ``dask.annotate`` annotations in effect at the yield, see
    ``Trampoline``), or None.
    """

    __slots__ = (
        "body",
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
        "ann",
        "ctx",
    )

    # Set by each yield (slots, declared for the type checker):
    shape: Any  # list, tuple, None (one call) or a Structure
    leaves: Any  # the yielded leaves, by position
    results: list[Any]
    todo: Sequence[int]  # positions to run inline
    next: int  # how many of ``todo`` started

    # The rest is set by its yields (``_frame`` makes a frame).
    body: Any  # a generator or coroutine object; None once ended
    func: Any
    done: bool
    up: Frame | None
    at: int
    index: int  # of the current yield
    scope: Scope[Any] | None
    remote: Sequence[int]
    sent: int
    ann: Any
    #: The context its body steps in (``_Scratch``): None for the run's own
    #: (the root's), else a ``contextvars.Context``: its parent's while its
    #: body changed no context variable (it steps in a copy), else its own.
    ctx: Context | None

    @property
    def label(self) -> str:
        """The body's name for messages."""
        func = _unwrap(self.func)
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
    """``cancelled()`` said so, or the caller set ``stop``: the caller closes
    the trampoline, or, after ``stop`` (with ``stop`` cleared), goes on with
    ``run()``: a pause between two inline calls, which resumes with the call
    that was next."""

    __slots__ = ()


class Await:
    """An ``async def`` body (``frame``, the top one) awaited something only
    an event loop can wait for: ``obj`` is what its ``await`` handed up (an
    asyncio future, or None for ``asyncio.sleep(0)``). Start ``batches`` (every
    unstarted inline call, promoted as before any wait); then, once the loop
    is done with ``obj``, call ``proceed()`` (or ``proceed(error)`` to raise
    ``error`` at that await). Only with ``Trampoline(awaits=True)``."""

    __slots__ = ("batches", "frame", "obj")

    def __init__(self, batches: list[tuple[Frame, list[int]]], frame: Frame, obj: Any):
        self.batches = batches
        self.frame = frame
        self.obj = obj


Outcome = Done | Submit | Stopped | Await
_OUTCOMES = (Done, Submit, Stopped, Await)


class Trampoline(Counting, Stealing):
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
        The prompt way is ``stop``: set it (from any thread: one attribute
        store) when the run must stop, and no inline call starts after the
        loop next reads it, before its next call.
    on_ended
        Called, at once, with each frame with a ``scope`` whose yield ended
        (resumed, or abandoned by an error) or whose body ended, so the caller
        can release what that yield needed; by default such frames are
        appended to ``ended``.
    localize
        ``localize(frame, leaf)``, asked for each leaf of a yield that is not
        an inline call: an inline call to run instead (it computes the leaf
        in place, see ``core.localize``; handed out, it must plan as the leaf
        itself), or None to compute the leaf remotely. What it raises is
        raised at the yield. Its ``__dask_coro_needs__`` (optional) are the
        inline calls it runs as themselves: while it runs, those the stack
        holds elsewhere too are not handed out; while one of them runs, it
        is not handed out; one handed out before it starts, it is handed out
        too, so one yield's call and the value on it share one task.
    count
        Count the calls run inline, per function (``call_counts``).
    annotations
        ``annotations()``: the annotations in effect where a body yields (what
        ``dask.annotate`` set: a dict, or None), read at each yield, each
        ``wait`` and where the root starts. Those in effect where the root
        starts are the run's own (on a worker, the span ``Worker.execute``
        puts its task in); a yield made under any others (compared by
        identity, then by value) is *annotated*: none of its leaves runs
        inline or is computed in place, every one is remote, and
        ``Frame.ann`` carries the annotations to the caller, which gives
        them to each task the leaf adds (as a layer made under them would
        have them).
    awaits
        The caller runs an event loop for the bodies: an ``async def`` body
        awaiting something foreign to dask_coro (an asyncio future) makes the
        trampoline return ``Await``. Without it, ``BadYieldError`` is raised
        at that await.
    child_error
        ``child_error(e)``: the error to raise at a parent's yield (and to
        keep as the call's outcome) when a call it ran inline raised ``e``;
        by default ``e``. Asked only when a call raised (the runtime gives
        the error a task would deliver, ``runtime.errors``).
    short
        ``short(call)``: an unstarted inline call not worth a task (the
        runtime's: a plain function whose runs are far shorter than a
        task's round trip), never handed out to idle threads elsewhere: it
        runs inline when its frame comes to it. Before a wait it is
        promoted as any other (the wait may be for what it does). Asked
        only off the hot path, when calls are handed out.
    """

    # ``stop`` is a slot: the compiled loop reads it before every call at a
    # fixed offset (the rest lives in the instance's dict, as ever).
    __slots__ = ("stop",)

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
        localize: Callable[[Frame, Any], Any] | None = None,
        count: bool = False,
        annotations: Callable[[], Any] | None = None,
        awaits: bool = False,
        child_error: Callable[[BaseException], BaseException] | None = None,
        short: Callable[[Any], bool] | None = None,
    ):
        self.name = name
        self.short = short
        self.child_error = child_error
        self.awaits = awaits
        self.call_type: Any = call_type
        self.classify = classify
        self.idle = idle or _NO_IDLE
        self.cancelled = cancelled
        self.check_every = check_every
        #: Set by the caller when the run must stop (its task was cancelled)
        #: or pause (its thread is wanted): read before every inline call,
        #: which then returns ``Stopped``; ``run()`` goes on after a pause.
        self.stop = False
        self.localize = localize
        self.stack: list[Frame] = []
        #: Without ``on_ended``: frames with a ``scope`` whose yield ended, or
        #: whose body ended, since the caller last cleared the list.
        self.ended: list[Frame] = []
        self._ended = on_ended or self.ended.append
        #: How many bodies wait in ``wait`` (parked greenlets): while non-zero,
        #: call the trampoline from one thread only, the one that parked them.
        self.parked = 0
        self._closing = False
        self._root_scope: Scope[Any] | None = None
        #: With ``count``: per function run inline, ``[started, failed]``
        #: (the loop adds runs of calls of one function every ``check_every``
        #: calls and whenever it stops; see ``call_counts``).
        self.calls: dict[Any, list[int]] | None = {} if count else None
        self.annotations_now: Callable[[], Any] = annotations or _NO_ANNOTATIONS
        #: The annotations in effect where the root started (``start``): a
        #: yield under these is not annotated.
        self.own_annotations: Any = None
        #: The runner's object for this run, for features that start work of
        #: their own beside the body's yields (a group's children); None when
        #: the runner offers none (no cluster: they are computed here).
        self.host: Any = None
        #: The compiled loop for the common case of ``_steps``, or None (the
        #: pure engine, or a call type it does not know: ``accel``).
        self.fast: Any = accel.cengine.steps if (
            accel.cengine is not None and call_type is not None and call_type is accel.call_type
        ) else None

    def annotated(self) -> Any:
        """The annotations in effect here if they differ from the run's own
        (``own_annotations``), else None."""
        now = self.annotations_now()
        own = self.own_annotations
        if not now or now is own or now == own:
            return None
        return now

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
        self._root_scope = scope
        self.own_annotations = self.annotations_now()
        return self._enter(self._begin, (func, args, kwargs))

    def run(self) -> Outcome:
        """Go on after a ``Submit`` that does not wait."""
        return self._enter(self._loop, (None, None))

    def resume(self, values: list[Any]) -> Outcome:
        """The remote leaves of the top frame computed ``values`` (in the order
        of its ``remote`` positions)."""
        top = self.stack[-1]
        results = top.results
        for pos, v in zip(top.remote, values, strict=True):
            results[pos] = v
        top.remote = []
        top.sent = 0
        return self._enter(self._loop, (None, None))

    def proceed(self, error: BaseException | None = None) -> Outcome:
        """Go on after an ``Await``: the event loop is done with what the top
        body awaited (or ``error`` is raised at its await)."""
        body = self.stack[-1].body
        if error is None:
            return self._enter(self._loop, (body.send, None))
        return self._enter(self._loop, (body.throw, error))

    def throw(self, error: BaseException) -> Outcome:
        """A remote leaf of the top frame failed (or could not be started):
        raise ``error`` at its yield."""
        top = self.stack[-1]
        self._abandon(top)
        return self._enter(self._loop, (top.body.throw, error))

    def close(self) -> list[BaseException]:
        """Close every open body, innermost first (``GeneratorExit`` at its
        yield, ``GreenletExit`` at its ``wait``; ``finally`` blocks run);
        what they raised closing."""
        self._closing = True
        errors: list[BaseException] = []
        # A body closing may call wait() in a finally block: it raises GreenletExit.
        hub = getcurrent()
        before = getattr(hub, _ATTR, None)
        setattr(hub, _ATTR, self)
        try:
            while self.stack:
                frame = self.stack.pop()
                body, frame.body = frame.body, None
                if type(body) is _Parked:
                    self.parked -= 1
                    error = _kill(body, frame.label)
                    if error is not None:
                        errors.append(error)
                    body = body.body  # finished by the unwinding, unless it ignored it
                if not frame.done and frame.up is not None:
                    self._failed(frame.func)  # a call that never ended
                if body is not None and not frame.done:
                    frame.done = True
                    try:
                        # In its context, as its steps (``_Scratch``): its
                        # finally blocks see what it set, and reset it.
                        up = _ROOT if frame.up is None else frame.up.ctx
                        _step_alone(frame.ctx, up, type(body).close, body)
                    except BaseException as e:
                        errors.append(_closing_error(frame, body, e))
                if frame.scope is not None:
                    self._ended(frame)
        finally:
            setattr(hub, _ATTR, before)
        return errors

    def running_frame(self) -> Frame | None:
        """The frame of the body running here (the one whose yields ``wait``
        makes), asked from that body: None while the stack is empty (a
        plain root function: its waits are the root's, ``start``'s
        ``scope``), or while a call run inline that has no frame yet runs."""
        stack = self.stack
        if not stack:
            return None
        top = stack[-1]
        body = top.body
        return top if body is None or _is_running(body) else None

    def wait(self, value: Any) -> Any:
        """``dask_coro.result(value)`` inside a body, at any call depth: a
        yield of the body that is running, whose stack stays parked in this
        greenlet until the yield's results are in. Returns them in the shape
        of ``value``, or raises a child's error here."""
        if self._closing:
            raise GreenletExit
        me = getcurrent()
        stack = self.stack
        made = False
        if not stack:
            # The root is a plain function, waiting before it returned.
            frame = _frame(self.name, None, 0, None, None)
            frame.scope = self._root_scope
            made = True
        else:
            top = stack[-1]
            body = top.body
            if body is None or _is_running(body):
                frame = top  # top's own body (or a call of it that got its frame here before)
            else:
                # A call of top's current yield is running (the one started
                # last): it gets its frame now, as it would at its first yield.
                pos = top.todo[top.next - 1]
                # What the call changed so far is its own.
                frame = _frame(top.leaves[pos].__dask_coro_inline__, top, pos, None, copy_context())
                made = True
        if made:
            stack.append(frame)
        if type(value) is Request:
            value = value.value
        if not self._yield(frame, value, self.annotations_now()):
            error = self._yielded(frame, value)
            if error is not None:
                if made:
                    stack.pop()
                raise error
        frame.body = _Parked(me, frame.body, frame.up is None)
        self.parked += 1
        if frame.remote and frame.todo:
            # Start the remote leaves now; they run while the inline ones do:
            # back to the caller with them, then the loop goes on.
            frame.sent = len(frame.remote)
            return _resumed(me.parent.switch(Submit([(frame, list(frame.remote))], False, frame)))
        # The loop goes on in another greenlet: an idle one of the pool
        # straight away (its outcome goes to our caller, the same parent);
        # else the caller makes one. Only the caller makes greenlets: a new
        # greenlet starts at the recursion depth of the code that starts it,
        # and this code may be deep in a body.
        if _pool():
            return _resumed(_dispatch(me.parent, self, self._loop, (None, None)))
        return _resumed(me.parent.switch(_CONTINUE))

    # -- greenlets -----------------------------------------------------------

    def _enter(self, fn: Callable[..., Outcome], args: tuple[Any, ...]) -> Outcome:
        """Run ``fn(*args)`` (the loop, or the root's first call) on a loop
        greenlet and return the ``Outcome`` it comes to. Parking and handing
        back happen between loop greenlets (``wait``, ``_serve``); we only
        make a loop greenlet when a body parked and none was idle."""
        hub = getcurrent()
        out = _dispatch(hub, self, fn, args)
        while out is _CONTINUE:  # a body parked with no idle loop greenlet here
            out = _dispatch(hub, self, self._loop, (None, None))
        assert type(out) in _OUTCOMES, out
        return out  # type: ignore[no-any-return]

    def _begin(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Outcome:
        stack = self.stack
        try:
            body = func(*args, **kwargs)
        except BaseException as e:  # a body may raise anything
            if self._closing:
                raise
            if stack:
                self._call_ended()
            return Done(Raised(e))
        typ = type(body)
        if typ is not _GENERATOR and typ is not _COROUTINE:
            if stack:
                self._call_ended()
            return Done(Returned(body))  # a plain function
        if stack:
            stack[0].body = body  # it waited, then returned a body to run
        else:
            root = _frame(self.name, None, 0, body, None)
            root.scope = self._root_scope
            stack.append(root)
        return self._loop(body.send, None)

    def _call_ended(self) -> None:
        """A call that waited in ``wait`` (and got its frame there) returned
        or raised without a yield since: its frame goes."""
        frame = self.stack.pop()
        frame.done = True
        frame.body = None
        if frame.scope is not None:
            self._ended(frame)

    # -- the loop ------------------------------------------------------------

    def _loop(self, method: Callable[[Any], Any] | None, arg: Any) -> Outcome:
        """Run the loop (``_steps``), back in the run's own context when it
        stops; with ``count``, add the calls it started to ``calls`` then."""
        scratch = _Scratch()
        run = None if self.calls is None else [None, 0]
        try:
            return self._steps(method, arg, run, scratch)
        finally:
            scratch.home()
            if run is not None and run[1]:
                self._started(run[0], run[1])

    def _steps(
        self, method: Callable[[Any], Any] | None, arg: Any, run: list[Any] | None, scratch: _Scratch
    ) -> Outcome:
        """``method(arg)`` steps the top frame's body (its ``send`` or
        ``throw``); None: go on with the top frame's current yield.

        The one place bodies are stepped, and the hot path of fine-grained
        recursion, in four named parts that the compiled loop follows too:
        *step a body* (``_Scratch.step_in``: in the context the rules give it),
        *set up its yield* (``_yield``, or ``_yielded`` for any yield but a
        list or tuple of inline calls), *run the next inline call* (a call and
        its body's first step, in a copy of its parent's context) and
        *deliver* a value to the leaf that asked for it (``_deliver``). A call
        that returns without yielding never gets a frame (``fresh`` is its
        position in the top frame's yield while a step of its body runs here;
        a body that yields gets one, ``_frame``), and no step object is made
        per yield or return. Where the hot path takes a step (a call's first
        step, a generator resumed at a yield of inline calls), the step is
        written out, not called: a Python call costs more than most inline
        calls. Bodies step in the context ``scratch`` switched to, no
        ``Context.run`` a step (``_Scratch``). With ``run`` (counting), the
        calls started are counted in runs of one function: ``run`` is
        ``[func, n]``."""
        stack = self.stack
        idle = self.idle
        call_type = self.call_type
        countdown = self.check_every
        ann_now = self.annotations_now  # the annotations in effect at a yield
        own = self.own_annotations  # the run's own: a yield under others is set up by _yielded
        barren = False  # a look found nothing to hand out, no yield of calls since
        top = stack[-1]
        fresh = -1  # >= 0: the body stepped is a call of top's leaf ``fresh``, no frame yet
        body: Any = None  # with fresh: that body, made by calling ``func``
        func: Any = None
        fctx: Any = None  # with fresh: that call's context (``Frame.ctx``)
        out: Any = None
        ended = 0
        foreign = False  # the body stepped awaited something of an event loop
        fast = self.fast
        while True:
            if method is not None:
                # -- step a body: the one place ------------------------------
                if method is not _STEPPED:
                    try:
                        if fresh >= 0:
                            scratch.step_in(fctx, top.ctx)
                        else:
                            up = top.up
                            scratch.step_in(top.ctx, _ROOT if up is None else up.ctx)
                        out = method(arg)
                    except StopIteration as stop:
                        scratch.took()  # what it set goes with it
                        out = stop.value
                        ended = _RETURNED
                    except BaseException as e:  # a body may raise anything
                        if type(e) is _Transfer:
                            # ``top`` is parked: hand back to its greenlet.
                            top.body = e.parked.body
                            self.parked -= 1
                            return e  # type: ignore[return-value]
                        if self._closing:
                            raise  # unwinding a parked body (close)
                        scratch.took()
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
                        took = scratch.took()
                        if took is not None:  # the body's own from now on
                            if fresh >= 0:
                                fctx = took
                            else:
                                top.ctx = took
                        if type(out) is Request:
                            out = out.value
                        elif type(method.__self__) is _COROUTINE:  # type: ignore[attr-defined]
                            # An async body awaited something foreign (an asyncio
                            # future, ...): the caller's event loop waits for it,
                            # or, with none, raise at that await, as it would see.
                            if not self.awaits:
                                method = method.__self__.throw  # type: ignore[attr-defined]
                                arg = foreign_await(func if fresh >= 0 else top.func, out)
                                continue
                            foreign = True
                method = None
                if not ended:
                    if fresh >= 0:
                        if stack[-1] is top:
                            # Its first yield: it gets its frame.
                            top = _frame(func, top, fresh, body, fctx)
                            stack.append(top)
                        else:  # it waited in wait() before this yield: it has a frame
                            top = stack[-1]
                            top.body = body
                        fresh = -1
                        body = None
                    if foreign:
                        return self._await(top, out)
                    # -- set up the yield ``out``, in its body's context (the
                    # current one: the body was stepped in it) ----------------
                    if not self._yield(top, out, ann_now()):
                        error = self._yielded(top, out)
                        took = scratch.took()
                        if took is not None:  # what setting it up set is the body's
                            top.ctx = took
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
                        if stack[-1] is not top:
                            scratch.home()
                            self._call_ended()
                        if ended is _RAISED and run is not None:
                            self._failed(func)
                    else:
                        stack.pop()
                        top.done = True
                        top.body = None
                        if top.scope is not None:
                            scratch.home()
                            self._ended(top)
                        if not stack:
                            return Done(Raised(out) if ended is _RAISED else Returned(out))
                        if ended is _RAISED and run is not None:
                            self._failed(top.func)
                        at = top.at
                        top = stack[-1]
                    if ended is _RAISED:
                        scratch.home()
                        if self.child_error is not None:
                            out = self.child_error(out)
                        _fail(top.leaves[at], out)
                        self._abandon(top)
                        method, arg = top.body.throw, out
                        continue
                    _deliver(top, at, out)
                    out = None
            # -- go on with top's current yield: the next inline call, else
            # wait for the remote leaves, else resume it ---------------------
            todo = top.todo
            end = len(todo)
            leaves = top.leaves
            while True:
                if fast is not None:
                    # The compiled loop runs the common case. Where it stops,
                    # this iteration runs here (None: it did nothing; SLOW:
                    # it went on from here), or a body is stepped (BREAK),
                    # or the root returned (DONE). See accel. It starts in the
                    # run's own context, and switches as the rules say.
                    scratch.home()
                    r = fast(self, top, run, countdown, barren, stack, idle, call_type, ann_now, own)
                    if r is not None:
                        top, countdown, barren = r.top, r.countdown, r.barren
                        if r.code == _FAST_BREAK:
                            method, arg, out, ended = r.method, r.arg, r.out, r.ended
                            fresh, body, func, fctx = r.fresh, r.body, r.func, r.ctx
                            if method is _STEPPED and not ended:
                                # It stepped a body that yielded: set that up
                                # here, in the body's context.
                                if fresh >= 0:
                                    scratch.step_in(fctx, top.ctx)
                                else:
                                    scratch.step_in(top.ctx, _ROOT if top.up is None else top.up.ctx)
                            break
                        if r.code == _FAST_DONE:
                            return Done(Returned(r.out))
                        todo = top.todo
                        end = len(todo)
                        leaves = top.leaves
                i = top.next
                if i >= end:
                    # -- top's yield is done: resume it ----------------------
                    if top.remote:
                        if top.sent < len(top.remote) or self._has_unstarted():
                            return Submit(self._promote_all(), True, top)
                        return Submit([], True, top)
                    if self.stop:
                        # Cancelled (or paused) at a yield that needs no call
                        # and no wait (plain values): the body is closed at
                        # its yield as any other; ``run()`` resumes it here.
                        return Stopped()
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
                    top.ann = None
                    if top.scope is not None:
                        scratch.home()
                        self._ended(top)
                        method, arg = top.body.send, value
                        break
                    if type(top.body) is not _GENERATOR:  # async, or parked
                        method, arg = top.body.send, value
                        break
                    # The common case, stepped here: a generator with no
                    # scope, whose next step yields a list or tuple of inline
                    # calls, or returns.
                    # In its context (``_Scratch.step_in``, written out).
                    up = top.up
                    ctx = top.ctx
                    if up is None:
                        scratch.home()
                    elif ctx is not up.ctx:  # a context of its own
                        if scratch.cur is not ctx:
                            scratch.enter(ctx)  # type: ignore[arg-type]
                    elif scratch.of is not ctx:  # a copy of its parent's
                        scratch.copy(ctx)
                    try:
                        y = top.body.send(value)
                    except StopIteration as stop:
                        if scratch.of is not _NO_COPY and scratch.cur != scratch.ref:
                            scratch.of = _NO_COPY  # what it set goes with it
                        stack.pop()
                        top.done = True
                        top.body = None
                        if not stack:
                            return Done(Returned(stop.value))
                        at = top.at
                        top = stack[-1]
                        value = stop.value
                        top.results[at] = value
                        leaf = top.leaves[at]
                        leaf.__dask_coro_value__ = value
                        leaf.__dask_coro_inline__ = None
                        todo = top.todo
                        end = len(todo)
                        leaves = top.leaves
                        continue
                    except BaseException as e:
                        if self._closing:
                            raise  # unwinding a parked body (close)
                        scratch.took()
                        method, out, ended = _STEPPED, e, _RAISED
                        break
                    if scratch.of is not _NO_COPY and scratch.cur != scratch.ref:
                        top.ctx = scratch.cur  # it changed the copy: its own now
                        scratch.of = _NO_COPY
                    del value
                    # Its yield, when the common one (``_yield``, written out).
                    yt = type(y)
                    if (yt is list or yt is tuple) and ((a := ann_now()) is own or not a):
                        for x in y:
                            if type(x) is not call_type or (
                                x.__dask_coro_inline__ is None and x.__dask_coro_value__ is NOT_DONE
                            ):
                                break
                        else:
                            n = len(y)
                            top.index += 1
                            top.shape = yt
                            top.leaves = leaves = y
                            top.results = [_PENDING] * n
                            top.todo = todo = _RANGES[n] if n < _NRANGES else tuple(range(n))
                            top.next = 0
                            top.remote = _EMPTY
                            top.sent = 0
                            top.ann = None
                            end = n
                            continue
                    method, out, ended = _STEPPED, y, 0
                    if type(out) is Request:
                        out = out.value
                    break
                # -- the next inline call -----------------------------------
                # A look that found nothing to hand out (every frame's calls
                # started, but top's next) finds nothing until a yield of two
                # or more calls: the next look comes at that yield's first.
                if not i and end > 1:
                    barren = False
                if idle.n > 0 and not barren:
                    batches = self._steal(idle.n)
                    if batches:
                        return Submit(batches, False, top)
                    todo = top.todo
                    end = len(todo)
                    barren = True
                pos = todo[i]
                top.next = i + 1
                leaf = leaves[pos]
                func = leaf.__dask_coro_inline__
                if func is not None and type(leaf) is not call_type and _needs_handed_out(leaf):
                    # A value computed in place whose call was handed out
                    # meanwhile (stolen at another position): planned as the
                    # leaf, on that call's key, it does not run it again.
                    self._to_remote(top, (pos,))
                    continue
                if func is None:
                    done = leaf.__dask_coro_value__
                    if done is not NOT_DONE:
                        if type(done) is Failed:
                            # It raised before: raised again at this yield.
                            scratch.home()
                            self._abandon(top)
                            method, arg = top.body.throw, done.error
                            break
                        top.results[pos] = done
                        continue
                    # Handed out meanwhile at another position (the same call
                    # object yielded twice, stolen there): wait for that task.
                    self._to_remote(top, (pos,))
                    continue
                if self.stop:
                    # Cancelled, or paused: no call starts after this read
                    # (one attribute load per call; fib(25) measures no
                    # cost). This leaf is next again, so ``run()`` goes on
                    # from here after a pause.
                    top.next = i
                    return Stopped()
                countdown -= 1
                if not countdown:
                    countdown = self.check_every
                    scratch.home()  # the caller's code runs in the run's own context
                    if run is not None and run[1]:
                        # What call_counts reads, now and then while we run.
                        self._started(run[0], run[1])
                        run[1] = 0
                    if self.cancelled is not None and self.cancelled():
                        return Stopped()
                args = leaf.__dask_coro_args__
                if run is not None:
                    if func is run[0]:
                        run[1] += 1
                    else:
                        if run[1]:
                            self._started(run[0], run[1])
                        run[0] = func
                        run[1] = 1
                # The call, and its body's first step, in one copy of top's
                # context (``_Scratch``): the call's own if they changed it.
                base = top.ctx
                if scratch.of is not base:
                    scratch.copy(base)
                try:
                    out = func(*args)
                except BaseException as e:
                    if self._closing:
                        raise  # unwinding a parked body (close)
                    scratch.took()  # what it set goes with it
                    scratch.home()
                    if self.child_error is not None:
                        e = self.child_error(e)
                    _fail(leaf, e)
                    if run is not None:
                        self._failed(func)
                    if stack[-1] is not top:
                        self._call_ended()
                    self._abandon(top)
                    method, arg = top.body.throw, e
                    break
                if type(out) is _GENERATOR and stack[-1] is top:
                    # Its first step, here: most calls of fine-grained
                    # recursion return at once, with no frame and no trip
                    # through the step above; the rest mostly yield a list or
                    # tuple of inline calls, and get their frame here.
                    try:
                        y = out.send(None)
                    except StopIteration as stop:
                        if scratch.cur != scratch.ref:  # what it set goes with it
                            scratch.of = _NO_COPY
                        if stack[-1] is not top:  # it waited in wait(), then returned
                            fresh, body, method = pos, out, _STEPPED
                            out, ended = stop.value, _RETURNED
                            break
                        value = stop.value
                        top.results[pos] = value
                        leaf.__dask_coro_value__ = value
                        leaf.__dask_coro_inline__ = None
                        continue
                    except BaseException as e:
                        if self._closing:
                            raise  # unwinding a parked body (close)
                        scratch.took()
                        fresh, body, method = pos, out, _STEPPED
                        out, ended = e, _RAISED
                        break
                    if scratch.cur != scratch.ref:  # it is the call's own now
                        fctx = scratch.cur
                        scratch.of = _NO_COPY
                    else:
                        fctx = base
                    yt = type(y)
                    if stack[-1] is top and (yt is list or yt is tuple):
                        # Its frame (``_frame``) and its yield, when the
                        # common one (``_yield``), written out.
                        new = _new_frame(Frame)
                        new.body = out
                        new.func = func
                        new.done = False
                        new.up = top
                        new.at = pos
                        new.index = -1
                        new.scope = None
                        new.remote = _EMPTY
                        new.sent = 0
                        new.ann = None
                        new.ctx = fctx
                        top = new
                        stack.append(top)
                        if (a := ann_now()) is own or not a:
                            for x in y:
                                if type(x) is not call_type or (
                                    x.__dask_coro_inline__ is None and x.__dask_coro_value__ is NOT_DONE
                                ):
                                    break
                            else:
                                n = len(y)
                                top.index = 0
                                top.shape = yt
                                top.leaves = leaves = y
                                top.results = [_PENDING] * n
                                top.todo = todo = _RANGES[n] if n < _NRANGES else tuple(range(n))
                                top.next = 0
                                end = n
                                continue
                        method, out, ended = _STEPPED, y, 0  # set up by ``_yielded``
                        break
                    fresh, body, method = pos, out, _STEPPED
                    ended = 0
                    out = y.value if type(y) is Request else y
                    break
                fctx = scratch.took()
                if fctx is None:
                    fctx = base
                if type(out) is _GENERATOR or type(out) is _COROUTINE:
                    if stack[-1] is not top:
                        # It waited, then returned a body: run that in its frame.
                        fresh, body = -1, None
                        top = stack[-1]
                        top.body = out
                        method, arg = out.send, None
                        break
                    fresh, body = pos, out
                    method, arg = out.send, None
                    break
                if stack[-1] is not top:
                    # It waited in wait(), then returned; meanwhile other
                    # loops may have promoted top's later leaves.
                    scratch.home()
                    self._call_ended()
                    todo = top.todo
                    end = len(todo)
                    leaves = top.leaves
                _deliver(top, pos, out)

    def _yield(self, frame: Frame, value: Any, ann: Any) -> bool:
        """Set up ``frame``'s new yield ``value`` if it is the common one: a
        list or tuple of inline calls (or calls computed already), made under
        no annotations but the run's own (``ann``, those in effect at the
        yield). False: it is not, nothing is set (``_yielded`` sets it up)."""
        shape = type(value)
        if (shape is not list and shape is not tuple) or (ann and ann is not self.own_annotations):
            return False
        call_type = self.call_type
        for x in value:
            if type(x) is not call_type or (
                x.__dask_coro_inline__ is None and x.__dask_coro_value__ is NOT_DONE
            ):
                return False
        n = len(value)
        frame.index += 1
        frame.shape = shape
        frame.leaves = value
        frame.results = [_PENDING] * n
        frame.todo = _RANGES[n] if n < _NRANGES else tuple(range(n))
        frame.next = 0
        frame.remote = _EMPTY
        frame.sent = 0
        frame.ann = None
        return True

    def _await(self, frame: Frame, obj: Any) -> Await:
        """``frame``'s body awaited ``obj`` of an event loop: the stack waits
        for it, so every unstarted inline call is promoted, as before a wait."""
        if frame.index < 0:  # no yield before: nothing of one to promote
            frame.shape = None
            frame.leaves = _EMPTY
            frame.results = _EMPTY
            frame.todo = _EMPTY
            frame.next = 0
        return Await(self._promote_all(), frame, obj)

    def _yielded(self, frame: Frame, value: Any) -> Exception | None:
        """Set up ``frame``'s new yield. Returns the error to raise at the
        yield if it was rejected, else None."""
        frame.index += 1
        frame.next = 0
        frame.remote = _EMPTY
        frame.sent = 0
        # Under annotations of its own, a yield runs nothing inline and
        # computes nothing in place: each leaf is a task carrying them.
        ann = frame.ann = self.annotated()
        call_type = self.call_type
        if type(value) is call_type and (
            value.__dask_coro_inline__ is not None or value.__dask_coro_value__ is not NOT_DONE
        ):
            frame.shape = None
            frame.leaves = (value,)
            frame.results = [_PENDING]
            if ann is not None and value.__dask_coro_inline__ is not None:
                frame.todo = _EMPTY
                frame.remote = [0]
            else:
                frame.todo = _ONE
            return None
        if isinstance(value, InPlace):
            if value.__dask_coro_inline__ is None:
                frame.todo = _EMPTY
                frame.leaves = _EMPTY
                return RuntimeError(f"coroutine {frame.label!r} yielded {value!r} a second time")
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
        localize = None if ann is not None else self.localize
        leaves = structure.leaves
        for pos, leaf in enumerate(leaves):
            if type(leaf) is call_type and (
                leaf.__dask_coro_inline__ is not None or leaf.__dask_coro_value__ is not NOT_DONE
            ):
                if ann is None or leaf.__dask_coro_inline__ is None:
                    todo.append(pos)  # to run inline, or computed already
                else:
                    remote.append(pos)
                continue
            if localize is not None:
                try:
                    local = localize(frame, leaf)
                except Exception as e:
                    frame.todo = _EMPTY
                    frame.leaves = _EMPTY
                    return e
                if local is not None:
                    # Computed in place: an inline call standing for the leaf
                    # (handed out, it is planned as the leaf itself).
                    leaves[pos] = local
                    todo.append(pos)
                    continue
            remote.append(pos)
        frame.todo = todo
        frame.remote = remote
        return None

    def _abandon(self, frame: Frame) -> None:
        """``frame``'s current yield ends in an error: start nothing more of it."""
        frame.leaves = _EMPTY
        frame.results = _EMPTY
        frame.todo = _EMPTY
        frame.next = 0
        frame.remote = _EMPTY
        frame.sent = 0
        frame.shape = None
        frame.ann = None
        if frame.scope is not None:
            self._ended(frame)


class _Scratch:
    """The context a body steps in, and a call runs in. Each inline call
    runs in a context of its own, a copy of its parent's taken when it
    starts, so that what it sets in a ``ContextVar`` never reaches its parent
    or its siblings (as a task's does not reach the task that made it); its
    body's steps run in that context, the very one, so that a variable set
    before a yield is reset after it (``with dask.annotate(...)`` around a
    yield). The rules, by ``Frame.ctx``:

    - the root steps in the run's own context (``_ROOT`` as its parent's);
    - a body that changed a variable once has a context of its own (its
      ``ctx`` is not its parent's) and steps in it;
    - a call, and a body that changed nothing yet (its ``ctx`` is its
      parent's), run in a copy of that.

    A copy per call would cost more than most calls, and so would entering
    a context per step (``Context.run``). The loop runs in the context it
    last switched its greenlet to (``cur``: ``gr_context`` of the running
    greenlet is the thread's current context), and switches only when the
    rules ask for another: one copy (``of``: a frame's ``ctx``, or None for
    the run's own) serves every step that changes nothing in it; a step that
    changed it (it is no longer equal to ``ref``, what it copies) gives it to
    the body stepped (``took``), and the next step in a copy gets a new one.
    The loop's bookkeeping reads no context variable, so it runs in
    whichever context is current; what it calls of its caller
    (``cancelled``, ``on_ended``, ``child_error``) runs in the run's own, as
    does everything once the loop stops (``leave``)."""

    __slots__ = ("me", "own", "cur", "of", "ref")

    def __init__(self) -> None:
        me = self.me = getcurrent()
        own = me.gr_context
        if own is None:
            # No context in this greenlet yet: make the one a first set would.
            copy_context()
            own = me.gr_context
        self.own: Context = own
        self.cur: Context = own  # current: the run's own, a body's own, or the copy
        self.of: Any = _NO_COPY  # the base ``cur`` is an unchanged copy of, else _NO_COPY
        self.ref: Context | None = None  # what the copy holds (the run's: a copy of it)

    def home(self) -> None:
        """Switch to the run's own context (the loop stops, or calls its
        caller's code)."""
        if self.cur is not self.own:
            self.me.gr_context = self.cur = self.own
            self.of = _NO_COPY

    def enter(self, ctx: Context) -> None:
        """Switch to a body's own context."""
        self.me.gr_context = self.cur = ctx
        self.of = _NO_COPY

    def copy(self, base: Context | None) -> None:
        """Switch to a new copy of ``base`` (None: of the run's own context)."""
        ref = self.ref = self.own.copy() if base is None else base
        self.me.gr_context = self.cur = ref.copy()
        self.of = base

    def step_in(self, ctx: Context | None, up: Any) -> None:
        """Switch to where a step of a body whose context is ``ctx`` and
        whose parent's is ``up`` (``_ROOT``: the root) runs, by the rules
        above (the hot paths of ``_steps`` take this step written out)."""
        if up is _ROOT:
            self.home()
        elif ctx is not up:
            if self.cur is not ctx:
                self.enter(ctx)  # type: ignore[arg-type]
        elif self.of is not ctx:
            self.copy(ctx)

    def took(self) -> Context | None:
        """After a step (or a call) in a copy: the copy if it changed it (the
        stepped body's from now on; a call or body that ended takes what it
        set with it), else None."""
        if self.of is _NO_COPY or self.cur == self.ref:
            return None
        self.of = _NO_COPY
        return self.cur


def _step_alone(ctx: Context | None, up: Any, fn: Callable[[Any], Any], arg: Any) -> Any:
    """``fn(arg)``, a step of a body outside the loop (closing it), in the
    context the rules of ``_Scratch`` give it."""
    if up is _ROOT:
        return fn(arg)
    if ctx is not up:
        return ctx.run(fn, arg)  # type: ignore[union-attr]
    return (copy_context() if ctx is None else ctx).copy().run(fn, arg)


def _frame(func: Any, up: Frame | None, at: int, body: Any, ctx: Context | None) -> Frame:
    """The one way a frame is made: ``body`` (None for a call that waits
    before it has one) of the call of ``func`` at position ``at`` of its
    parent ``up``'s current yield (None: the root), stepping in ``ctx`` (see
    ``_Scratch``). Its yield is set up by its first (``_yield``/``_yielded``)."""
    frame = _new_frame(Frame)
    frame.body = body
    frame.func = func
    frame.done = False
    frame.up = up
    frame.at = at
    frame.index = -1
    frame.scope = None
    frame.remote = _EMPTY
    frame.sent = 0
    frame.ann = None
    frame.ctx = ctx
    return frame


def _deliver(frame: Frame, pos: int, value: Any) -> None:
    """The call at position ``pos`` of ``frame``'s current yield returned
    ``value``: its result, kept on the call too (``InlineCall``), so that a
    call yielded again is not run again."""
    frame.results[pos] = value
    leaf = frame.leaves[pos]
    leaf.__dask_coro_value__ = value
    leaf.__dask_coro_inline__ = None


def _closing_error(frame: Frame, body: Any, error: BaseException) -> BaseException:
    """What closing ``frame``'s body raised, as the caller reports it. A body
    that yielded (or awaited) in its cleanup once ``GeneratorExit`` was raised
    at its yield makes Python raise ``RuntimeError('generator ignored
    GeneratorExit')``, which names neither the body nor the mistake: say both.
    The body is then closed once more, so that its unfinished cleanup ends here
    (``GeneratorExit`` at that yield) and not when it is garbage collected,
    which would report the same error again."""
    if type(error) is not RuntimeError or error.args not in _IGNORED_EXIT:
        return error
    waited = "awaited" if type(body) is _COROUTINE else "yielded"
    clear = RuntimeError(
        f"coroutine {frame.label!r} {waited} in its cleanup after it was cancelled; a cancelled "
        f"body cannot wait: its finally blocks must not yield or await"
    )
    clear.__cause__ = error
    try:
        body.close()
    except BaseException as again:  # still waiting: left to the collector, reported once
        if type(again) is not RuntimeError or again.args not in _IGNORED_EXIT:
            clear.__context__ = again
    return clear


#: What Python raises when a closed generator or coroutine yields instead of ending.
_IGNORED_EXIT = (("generator ignored GeneratorExit",), ("coroutine ignored GeneratorExit",))


def current_trampoline() -> Trampoline | None:
    """The trampoline whose loop runs here, or None outside any body."""
    return getattr(getcurrent(), _ATTR, None)


_PENDING: Any = object()
_FOLD = 100  # levels of a frame name nested before it is folded
_GENERATOR = types.GeneratorType
_COROUTINE = types.CoroutineType
_ONE = (0,)
_NRANGES = 64
#: A yield's positions, made once; tuples (indexing a range is slower).
_RANGES = [tuple(range(n)) for n in range(_NRANGES)]
_STEPPED: Any = object()  # as ``method``: the body was stepped already, ``out`` is what came of it
_new_frame = object.__new__
#: As a step's parent's context: the root's (it steps in the run's own).
_ROOT: Any = object()
#: As ``_Scratch.of``: the context current is no copy (the run's own, a body's own).
_NO_COPY: Any = object()
#: ``annotations`` when the caller gives none: a ContextVar nobody sets.
_NO_ANNOTATIONS: Callable[[], Any] = ContextVar("dask_coro_no_annotations", default=None).get
_RETURNED = 1
_RAISED = 2
_FAST_BREAK = 1
_FAST_DONE = 2

if accel.cengine is not None:
    # What the compiled loop shares with this module: it reads and writes
    # the slots of these very classes.
    accel.cengine.setup(
        Trampoline=Trampoline,
        Frame=Frame,
        Idle=Idle,
        NOT_DONE=NOT_DONE,
        PENDING=_PENDING,
        STEPPED=_STEPPED,
        EMPTY=_EMPTY,
        RANGES=_RANGES,
        Failed=Failed,
        Request=Request,
    )
    assert (accel.cengine.BREAK, accel.cengine.DONE) == (_FAST_BREAK, _FAST_DONE)
