"""A group in plain client code: a group of roots, with the default client.

Each child is a future of the default client (``Client.compute``; a Future is
taken as it is). ``next()`` waits for the first of the started children to
finish (``distributed.wait(..., return_when="FIRST_COMPLETED")``, which
takes a timeout, so the deadline holds); of several found finished at once,
the oldest is delivered first. ``dask_coro.result(g.next())`` and ``for
child, value in g`` block; with an asynchronous client, ``await g.next()``
and ``async for``. Leaving the block cancels the children not yet delivered
(``Client.cancel``: a coroutine child's run closes its body).

A stream child is read in *rounds*: one batch of items at a time, fetched
on the client's loop (``Stream._batch``), the next once the body took the
last; ``next()`` waits for the first of a child's future and a round.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import time
from typing import Any

from ..core.structure import Structure
from .book import Child, leaves, rebuild
from .request import Request

#: The group (``api.Group``; not imported: it imports this module).
_Group = Any


class ClientBackend:
    def __init__(self, group: _Group):
        from distributed import default_client

        self.group = group
        self.client = default_client()
        # Started children's futures (one per leaf of what was spawned), by index.
        self.futures: dict[int, list[Any]] = {}
        # The shapes of started children spawned as more than one value (``book.shaped``).
        self.shapes: dict[int, Structure] = {}
        self.streams: dict[int, Any] = {}  # started stream children, by index
        self.rounds: dict[int, concurrent.futures.Future[list[Any]]] = {}  # their batches asked for
        self.cancelling: set[asyncio.Future[Any]] = set()

    def check_stream(self, s: Any) -> None:
        self.group.place(s, "client", getattr(s.backend, "client", None) is self.client)

    def start(self, children: list[Child]) -> None:
        from distributed import Future

        for c in children:
            obj, c.obj = c.obj, None
            if c.items is not None:
                self.streams[c.index] = obj  # read in rounds (``_ask``)
                continue
            todo = leaves(obj)
            if not todo:  # a plain value: given back at once
                more = self.group.book.finished(c, True, rebuild(obj, []))
                if more:
                    self.start(more)
                continue
            if type(obj) is Structure:
                self.shapes[c.index] = obj.without_leaves()
            # The leaves computed together, as Client.compute computes a list.
            lazy = [x for x in todo if not isinstance(x, Future)]
            computed = iter(self.client.compute(lazy) if lazy else ())
            self.futures[c.index] = [x if isinstance(x, Future) else next(computed) for x in todo]

    def stop(self, children: list[Child], closing: bool) -> None:
        out = [f for c in children for f in self.futures.pop(c.index, ())]
        if out:
            cancelling = self.client.cancel(out)
            if inspect.isawaitable(cancelling):
                # An asynchronous client, on its loop (leaving ``async with``,
                # a deadline, another task's ``cancel()``): its methods give
                # a coroutine there, which does nothing unless it runs.
                task = asyncio.ensure_future(cancelling)
                self.cancelling.add(task)  # held until done: the loop holds tasks weakly
                task.add_done_callback(self.cancelling.discard)
        for c in children:
            self.shapes.pop(c.index, None)
            s = self.streams.pop(c.index, None)
            if s is not None:
                r = self.rounds.pop(c.index, None)
                if r is not None:
                    r.cancel()
                s.close()  # its producer's future released: the scheduler cancels it

    def _ask(self) -> None:
        """A round for each stream child whose items the body took."""
        book = self.group.book
        loop = self.client.loop.asyncio_loop
        for i, s in self.streams.items():
            if i not in self.rounds and not book.children[i].items:
                self.rounds[i] = asyncio.run_coroutine_threadsafe(s._batch(), loop)

    def _settle_rounds(self) -> None:
        """The items of the rounds that ended, each delivered on its own;
        a stream's end."""
        book = self.group.book
        for i, r in list(self.rounds.items()):
            if not r.done():
                continue
            del self.rounds[i]
            child, s = book.children[i], self.streams[i]
            try:
                items = r.result()
            except Exception as e:  # the fetch failed: the child's error
                end: tuple[bool, Any] | None = (False, e)
            else:
                for item in items:
                    book.emitted(child, item)
                end = s.end
            if end is not None:
                del self.streams[i]
                more = book.finished(child, *end)
                if more:
                    self.start(more)

    async def _first(self, timeout: float | None) -> None:
        """Until a started child's future or a stream's round is done;
        ``TimeoutError`` after ``timeout`` seconds."""
        from .._internals.distributed.client import future_settled

        settled: list[asyncio.Future[Any]] = [future_settled(f) for fs in self.futures.values() for f in fs]
        rounds: list[asyncio.Future[Any]] = [asyncio.wrap_future(r) for r in self.rounds.values()]
        try:
            done, _ = await asyncio.wait([*settled, *rounds], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in settled:
                w.cancel()  # off the future's event (a round's wrapper is left: cancelling it cancels the round)
        if not done:
            raise TimeoutError

    def _done(self) -> list[int]:
        """The started children whose futures all finished, or one failed,
        oldest first."""
        return [i for i, fs in sorted(self.futures.items())
                if all(f.done() for f in fs) or any(f.status in ("error", "cancelled") for f in fs)]

    def request(self, kind: str) -> Request | _Awaitable:
        g = self.group
        if self.client.asynchronous:
            fn = {"next": self._anext, "more": self._amore, "all": self._aall, "aclose": self._aaclose}[kind]
            return _Awaitable(fn, g)
        sync = {"next": self._next, "more": self._more, "all": self._all, "aclose": self._aclose}[kind]
        return Request(_in_body, g, sync)

    # -- blocking ------------------------------------------------------------

    def _remaining(self) -> float | None:
        g = self.group
        if g.deadline is None:
            return None
        return g.deadline - time.time()

    def _failed(self, i: int) -> Any:
        """The first of child ``i``'s futures that failed, or None."""
        return next((f for f in self.futures[i] if f.status in ("error", "cancelled")), None)

    def _outcome(self, i: int) -> tuple[bool, Any]:
        """Child ``i``'s outcome, once ``_done`` named it (blocking)."""
        f = self._failed(i)
        if f is None:
            return True, self._value(i, self.client.gather(self.futures[i]))
        if f.status == "cancelled":
            return False, _cancelled_error(self.group.book.children[i])
        return False, f.exception()

    async def _aoutcome(self, i: int) -> tuple[bool, Any]:
        """``_outcome`` with an asynchronous client."""
        f = self._failed(i)
        if f is None:
            return True, self._value(i, await self.client.gather(self.futures[i]))
        if f.status == "cancelled":
            return False, _cancelled_error(self.group.book.children[i])
        return False, await f.exception()

    def _value(self, i: int, values: list[Any]) -> Any:
        shape = self.shapes.pop(i, None)
        return values[0] if shape is None else shape.rebuild(values)

    def _settle(self, outcomes: dict[int, tuple[bool, Any]]) -> None:
        """Children ``outcomes`` names (``_done``): their outcomes, oldest first."""
        g = self.group
        for i, (ok, value) in outcomes.items():
            if self.futures.pop(i, None) is None:
                continue
            self.shapes.pop(i, None)
            more = g.book.finished(g.book.children[i], ok, value)
            if more:
                self.start(more)

    def _timeout(self) -> TimeoutError:
        g = self.group
        self.stop(g.expire(), closing=True)
        return g.timeout_error()

    def _take(self) -> Child | None:
        g = self.group
        while True:
            child = g.book.take()
            if child is not None:
                return child
            if g.expired:
                raise g.timeout_error()
            if not g.book.left:
                return None
            remaining = self._remaining()
            if remaining is not None and remaining <= 0:
                raise self._timeout()
            self._ask()
            try:
                self.client.sync(self._first, remaining)
            except TimeoutError:
                raise self._timeout() from None
            self._settle({i: self._outcome(i) for i in self._done()})
            self._settle_rounds()

    def _more(self) -> tuple[Child, Any] | None:
        child = self._take()
        return None if child is None else self.group.deliver(child)

    def _next(self) -> tuple[Child, Any]:
        got = self._more()
        if got is None:
            raise self.group.no_child("next")
        return got

    def _all(self) -> list[Any]:
        g = self.group
        pending = g.book.pending()
        out: dict[int, Any] = {}
        while (child := self._take()) is not None:
            g.collect(out, g.deliver(child))
        return g.values(pending, out)

    def _aclose(self) -> None:
        from distributed import wait

        g = self.group
        futures = [f for fs in self.futures.values() for f in fs]
        g.close()
        if futures:
            wait(futures)

    # -- with an asynchronous client -------------------------------------------

    async def _atake(self) -> Child | None:
        g = self.group
        while True:
            child = g.book.take()
            if child is not None:
                return child
            if g.expired:
                raise g.timeout_error()
            if not g.book.left:
                return None
            remaining = self._remaining()
            if remaining is not None and remaining <= 0:
                raise self._timeout()
            self._ask()
            try:
                await self._first(remaining)
            except TimeoutError:
                raise self._timeout() from None
            self._settle({i: await self._aoutcome(i) for i in self._done()})
            self._settle_rounds()

    async def _amore(self) -> tuple[Child, Any] | None:
        child = await self._atake()
        return None if child is None else self.group.deliver(child)

    async def _anext(self) -> tuple[Child, Any]:
        got = await self._amore()
        if got is None:
            raise self.group.no_child("next")
        return got

    async def _aall(self) -> list[Any]:
        g = self.group
        pending = g.book.pending()
        out: dict[int, Any] = {}
        while (child := await self._atake()) is not None:
            g.collect(out, g.deliver(child))
        return g.values(pending, out)

    async def _aaclose(self) -> None:
        self.group.close()


def _cancelled_error(child: Child) -> BaseException:
    from concurrent.futures import CancelledError

    return CancelledError(f"{child!r} was cancelled on the cluster")


def _in_body(g: _Group) -> Any:
    raise RuntimeError(
        "a group opened in client code was yielded in a coroutine body: open the "
        "group inside the body (with dask_coro.group() as g: ...)"
    )


class _Awaitable:
    """A client-side request with an asynchronous client: ``await`` it."""

    __slots__ = ("fn", "group")

    def __init__(self, fn: Any, group: _Group):
        self.fn = fn
        self.group = group

    def __await__(self) -> Any:
        return self.fn().__await__()

    def __dask_coro_result__(self) -> Any:
        raise RuntimeError("with an asynchronous client, await g.next() instead of dask_coro.result()")

