"""``dask_coro.group``: children delivered in completion order, a limit that
holds nothing while children queue, a deadline, and one way out.

A ``Group`` is the user's object; what happens to its children depends on
where it was opened, and one of three *backends* does it:

- in a body on a distributed worker (``group/worker.py``): each child is a
  task, submitted by the run as a yield's children are (keys derived from
  the run's key, held for a re-run), or, a small ``async def`` call, a run
  beside the parent's on its worker (``runtime/beside.py``); ``next()``
  waits on the event loop for the first to finish (the body's run holds no
  thread while it waits);
- in a body run without a cluster (``LocalBackend``, here): children run one
  at a time, oldest first, when ``next()`` asks, each delivered as it
  finishes;
- in plain client code (``group/client.py``): children are futures of the
  default client.

The pure part, which child starts, which waits and which is delivered next,
is ``group/book.py``. ``next()``, ``all()`` and ``aclose()`` return an
``InPlace`` request (``core/engine.py``): yielded or awaited in a body, the
engine runs the backend's wait right there, as a call of the body, whatever
else runs inline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..core.engine import current_trampoline
from .book import CANCELLED, Child, GroupBook, check_limit, leaves, rebuild, shaped
from .request import Request

__all__ = ["Child", "Group", "group"]

logger = logging.getLogger("dask_coro")


def group(limit: int | None = None, timeout: float | None = None, deadline: float | None = None) -> Group:
    """A group of children: spawn them, take each as it finishes, leave the
    block to cancel the rest.

    Parameters
    ----------
    limit
        At most this many children submitted or running at once; the rest
        wait in the parent as plain objects (no key, task, thread or slot)
        and start, oldest first, as others finish; None for no limit.
    timeout
        Seconds from now after which the group expires: its children are
        cancelled and the body's next wait inside the group (``next()``,
        ``all()``) raises ``TimeoutError``.
    deadline
        The same as an absolute time (``time.time()``); with both, the
        earlier. A group inside a child of a group with a deadline takes the
        tighter one (on a cluster), and a parent run again after its worker
        died keeps the first run's deadline.

    Notes
    -----
    Use it as ``with dask_coro.group() as g:`` in a generator body and in
    plain code, ``async with`` in an ``async def`` body. Leaving the block
    (return, break, an exception, the parent cancelled) cancels every child
    not yet delivered: coroutine children are closed at their current yield
    (their ``finally`` blocks run), children not started never start, and a
    plain function already running on a worker runs to its end, its result
    dropped (Dask cannot interrupt a thread, dask/distributed#4694). A
    child that had ended with an error never delivered is logged (warning,
    the ``dask_coro`` logger), never dropped silently.
    """
    check_limit(limit)
    for name, v in (("timeout", timeout), ("deadline", deadline)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v != v):
            raise TypeError(f"group {name}= must be a number of seconds or None, not {v!r}")
    if timeout is not None and timeout < 0:
        raise ValueError(f"group timeout= must be >= 0, not {timeout!r}")
    at = None if timeout is None else time.time() + timeout
    if deadline is not None:
        at = deadline if at is None else min(at, deadline)
    return Group(limit, at)


class Group:
    """See ``group``. ``len(g)``: children spawned and not yet delivered (nor
    cancelled); ``bool(g)``: whether there is one."""

    def __init__(self, limit: int | None, deadline: float | None):
        self.book = GroupBook(limit)
        self.deadline = deadline
        self.name = "group"
        self.lock = threading.Lock()
        self.expired = False
        self.entered = False
        self.backend: Any = None

    # -- the block -------------------------------------------------------------

    def _open(self) -> Group:
        if self.entered:
            raise RuntimeError("a group can be entered once")
        self.entered = True
        tramp = current_trampoline()
        if tramp is None:
            from .client import ClientBackend

            self.backend = ClientBackend(self)
        elif tramp.host is None:
            self.backend = LocalBackend(self)
        else:
            from .worker import WorkerBackend

            self.backend = WorkerBackend(self, tramp.host, tramp)
        return self

    def __enter__(self) -> Group:
        return self._open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> Group:
        return self._open()

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Cancel every child not yet delivered (see ``group``); no wait."""
        if self.backend is None:
            return
        stop = self.cancel_all()
        if stop is not None:
            self.backend.stop(stop, closing=True)

    def cancel_all(self, expire: bool = False) -> list[Child] | None:
        """Close the book: every child not yet delivered is cancelled; those
        to stop, or None if it was closed already. ``expire``: the deadline
        passed. An error a child ended with and the body was never given is
        logged, never dropped silently (as asyncio logs a task's exception
        never retrieved); a child cancelled here had not ended, and logs
        nothing."""
        with self.lock:
            if expire:
                self.expired = True
            if self.book.closed:
                return None
            lost = [(repr(c), e) for c, e in self.book.undelivered_errors()]
            stop = self.book.cancel_all()
        _log_lost(lost, "the group was closed first")
        return stop

    # -- children --------------------------------------------------------------

    def _backend(self) -> Any:
        if self.backend is None:
            raise RuntimeError("use a group inside its block: with dask_coro.group() as g: ...")
        return self.backend

    def spawn(self, x: Any) -> Child:
        """Start ``x`` (anything a yield accepts) as a child; its handle.
        Over the limit, it waits in the group until another finishes. May be
        called while iterating.

        A ``dask_coro.stream`` (made in the same body, or the same client
        code, and not yet iterated) is delivered once per item, ``(child,
        item)``, in the stream's order; its producer's error after its
        items; its return value is not delivered (it is ``s.result``). It
        holds a place under the limit until its producer ended, and the
        group takes its next items once the body has taken the last ones
        (the stream's ``buffer`` holds as it does for ``for item in s``).
        """
        backend = self._backend()
        # Looked up on the type: a lazy value's __getattr__ would answer anything.
        claim = None if isinstance(x, type) else getattr(type(x), "__dask_coro_stream__", None)
        if claim is not None:
            backend.check_stream(x)
        else:
            x = shaped(x, self.name, len(self.book.children))
        with self.lock:
            if self.expired:
                # Cancelled at once: the body hears of the deadline at its
                # next wait, wherever the timer found it.
                child = Child(self, len(self.book.children), None)
                child.state = CANCELLED
                return child
            if self.book.closed:
                raise RuntimeError("spawn() on a group that was closed (its block was left)")
            if claim is not None:
                x = claim(x)
            child, start = self.book.spawn(self, x, claim is not None)
        if start:
            backend.start([child])
        return child

    def cancel_child(self, child: Child) -> None:
        with self.lock:
            lost = [(repr(child), e) for e in self.book.undelivered_errors_of(child)]
            started = self.book.cancel(child)
            more = self.book.fill()
        _log_lost(lost, "it was cancelled first")
        if started:
            self._backend().stop([child], closing=False)
        if more:
            self._backend().start(more)

    def next(self) -> Any:
        """``(child, value)`` of the next child to finish: ``yield g.next()``
        in a generator body, ``await g.next()`` in an async one,
        ``dask_coro.result(g.next())`` from plain code. A child's error is
        raised here (its handle is the exception's ``dask_coro_child``).
        ``TimeoutError`` once the deadline passed; ``RuntimeError`` if no
        child is left (``while g:`` stops before; with streams in the group,
        their end is known only when it comes, so iterate with ``for child,
        item in g``, which stops there)."""
        return self._backend().request("next")

    def all(self) -> Any:
        """The values of every child not yet delivered, in spawn order (a
        fork-join of what is left); a child's error is raised here, the
        first to finish."""
        return self._backend().request("all")

    def aclose(self) -> Any:
        """Cancel every child not yet delivered and wait until they have
        ended: ``yield g.aclose()`` / ``await g.aclose()``. A coroutine child
        waiting at a yield or an await is closed there (its ``finally``
        blocks run) before this returns; one running code between two
        yields, or a plain function, is not waited for (nothing can stop
        it; it is closed at its next yield, a plain function's result is
        dropped)."""
        return self._backend().request("aclose")

    def __len__(self) -> int:
        return len(self.book)

    def __bool__(self) -> bool:
        return len(self.book) > 0

    def __iter__(self) -> Iterator[tuple[Child, Any]]:
        from ..runtime.result import result

        while self:
            got = result(self._backend().request("more"))
            if got is None:
                return  # the last children were streams that ended without an item
            yield got

    async def _aiter(self) -> AsyncIterator[tuple[Child, Any]]:
        while self:
            got = await self._backend().request("more")
            if got is None:
                return
            yield got

    def __aiter__(self) -> AsyncIterator[tuple[Child, Any]]:
        return self._aiter()

    # -- what the backends share ---------------------------------------------

    def _late(self) -> str:
        assert self.deadline is not None
        return f"({time.time() - self.deadline:.3f} s ago)"

    def expire(self) -> list[Child]:
        """The deadline passed: cancel every child; those to stop."""
        return self.cancel_all(expire=True) or []

    def deliver(self, child: Child) -> tuple[Child, Any]:
        """``(child, value)``, or the child's error raised, naming it."""
        outcome = child.outcome
        assert outcome is not None
        child.outcome = None
        ok, value = outcome
        if ok:
            return child, value
        try:
            value.dask_coro_child = child
            _add_note(value, f"raised by {child!r}")
        except (AttributeError, TypeError):
            pass
        raise value

    def timeout_error(self) -> TimeoutError:
        return TimeoutError(f"the group's deadline passed {self._late()}: its children were cancelled")

    def no_child(self, what: str) -> RuntimeError:
        return RuntimeError(
            f"{what}() on a group with no child left to deliver (test `while g:` first; a stream "
            "child's end is known only when it comes: iterate with `for child, item in g`)"
        )

    def place(self, s: Any, where: str, same: bool) -> None:
        """A stream spawned in a group is read where it was made: a body's
        on its worker (or without a cluster), a client's on that client."""
        if getattr(s.backend, "where", None) != where or not same:
            raise TypeError(
                "spawn a stream in a group opened where the stream was made: in the same "
                f"coroutine body, or the same client code ({s!r})"
            )

    def collect(self, out: dict[int, Any], delivered: tuple[Child, Any]) -> None:
        """``all()``: a child's value by index; a stream child's items in a list."""
        child, value = delivered
        if child.items is None:
            out[child.index] = value
        else:
            out.setdefault(child.index, []).append(value)

    def values(self, pending: list[Child], out: dict[int, Any]) -> list[Any]:
        """``all()``'s answer: of the children ``pending`` when it began, in
        spawn order (a stream child: its items, maybe none)."""
        return [out.get(c.index, []) if c.items is not None else out[c.index]
                for c in pending if c.items is not None or c.index in out]  # not one cancelled meanwhile

    def __repr__(self) -> str:
        return f"<group: {len(self)} left, limit {self.book.limit}>"


class LocalBackend:
    """A group in a body run without a cluster: every child is computed in
    this thread when ``next()`` asks, one at a time, oldest first, and
    delivered as it finishes (so ``next()`` never waits for more than the
    child it returns). The deadline is checked at each wait and before each
    child starts: a child running here cannot be interrupted."""

    def __init__(self, group: Group):
        self.group = group

    def check_stream(self, s: Any) -> None:
        self.group.place(s, "local", True)

    def start(self, children: list[Child]) -> None:
        pass  # run when next() asks

    def stop(self, children: list[Child], closing: bool) -> None:
        pass  # nothing runs while the body does

    def request(self, kind: str) -> Request:
        fn = {"next": _local_next, "more": _local_more, "all": _local_all, "aclose": _local_aclose}[kind]
        return Request(fn, self.group)


def _expired(g: Group) -> bool:
    if g.deadline is not None and not g.expired and time.time() >= g.deadline:
        g.expire()
    return g.expired


async def _local_step(g: Group) -> Child | None:
    """Run the oldest started child here; the next to deliver, or None."""
    from ..runtime.call import gather

    book = g.book
    while True:
        child = book.take()
        if child is not None:
            return child
        if _expired(g):
            raise g.timeout_error()
        c = book.first_started()
        if c is None:
            return None
        obj = c.obj
        if c.items is not None:  # a stream: its producer runs to its end here
            for item in await obj._batch():
                book.emitted(c, item)
            assert obj.end is not None
            ok, value = obj.end
        else:
            try:
                # Its leaves, as one yield; no leaf: a plain value, given back.
                todo = leaves(obj)
                value = rebuild(obj, await gather(todo) if todo else [])
            except Exception as e:  # a child's error: delivered in its turn
                ok, value = False, e
            else:
                ok = True
        del obj
        book.finished(c, ok, value)


async def _local_more(g: Group) -> tuple[Child, Any] | None:
    child = await _local_step(g)
    return None if child is None else g.deliver(child)


async def _local_next(g: Group) -> tuple[Child, Any]:
    got = await _local_more(g)
    if got is None:
        raise g.no_child("next")
    return got


async def _local_all(g: Group) -> list[Any]:
    if _expired(g):
        raise g.timeout_error()
    pending = g.book.pending()
    out: dict[int, Any] = {}
    while g:
        child = await _local_step(g)
        if child is None:
            break
        g.collect(out, g.deliver(child))
    return g.values(pending, out)


async def _local_aclose(g: Group) -> None:
    g.close()


def _log_lost(lost: list[tuple[str, BaseException]], why: str) -> None:
    """An error a child ended with that the body was never given: logged,
    never dropped silently (as asyncio logs a task's exception never
    retrieved, also when the task is cancelled after it ended)."""
    for child, e in lost:
        logger.warning(
            "%s ended with an error that was never delivered (%s): %r",
            child, why, e, exc_info=(type(e), e, e.__traceback__),
        )


def cancelled(child: Child) -> bool:
    return child.state == CANCELLED


def _add_note(e: BaseException, note: str) -> None:
    """``e.add_note(note)``; on Python 3.10, which has no ``add_note`` (PEP 678
    is 3.11's), the ``__notes__`` list it fills, as the exceptiongroup
    backport does: the note is there to read either way."""
    add = getattr(e, "add_note", None)
    if add is not None:
        add(note)
        return
    notes = getattr(e, "__notes__", None)
    e.__notes__ = [*notes, note] if isinstance(notes, list) else [note]

