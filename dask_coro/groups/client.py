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

from .book import Child
from .request import Request

#: The group (``api.Group``; not imported: it imports this module).
_Group = Any


class ClientBackend:
    def __init__(self, group: _Group):
        from distributed import default_client

        self.group = group
        self.client = default_client()
        self.futures: dict[int, Any] = {}  # started children's futures, by index
        self.streams: dict[int, Any] = {}  # started stream children, by index
        self.rounds: dict[int, concurrent.futures.Future[list[Any]]] = {}  # their batches asked for
        self.cancelling: set[asyncio.Future[Any]] = set()

    def check(self, x: Any) -> None:
        pass

    def check_stream(self, s: Any) -> None:
        self.group.place(s, "client", getattr(s.backend, "client", None) is self.client)

    def start(self, children: list[Child]) -> None:
        from distributed import Future

        for c in children:
            obj, c.obj = c.obj, None
            if c.items is not None:
                self.streams[c.index] = obj  # read in rounds (``_ask``)
                continue
            self.futures[c.index] = obj if isinstance(obj, Future) else self.client.compute(obj)

    def stop(self, children: list[Child], closing: bool) -> None:
        out = [f for f in (self.futures.pop(c.index, None) for c in children) if f is not None]
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

        settled: list[asyncio.Future[Any]] = [future_settled(f) for f in self.futures.values()]
        rounds: list[asyncio.Future[Any]] = [asyncio.wrap_future(r) for r in self.rounds.values()]
        try:
            done, _ = await asyncio.wait([*settled, *rounds], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in settled:
                w.cancel()  # off the future's event (a round's wrapper is left: cancelling it cancels the round)
        if not done:
            raise TimeoutError

    def _done(self) -> list[Any]:
        return [f for f in self.futures.values() if f.done()]

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

    def _settle(self, done: Any, values: dict[int, Any] | None = None) -> None:
        """Children whose futures are ``done``: their outcomes, oldest first."""
        g = self.group
        by_future = {id(f): i for i, f in self.futures.items()}
        for f in sorted(done, key=lambda f: by_future.get(id(f), -1)):
            i = by_future.get(id(f))
            if i is None:
                continue
            del self.futures[i]
            child = g.book.children[i]
            if f.status == "finished":
                ok, value = True, values[id(f)] if values is not None else f.result()
            elif f.status == "cancelled":
                ok, value = False, _cancelled_error(child)
            else:
                ok, value = False, values[id(f)] if values is not None else f.exception()
            more = g.book.finished(child, ok, value)
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
            self._settle(self._done())
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
        futures = list(self.futures.values())
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
            done = self._done()
            values = {}
            for f in done:
                if f.status == "finished":
                    values[id(f)] = await f
                elif f.status == "error":
                    values[id(f)] = await f.exception()
            self._settle(done, values)
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

