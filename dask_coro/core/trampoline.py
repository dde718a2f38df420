"""Run a coroutine and the coroutine calls it yields inline, Cilk-style.

Pure: no dask, no distributed, no threads. A ``Trampoline`` drives a stack of
``Frame`` objects, one per running body, each through its own ``Driver``. When
a body yields, each leaf of what it yielded is either

- *inline*: a coroutine call the trampoline may run here, as a plain call
  through a ``Driver`` (depth first, in order), with no task, no key and no
  scheduler message; or
- *remote*: anything else (a ``Delayed``, a ``Future``, a collection, a call
  whose arguments hold lazy values): the caller (the worker runner, or the
  in-process driver) computes it and hands the results back.

The trampoline never talks to a cluster: it returns ``Submit`` to ask the
caller to start remote leaves, and to wait for the top frame's when ``wait``.
Before any wait, every inline leaf not started yet anywhere on the stack is
turned remote (*promoted*), so that work which could run does run while this
stack waits, and a child that waits on a sibling cannot deadlock. While the
caller reports idle capacity elsewhere (``idle.n > 0``), the oldest unstarted
leaves are promoted without waiting: this is how work is stolen.

Semantics kept: results come back in the yielded shape; a child's exception is
raised at its parent's yield (siblings not started then never start); closing
the trampoline closes every open body, innermost first.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Hashable
from typing import Any

from .driver import Driver, Raised, Request, Returned, Step, Yielded
from .structure import Path, Structure

_PENDING: Any = object()


class Frame(Driver):
    """One running body on the stack: a ``Driver``, and the state of its
    current yield.

    ``at`` is the position of this body's call in its parent's current yield.
    For the current yield: ``leaves``/``results`` by position, ``todo`` the
    positions to run inline (``next`` of them started), ``remote`` the positions
    the caller computes (``sent`` of them handed out). ``ext`` belongs to the
    caller (its per-frame state: futures, cache).
    """

    __slots__ = (
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
        "ext",
    )

    def __init__(self, name: Any, up: Frame | None, at: int, body: Any = None):
        # Driver.__init__, inlined: a frame is made per body run inline.
        # ``name`` may be the function: its name is only read for errors.
        self._body = body
        self._is_async = False
        self.name = name
        self.done = False
        self.up = up
        self.at = at
        self.index = -1
        self.ext: Any = None
        self.remote: Any = _EMPTY
        self.sent = 0
        # The rest is set by each yield.

    def path(self, pos: int) -> Path:
        """Where leaf ``pos`` sits in what this frame yielded."""
        shape = self.shape
        if type(shape) is Structure:
            return shape.paths[pos]
        return () if shape is None else (pos,)

    def ident(self, root: Hashable) -> Any:
        """A stable name for this frame, for deriving its children's keys: the
        root's key, then (yield index, path) of each call down to this one."""
        chain = []
        frame = self
        while frame.up is not None:  # iterative: inline stacks may be deep
            chain.append(frame)
            frame = frame.up
        out = root
        for depth, frame in enumerate(reversed(chain), 1):
            up = frame.up
            out = (out, up.index, up.path(frame.at))  # type: ignore[union-attr]
            if depth % _FOLD == 0:
                # Fold the nested name into a digest now and then: keys are
                # derived from its repr, which recurses once per level.
                out = "frame-" + hashlib.blake2b(repr(out).encode(), digest_size=16).hexdigest()
        return out


class Done:
    """The root body finished: ``step`` is ``Returned`` or ``Raised``."""

    __slots__ = ("step",)

    def __init__(self, step: Step):
        self.step = step


class Submit:
    """Start ``batches`` (``[(frame, positions)]``) remotely; then, if ``wait``,
    wait for the remote leaves of ``frame`` (the top one) and call ``resume``,
    else call ``run``."""

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
        The type of an inline-able call, or None to run nothing inline. An
        object ``c`` of this type runs inline when ``c._inline`` is
        ``(func, args, kwargs)``; when ``c._done`` is ``(value,)`` it was
        computed inline before and ``value`` is reused (compute once).
    mark_done
        ``mark_done(c, (value,))`` records that ``c`` computed ``value`` inline.
    classify
        ``classify(name, index) -> (obj, path) -> bool``, as for ``Structure``.
    idle
        Capacity elsewhere, as the caller last learned it (see ``Idle``).
    cancelled
        Asked every ``check_every`` calls run inline; True stops the run.
    on_ended
        Called, at once, with each frame with an ``ext`` whose yield ended
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
        mark_done: Callable[[Any, tuple], None] | None = None,
        idle: Idle | None = None,
        cancelled: Callable[[], bool] | None = None,
        check_every: int = 256,
        on_ended: Callable[[Frame], None] | None = None,
    ):
        self.name = name
        self.call_type = call_type
        self.classify = classify
        self.mark_done = mark_done or _set_done
        self.idle = idle or _NO_IDLE
        self.cancelled = cancelled
        self.check_every = check_every
        self.stack: list[Frame] = []
        #: Without ``on_ended``: frames with an ``ext`` whose yield ended, or
        #: whose body ended, since the caller last cleared the list.
        self.ended: list[Frame] = []
        self._ended = on_ended or self.ended.append

    # -- the caller's side ---------------------------------------------------

    def start(
        self, func: Callable[..., Any], args: tuple, kwargs: dict, ext: Any = None
    ) -> Outcome:
        """Start the root body; ``ext`` is the caller's state for its frame.
        Only frames with an ``ext`` (the caller sets it when it starts remote
        leaves of a frame) are reported in ``ended``."""
        root = Frame(self.name, None, 0)
        root.ext = ext
        self.stack = [root]
        return self._loop(root.start(func, args, kwargs))

    def run(self) -> Outcome:
        """Go on after a ``Submit`` that does not wait."""
        return self._loop(None)

    def resume(self, values: list[Any]) -> Outcome:
        """The remote leaves of the top frame computed ``values`` (in the order
        of its ``remote`` positions)."""
        top = self.stack[-1]
        results = top.results
        for pos, v in zip(top.remote, values, strict=True):
            results[pos] = v
        top.remote = []
        top.sent = 0
        return self._loop(None)

    def throw(self, error: BaseException) -> Outcome:
        """A remote leaf of the top frame failed (or could not be started):
        raise ``error`` at its yield."""
        top = self.stack[-1]
        self._abandon(top)
        return self._loop(top.throw(error))

    def close(self) -> list[BaseException]:
        """Close every open body, innermost first; what they raised closing."""
        errors = []
        while self.stack:
            frame = self.stack.pop()
            closed = frame.close()
            if closed is not None:
                errors.append(closed.error)
            if frame.ext is not None:
                self._ended(frame)
        return errors

    # -- the loop ------------------------------------------------------------

    def _loop(self, step: Step | None) -> Outcome:
        """``step`` is the newest step of the top frame; None: go on with the
        top frame's current yield.

        The hot path of fine-grained recursion: what ``Driver.start`` and
        ``Driver.send`` do is inlined here for generator bodies (a call that
        returns without yielding never gets a frame, and a generator's yields
        and returns make no ``Step`` object: ``y`` holds what the top frame
        yielded, ``ret`` what it returned); ``async def`` bodies and every
        error path go through the ``Driver`` methods."""
        stack = self.stack
        push = stack.append
        idle = self.idle
        mark_done = self.mark_done
        call_type = self.call_type
        countdown = self.check_every
        calm = 0
        y = ret = _NO
        while True:
            top = stack[-1]
            if step is not None:
                typ = type(step)
                if typ is Yielded:
                    y = step.value
                    step = None
                elif typ is Returned:
                    ret = step.value
                    step = None
                else:  # Raised
                    stack.pop()
                    top.done = True
                    top._body = None
                    if top.ext is not None:
                        self._ended(top)
                    if not stack:
                        return Done(step)
                    parent = stack[-1]
                    self._abandon(parent)
                    step = parent.throw(step.error)  # type: ignore[union-attr]
                    continue
            if y is not _NO:
                value = y
                y = _NO
                vt = type(value)
                if vt is list or vt is tuple:
                    # The common yield, set up here: calls only.
                    for x in value:
                        if type(x) is not call_type or x._inline is None and x._done is None:
                            break
                    else:
                        top.index += 1
                        top.shape = vt
                        top.leaves = value
                        top.results = [_PENDING] * len(value)
                        top.todo = range(len(value))
                        top.next = 0
                        vt = None
                if vt is not None:
                    step = self._yielded(top, value)
                    if step is not None:  # the yield itself was bad
                        continue
                    if top.remote and top.todo:
                        # Start the remote leaves now; they run while the
                        # inline ones do.
                        top.sent = len(top.remote)
                        return Submit([(top, list(top.remote))], False, top)
                value = None
            elif ret is not _NO:
                stack.pop()
                top.done = True
                top._body = None
                if top.ext is not None:
                    self._ended(top)
                if not stack:
                    return Done(Returned(ret))
                parent = stack[-1]
                parent.results[top.at] = ret
                mark_done(parent.leaves[top.at], (ret,))
                ret = _NO
                top = parent
            # Go on with top's current yield: the next inline leaf, else wait
            # for the remote ones, else resume it.
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
                done = leaf._done
                if done is not None:
                    top.results[pos] = done[0]
                    continue
                spec = leaf._inline
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
                except BaseException as e:  # noqa: B036 - a body may raise anything
                    self._abandon(top)
                    step = top.throw(e)
                    break
                typ = type(out)
                if typ is _GENERATOR:
                    try:
                        yv = out.send(None)
                    except StopIteration as stop:
                        out = stop.value  # returned without yielding: no frame
                    except BaseException as e:  # noqa: B036
                        self._abandon(top)
                        step = top.throw(e)
                        break
                    else:
                        child = Frame(func, top, pos, out)
                        push(child)
                        y = yv.value if type(yv) is Request else yv
                        break
                elif typ is _COROUTINE:
                    child = Frame(func, top, pos)
                    push(child)
                    step = child.begin(out)
                    break
                top.results[pos] = out
                mark_done(leaf, (out,))
            else:
                if top.remote:
                    if top.sent < len(top.remote) or self._has_unstarted():
                        return Submit(self._promote_all(), True, top)
                    return Submit([], True, top)
                shape = top.shape
                results = top.results
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
                if top.ext is not None:
                    self._ended(top)
                del results
                if top._is_async:
                    step = top.send(value)
                    continue
                try:  # Driver.send, inlined
                    yv = top._body.send(value)
                except StopIteration as stop:
                    ret = stop.value
                except BaseException as e:  # noqa: B036
                    step = Raised(e)
                else:
                    y = yv.value if type(yv) is Request else yv
                del value

    def _yielded(self, frame: Frame, value: Any) -> Step | None:
        """Set up ``frame``'s new yield. Returns the body's next step if the
        yield was rejected (the error is raised at the yield), else None."""
        frame.index += 1
        frame.next = 0
        frame.remote = _EMPTY
        frame.sent = 0
        call_type = self.call_type
        typ = type(value)
        # (A list or tuple of inline calls only is set up by _loop itself.)
        if typ is call_type and (value._inline is not None or value._done is not None):
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
            return frame.throw(e)
        frame.shape = structure
        frame.leaves = structure.leaves
        frame.results = [_PENDING] * len(structure.leaves)
        todo = frame.todo = []
        remote = frame.remote = []
        for pos, leaf in enumerate(structure.leaves):
            if type(leaf) is call_type and (leaf._inline is not None or leaf._done is not None):
                todo.append(pos)
            else:
                remote.append(pos)
        return None

    def _running(self) -> set[int]:
        """The calls being run by frames on the stack, by id: the same call
        object at another, unstarted position must not be handed out (it
        would run twice); it reuses the value when its turn comes."""
        return {id(f.up.leaves[f.at]) for f in self.stack[1:]}  # type: ignore[union-attr]

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
            frame.todo = todo = todo[:start] + [p for p in rest if p not in taken]
            n -= self._to_remote(frame, taken)
            if frame.sent < len(frame.remote):
                batches.append((frame, frame.remote[frame.sent :]))
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
                batches.append((frame, frame.remote[frame.sent :]))
                frame.sent = len(frame.remote)
        return batches

    @staticmethod
    def _to_remote(frame: Frame, positions: Any) -> int:
        """Hand ``positions`` to the caller, but for calls computed already;
        how many were handed."""
        if frame.remote is _EMPTY:
            frame.remote = []
        n = 0
        for p in positions:
            done = frame.leaves[p]._done
            if done is not None:
                frame.results[p] = done[0]
            else:
                frame.remote.append(p)
                n += 1
        return n

    def _abandon(self, frame: Frame) -> None:
        """``frame``'s current yield ends in an error: start nothing more of it."""
        self._clear(frame)
        if frame.ext is not None:
            self._ended(frame)

    @staticmethod
    def _clear(frame: Frame) -> None:
        frame.leaves = _EMPTY
        frame.results = _EMPTY  # type: ignore[assignment]
        frame.todo = _EMPTY
        frame.next = 0
        frame.remote = _EMPTY
        frame.sent = 0
        frame.shape = None


_EMPTY: Any = ()
_NO: Any = object()  # no value (a yielded or returned value may be None)
_FOLD = 100  # levels of a frame name nested before it is folded
_GENERATOR = types.GeneratorType
_COROUTINE = types.CoroutineType
_ONE = range(1)


def _set_done(call: Any, done: tuple) -> None:
    call._done = done
