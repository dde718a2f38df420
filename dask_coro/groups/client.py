"""A group in plain client code: a group of roots, with the default client.

Each child is a future of the default client (``Client.compute``; a Future is
taken as it is). ``next()`` waits for the first of the started children to
finish (``distributed.wait(..., return_when="FIRST_COMPLETED")``, which
takes a timeout, so the deadline holds); of several found finished at once,
the oldest is delivered first. ``dask_coro.result(g.next())`` and ``for
child, value in g`` block; with an asynchronous client, ``await g.next()``
and ``async for``. Leaving the block cancels the children not yet delivered
(``Client.cancel``: a coroutine child's run closes its body).
"""

from __future__ import annotations

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

    def check(self, x: Any) -> None:
        pass

    def start(self, children: list[Child]) -> None:
        from distributed import Future

        for c in children:
            obj, c.obj = c.obj, None
            self.futures[c.index] = obj if isinstance(obj, Future) else self.client.compute(obj)

    def stop(self, children: list[Child], closing: bool) -> None:
        out = [f for f in (self.futures.pop(c.index, None) for c in children) if f is not None]
        if out:
            self.client.cancel(out)

    def request(self, kind: str) -> Request | _Awaitable:
        g = self.group
        if self.client.asynchronous:
            fn = {"next": self._anext, "all": self._aall, "aclose": self._aaclose}[kind]
            return _Awaitable(fn, g)
        sync = {"next": self._next, "all": self._all, "aclose": self._aclose}[kind]
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
        from distributed import wait

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
            try:
                done, _ = wait(list(self.futures.values()), timeout=remaining, return_when="FIRST_COMPLETED")
            except TimeoutError:
                raise self._timeout() from None
            self._settle(done)

    def _next(self) -> tuple[Child, Any]:
        child = self._take()
        if child is None:
            raise self.group.no_child("next")
        return self.group.deliver(child)

    def _all(self) -> list[Any]:
        out: dict[int, Any] = {}
        while (child := self._take()) is not None:
            out[child.index] = self.group.deliver(child)[1]
        return [out[i] for i in sorted(out)]

    def _aclose(self) -> None:
        from distributed import wait

        g = self.group
        futures = list(self.futures.values())
        g.close()
        if futures:
            wait(futures)

    # -- with an asynchronous client -------------------------------------------

    async def _atake(self) -> Child | None:
        from distributed import wait

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
            try:
                done, _ = await wait(list(self.futures.values()), timeout=remaining, return_when="FIRST_COMPLETED")
            except TimeoutError:
                raise self._timeout() from None
            values = {}
            for f in done:
                if f.status == "finished":
                    values[id(f)] = await f
                elif f.status == "error":
                    values[id(f)] = await f.exception()
            self._settle(done, values)

    async def _anext(self) -> tuple[Child, Any]:
        child = await self._atake()
        if child is None:
            raise self.group.no_child("next")
        return self.group.deliver(child)

    async def _aall(self) -> list[Any]:
        out: dict[int, Any] = {}
        while (child := await self._atake()) is not None:
            out[child.index] = self.group.deliver(child)[1]
        return [out[i] for i in sorted(out)]

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

