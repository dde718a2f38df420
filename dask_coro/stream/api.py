"""``dask_coro.emit`` and ``dask_coro.stream``.

A ``Stream`` is the consumer's object. Where it was made decides who runs
its producer (its *backend*):

- in a body on a distributed worker (``remote.WorkerConsumer``): the
  producer is a task of its own, a child of the run; items reach the
  consumer as keys while it runs, with backpressure (``buffer``);
- in client code (``remote.ClientConsumer``): the producer is a future of
  the default client;
- in a body run without a cluster (``LocalConsumer``, here): the producer
  is computed in place when the consumer first asks for an item, to its
  end, its items kept in order (nothing runs beside the consumer: there is
  no backpressure and nothing to cancel).

Waits are ``InPlace`` requests (``core/engine.py``), as a group's
``next()``: the engine runs them as calls of the body that waits.
"""

from __future__ import annotations

import inspect
import sys
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..core.engine import InPlace, current_trampoline

__all__ = ["Stream", "emit", "stream"]

_END = object()
_WAIT = object()
_BODY = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE

#: Without a cluster: the items of the producers being computed here,
#: innermost last (a producer that consumes a stream of its own).
_local_sinks: list[list[Any]] = []


async def _local_emit(x: Any) -> None:
    if _local_sinks:
        _local_sinks[-1].append(x)


async def _dropped(x: Any) -> None:
    pass


def emit(x: Any) -> Any:
    """Hand ``x`` to the stream this coroutine produces, and go on.

    ``yield dask_coro.emit(x)`` in a generator body, ``await
    dask_coro.emit(x)`` in an ``async def`` body, ``dask_coro.emit(x)``
    in plain code a body calls (it waits there as ``result()`` does). With
    the consumer's ``buffer`` full, the body is suspended here, as at any
    yield (no thread), until the consumer takes an item. A coroutine that
    is no stream's producer (yielded or computed plainly) drops its items.
    """
    tramp = current_trampoline()
    if tramp is None:
        raise RuntimeError("dask_coro.emit() is called in a coroutine body, or in plain code a body calls")
    if tramp.host is None:
        req = InPlace(_local_emit, x)
    elif len(tramp.stack) > 1 or tramp.host.beside:
        # A call the run's body yielded, run inline here, or a body run
        # beside the run (``runtime.beside``): it is no stream's producer
        # (the run's own task is), so its items are dropped.
        req = InPlace(_dropped, x)
    else:
        from .remote import allocate_here, emit_on_worker

        allocate_here()
        # In a box the emit empties: the item's references are the body's
        # only (a NumPy array nothing else holds is handed over, not copied).
        req = InPlace(emit_on_worker, tramp.host, [x])
    del x
    if sys._getframe(1).f_code.co_flags & _BODY:
        return req  # yielded or awaited by the body
    from ..runtime.result import result

    result(req)
    return None


def stream(call: Any, buffer: int | None = None) -> Stream:
    """The items a producer ``call`` emits, as it emits them.

    Parameters
    ----------
    call
        A call of a ``@coroutine`` function whose body calls ``emit``.
    buffer
        At most this many items emitted and not yet taken by the consumer:
        the producer is suspended at its next ``emit`` (holding no thread and
        no slot) until the consumer takes one. None: items accumulate in the
        producer's worker's memory until the consumer takes them (bounded by
        what the producer emits; each item taken is let go of).

    Notes
    -----
    Iterate it with ``for`` in a generator body and in plain code (each wait
    is a wait of ``result()``: no thread held), with ``async for`` in an
    ``async def`` body. After the last item, ``s.result`` is the producer's
    return value; a producer's error is raised after the items it emitted
    before it. ``s.close()`` (or leaving ``with s:``, or dropping ``s``)
    cancels the producer if it runs. ``g.spawn(s)`` reads it in a group
    instead, ``(child, item)`` per item beside the group's other children.
    """
    from ..runtime.call import CoroutineCall

    if not isinstance(call, CoroutineCall):
        raise TypeError(f"dask_coro.stream() takes a call of a @coroutine function, not {type(call).__name__}")
    if buffer is not None and (isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1):
        raise ValueError(f"stream buffer= must be a positive int or None, not {buffer!r}")
    tramp = current_trampoline()
    if tramp is None:
        from .remote import ClientConsumer

        return Stream(ClientConsumer(call, buffer), buffer)
    if tramp.host is None:
        return Stream(LocalConsumer(call), buffer)
    from .remote import WorkerConsumer

    return Stream(WorkerConsumer(call, buffer, tramp.host), buffer)


class Stream:
    """See ``stream``."""

    def __init__(self, backend: Any, buffer: int | None):
        self.backend = backend
        self.buffer = buffer
        self.items: deque[Any] = deque()
        self.index = 0  # items received
        self.end: tuple[bool, Any] | None = None
        self.closed = False
        self.grouped = False  # spawned in a group: read through it
        self.drained = False  # an iteration reached its end: nothing is left to read

    # -- in a group ------------------------------------------------------------

    def __dask_coro_stream__(self) -> Stream:
        """Claim this stream for a group (``g.spawn(s)``): the group reads
        its items from now on (``_batch``)."""
        if self.grouped:
            raise RuntimeError("a stream is spawned in one group, once")
        if self.index or self.closed:
            raise RuntimeError("spawn a stream in a group before iterating or closing it")
        self.grouped = True
        return self

    async def _batch(self) -> list[Any]:
        """For the group that spawned it: the next items the producer handed
        out, waiting for one or the end (on the loop the stream's backend
        fetches on: the worker's for a body's stream, the client's for a
        client's, the body's without a cluster). Once ended, ``end`` is set."""
        items, end = await self.backend.batch(self.index)
        self._open_still()
        self.index += len(items)
        if end is not None:
            self.end = end
            self.backend.release()
        return items

    # -- receiving -----------------------------------------------------------

    def _open_still(self) -> None:
        """After a wait for items: closed meanwhile (``close()`` from another
        thread, or another task of an ``async def`` body), the stream gives
        nothing more. What the wait brought is dropped, and the producer is
        let go of again, in case the wait submitted it after the close."""
        if self.closed:
            self.backend.release()
            raise RuntimeError("iterating a stream that was closed")

    def _got(self, got: tuple[list[Any], tuple[bool, Any] | None]) -> None:
        self._open_still()
        items, end = got
        self.items.extend(items)
        self.index += len(items)
        if end is not None:
            self.end = end
            self.backend.release()

    def _pop(self) -> Any:
        if self.items:
            return self.items.popleft()
        if self.end is not None:
            self.drained = True
            ok, value = self.end
            if not ok:
                raise value
            return _END
        if self.closed:
            raise RuntimeError("iterating a stream that was closed")
        return _WAIT

    def _request(self, futures: bool) -> InPlace:
        return InPlace(self.backend.next, self.index, futures)

    def _unclaimed(self) -> None:
        if self.grouped:
            raise RuntimeError("a stream spawned in a group is read through it: for child, item in g")
        if self.drained:
            # Its items were handed out once and let go of, as a generator's:
            # a second loop would otherwise end at once, silently empty.
            raise RuntimeError(
                "iterating a stream that was already read to its end: a stream is read once "
                "(its items are not kept; keep them in a list, or make a new stream)"
            )

    def _iter(self, futures: bool) -> Iterator[Any]:
        from ..runtime.result import result

        self._unclaimed()
        while True:
            item = self._pop()
            if item is _END:
                return
            if item is _WAIT:
                if current_trampoline() is None:
                    self._got(self.backend.next_sync(self.index, futures))
                else:
                    self._got(result(self._request(futures)))
                continue
            yield item

    def __iter__(self) -> Iterator[Any]:
        return self._iter(False)

    def futures(self) -> Iterator[Any]:
        """Iterate the items as ``distributed.Future`` objects instead of
        values (on a cluster): item ``i``'s key is derived from the
        producer's key and ``i``, its data stays on the producer's worker
        and goes to the tasks given the future, not through the consumer.
        Without a cluster, the values. Waits as ``for x in s`` does."""
        return self._iter(True)

    async def _aiter(self) -> AsyncIterator[Any]:
        self._unclaimed()
        while True:
            item = self._pop()
            if item is _END:
                return
            if item is _WAIT:
                if current_trampoline() is None:
                    self._got(await self.backend.next(self.index))
                else:
                    self._got(await self._request(False))
                continue
            yield item

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._aiter()

    @property
    def result(self) -> Any:
        """The producer's return value, once every item was taken."""
        if self.end is None or self.items:  # without a cluster the end comes with the items
            raise RuntimeError("a stream's result is known once every item was taken (iterate it to its end)")
        ok, value = self.end
        if not ok:
            raise value
        return value

    # -- letting go ------------------------------------------------------------

    def close(self) -> None:
        """Cancel the producer if it still runs; drop the items not taken."""
        if not self.closed:
            self.closed = True
            self.items.clear()
            self.backend.release()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = "ended" if self.end is not None else "closed" if self.closed else "open"
        return f"<stream: {self.index} items received, {state}>"


class LocalConsumer:
    """Without a cluster: the producer is computed here, to its end, when
    the consumer first asks; its items are given in order, then its value
    or its error."""

    where = "local"

    def __init__(self, call: Any):
        self.call: Any = call

    async def next(self, index: int, futures: bool = False) -> tuple[list[Any], tuple[bool, Any] | None]:
        from ..runtime.call import gather

        call, self.call = self.call, None
        if call is None:
            return [], (False, RuntimeError("the stream's producer was released"))
        sink: list[Any] = []
        _local_sinks.append(sink)
        try:
            value = await gather(call)
        except Exception as e:  # the producer's error, after its items
            return sink, (False, e)
        finally:
            _local_sinks.remove(sink)
        return sink, (True, value)

    batch = next

    def release(self) -> None:
        self.call = None
