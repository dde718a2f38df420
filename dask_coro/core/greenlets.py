"""The loop greenlets: how a body parks in ``Trampoline.wait`` and resumes.

Pure (greenlet is no event loop, no thread of its own). The engine's loop
always runs on a greenlet of its own, taken from a per-thread pool
(``_dispatch``, ``_serve``), so any body, at any call depth, can wait from
plain code: its stack stays *parked* in that greenlet (``_Parked`` stands for
its body on the frame), and the loop goes on in another greenlet of the
pool. Stepping a parked body raises ``_Transfer``: the loop hands back to the
parked greenlet, whose old loop, still on its stack, carries on. A parked
greenlet resumes only on the thread that made it. ``_kill`` unwinds one
(``GreenletExit`` at its ``wait``) when the trampoline closes.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

from greenlet import GreenletExit, getcurrent, greenlet

_ATTR = "dask_coro_trampoline"  # on a loop greenlet: the trampoline it runs
_POOL_SIZE = 16  # idle loop greenlets kept per thread
_LOCAL = threading.local()
_CONTINUE: Any = object()  # from wait(): make a loop greenlet, go on there


class _Parked:
    """A frame's body while it waits in ``wait``: its stack is in ``glet``.

    Stepping it (``send``/``throw``, as the loop steps any body) raises
    ``_Transfer``: the loop returns it, and ``_enter`` switches to ``glet``."""

    __slots__ = ("glet", "body", "root")

    def __init__(self, glet: greenlet, body: Any, root: bool = True):
        self.glet = glet
        self.body = body  # the frame's generator or coroutine; None for a call
        #: The root's: it waits in the run's own context, and resumes in the
        #: caller's; a call waits in a context of its own (entered in
        #: ``glet``: ``engine._Scratch``), and resumes in it.
        self.root = root

    def send(self, value: Any) -> Any:
        raise _Transfer(self, value, None)

    def throw(self, error: BaseException) -> Any:
        raise _Transfer(self, None, error)


class _Transfer(BaseException):
    """Internal, never raised out of the engine: resume a parked body."""

    def __init__(self, parked: _Parked, value: Any, error: BaseException | None):
        self.parked = parked
        self.value = value
        self.error = error


def _is_running(body: Any) -> bool:
    typ = type(body)
    if typ is _GENERATOR:
        return bool(body.gi_running)
    if typ is _COROUTINE:
        return bool(body.cr_running)
    return False


def _pool() -> list[greenlet]:
    try:
        return _LOCAL.pool  # type: ignore[no-any-return]
    except AttributeError:
        _LOCAL.pool = []
        return _LOCAL.pool  # type: ignore[no-any-return]


def _dispatch(hub: greenlet, tramp: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Run ``fn(*args)`` on an idle loop greenlet of this thread (or a new
    one), in the caller's context (context variables: ``current_key``)."""
    pool = _pool()
    glet = pool.pop() if pool else greenlet(_serve)
    glet.parent = hub
    glet.gr_context = hub.gr_context
    out = glet.switch((tramp, fn, args))
    return out.take() if type(out) is _Handoff else out


def _serve(job: Any) -> Any:
    """A loop greenlet: runs one job after another, idle in the pool between.

    Idle, it is suspended in a ``switch`` call, and a suspended frame keeps
    its locals and the call's arguments: so it holds nothing of the job it
    ran. What it hands on travels in a ``_Handoff`` the receiver empties.
    Otherwise an idle greenlet would keep the last trampoline, the values a
    body was resumed with, and the Futures among them (their keys then stay
    on the scheduler) until the greenlet is next used."""
    me = getcurrent()
    pool = _pool()
    while True:
        tramp, fn, args = job
        job = None
        setattr(me, _ATTR, tramp)
        try:
            out = fn(*args)
        finally:
            setattr(me, _ATTR, None)
        tramp = fn = args = None
        if type(out) is _Transfer:
            # Hand back to the parked body straight away (its outcomes go to
            # our caller); idle in the pool meanwhile.
            glet = out.parked.glet
            glet.parent = me.parent
            if out.parked.root:
                glet.gr_context = me.gr_context
            pool.append(me)
            hand = _Handoff(out.value, out.error)  # the error with its traceback: the child's frames
            out = None
            job = glet.switch(hand)
            del glet, hand
            continue
        if len(pool) >= _POOL_SIZE:
            return out
        pool.append(me)
        hand = _Handoff(out, None)
        out = None
        job = me.parent.switch(hand)
        del hand


class _Handoff:
    """A value (or an error to raise) handed from one greenlet to another;
    the receiver's ``take`` empties it, so the suspended sender keeps nothing."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any, error: BaseException | None):
        self.value = value
        self.error = error

    def take(self) -> Any:
        value, error = self.value, self.error
        self.value = self.error = None
        if error is not None:
            raise error
        return value


def _resumed(got: Any) -> Any:
    """What a parked ``wait`` was resumed with: the yield's results, or its error raised."""
    return got.take() if type(got) is _Handoff else got


def _kill(parked: _Parked, label: str) -> BaseException | None:
    """Unwind a parked body: ``GreenletExit`` at its ``wait``."""
    glet = parked.glet
    try:
        glet.parent = getcurrent()
        glet.throw(GreenletExit)
    except BaseException as e:  # it raised something else unwinding, or another thread's
        return e
    if not glet.dead:
        return RuntimeError(f"coroutine {label!r} ignored GreenletExit at dask_coro.result()")
    return None


_GENERATOR = types.GeneratorType
_COROUTINE = types.CoroutineType
