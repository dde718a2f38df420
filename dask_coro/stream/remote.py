"""A stream on a cluster: the producer's side (``emit`` in a run on a
worker) and the consumer's (a body on a worker, or client code).

The producer is a task of its own, annotated ``dask_coro_stream`` (its
``buffer``). Each item it emits is put in its worker's memory under the key
``book.item_key(producer, i)`` and published to ``StreamPlugin``, which makes
it a key the scheduler knows and tells the consumer; the producer's body goes
on at once, or, with ``buffer`` items not taken, waits on the scheduler (no
thread: ``emit`` is an await of the run) until the consumer takes one. The
consumer asks the plugin for the items from the next index, gathers the ones
published (one message per batch) and, once the producer ended, its value or
its error.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from dask.base import tokenize
from dask.sizeof import sizeof

from .._exceptions import DaskCoroError
from .._internals.distributed.client import future_in_memory
from .._internals.distributed.worker import send_on_worker_stream, store_own_data
from ..runtime.extensions import Run
from .book import PUBLISH

logger = logging.getLogger("dask_coro")

#: Items of at most this many bytes (``sizeof``) travel with their
#: publication, a copy held by the scheduler until the consumer took them.
SMALL = 16 * 1024

#: The annotation that makes a coroutine task a stream's producer.
ANNOTATION = "dask_coro_stream"
#: Where a run keeps its ``Producer`` (``Run.notes``).
NOTE = "stream"

_installed: dict[str, asyncio.Future[None]] = {}  # by client id


async def install(client: Any) -> None:
    """Install ``StreamPlugin`` on the client's scheduler (once per client)."""
    from distributed.protocol.pickle import dumps

    from .scheduler import StreamPlugin

    fut = _installed.get(client.id)
    if fut is None or (fut.done() and fut.exception() is not None):
        plugin = StreamPlugin()
        fut = _installed[client.id] = asyncio.ensure_future(
            client.scheduler.register_scheduler_plugin(plugin=dumps(plugin), name=plugin.name, idempotent=True)
        )
    await asyncio.shield(fut)


# -- the producer's side -------------------------------------------------------


class Producer:
    """What a run that is a stream's producer keeps: the next index, how
    many items the consumer took (as last heard), its buffer."""

    def __init__(self, on: bool, buffer: int | None):
        self.on = on
        self.buffer = buffer
        self.index = 0
        self.taken = 0


async def _producer(run: Run) -> Producer:
    """On the worker's loop: what ``run`` keeps as a producer."""
    p: Producer | None = run.notes.get(NOTE)
    if p is None:
        ann = run.annotations().get(ANNOTATION)
        p = run.notes[NOTE] = Producer(ann is not None, None if ann is None else ann.get("buffer"))
    return p


async def _room(run: Run, p: Producer, index: int) -> bool:
    """On the worker's loop: wait until item ``index`` fits in the buffer;
    False if our consumer let go of us (the run is being cancelled)."""
    client = await run.submitting_client()
    r = await client.scheduler.dask_coro_stream_room(key=run.key, index=index, buffer=p.buffer)
    p.taken = max(p.taken, r["taken"])
    return not r["gone"]


def _publication(run: Run, index: int, x: Any) -> dict[str, Any]:
    """On the run's lane: what publishes item ``index``. Its token (for a
    re-run to compare) is computed here, on the producer's thread, not on
    the worker's loop, which serves the items' transfers meanwhile (hashing
    10 MB takes milliseconds)."""
    from distributed.protocol.pickle import dumps

    nbytes = sizeof(x)
    msg = {"op": PUBLISH, "key": run.key, "index": index, "token": tokenize(x), "nbytes": nbytes}
    if nbytes <= SMALL:
        # A copy rides along: the consumer gets it from the scheduler with
        # the item's key, without a gather from this worker.
        msg["value"] = dumps(x)
    return msg


def _send(run: Run, x: Any, msg: dict[str, Any]) -> None:
    """On the worker's loop: the item into the worker's memory, and
    published on the worker's stream to the scheduler, ordered with the
    message that the producer's task finished (so the consumer hears of
    every item before it hears the producer ended)."""
    from .book import item_key

    store_own_data(run.worker, {item_key(run.key, msg["index"]): x})
    send_on_worker_stream(run.worker, msg)


def _on_loop(run: Run, coro: Any) -> Any:
    return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, run.loop))


async def emit_on_worker(run: Run, x: Any) -> None:
    """``emit(x)`` in a run on a worker (on the run's lane). Returns at once
    while the buffer has room (as last heard from the scheduler); else the
    body waits, without its thread, until the consumer takes an item."""
    p: Producer | None = run.notes.get(NOTE)
    if p is None:
        p = await _on_loop(run, _producer(run))
    if not p.on:
        return  # no stream's producer: the item is dropped
    i = p.index
    if p.buffer is not None and i - p.taken >= p.buffer:
        if not await _on_loop(run, _room(run, p, i)):
            return
    p.index = i + 1
    run.loop.call_soon_threadsafe(_send, run, x, _publication(run, i, x))


# -- the consumer's side -------------------------------------------------------


class RemoteConsumer:
    """The consumer of one stream, on a client's loop: ``fetch(index)`` gives
    ``(items, end)``, ``end`` None or ``(ok, value)`` once the producer ended
    and every item was given."""

    def __init__(self, call: Any, buffer: int | None):
        self.call: Any = call
        self.buffer = buffer
        self.future: Any = None
        self.client: Any = None
        self.released = False  # let go of: a producer submitted after it is let go of at once

    async def submit(self, client: Any, call: Any, ann: dict[str, Any]) -> Any:
        raise NotImplementedError

    async def restart(self, client: Any, taken: int) -> bool:
        """An earlier run of this consumer took ``taken`` items, let go of:
        run the producer again from its first item; False if we cannot."""
        return False

    def release(self) -> None:
        raise NotImplementedError

    async def gather(self, client: Any, futures: list[Any]) -> list[Any]:
        return await client.gather(futures, asynchronous=True)

    async def fetch(self, client: Any, index: int, futures: bool = False) -> tuple[list[Any], tuple[bool, Any] | None]:
        if self.future is None:
            await install(client)
            call, self.call = self.call, None
            self.future = await self.submit(client, call, {ANNOTATION: {"buffer": self.buffer}})
            if self.released:  # the stream was closed (from another thread) while we submitted
                self.release()
                return [], None
        key = self.future.key
        r = await client.scheduler.dask_coro_stream_next(key=key, index=index, client=client.id if futures else None)
        if "restart" in r:
            if await self.restart(client, r["restart"]):
                return await self.fetch(client, index, futures)
            return [], (False, DaskCoroError(
                f"the stream of {key!r} was consumed up to item {r['restart']} by another consumer; "
                f"item {index} is no longer held"
            ))
        keys = [tuple(k) if isinstance(k, list) else k for k in r["keys"]]
        if keys:
            small = r.get("values")
            if small is not None and not futures:
                from distributed.protocol.pickle import loads

                return [loads(b) for b in small], None
            held = [future_in_memory(client, k) for k in keys]
            if futures:  # the scheduler holds them for our client now
                return held, None
            values = await self.gather(client, held)
            del held
            return list(values), None
        if r["ended"] == "forgotten":
            return [], (False, DaskCoroError(f"the stream's producer {key!r} was released before it ended"))
        try:
            value = await client.gather(self.future, asynchronous=True)
        except BaseException as e:  # the producer's error, after its items
            return [], (False, e)
        return [], (True, value)


class WorkerConsumer(RemoteConsumer):
    """A stream opened in a body on a worker: the producer is a child task of
    the run (``_Run.start_children``: a key derived from the run's key, held
    for a re-run); the body waits for items as for a yield (no thread)."""

    where = "worker"

    def __init__(self, call: Any, buffer: int | None, run: Run):
        from .._internals.dask_private import annotations_in_effect

        super().__init__(call, buffer)
        self.run = run
        self.ident = run.ident("stream")
        self.again: Any = None  # the call, to run it again (``restart``)
        self.generation = 0
        # ``with dask.annotate(...)`` around ``stream()`` in the body: the
        # producer's (its workers, resources, priority).
        self.annotations = dict(annotations_in_effect.get() or {})

    async def submit(self, client: Any, call: Any, ann: dict[str, Any]) -> Any:
        self.again = call
        path = (self.generation,)  # the first producer's key is the same in every run of the consumer
        [future] = await self.run.start_children([call], [path], self.ident, {**self.annotations, **ann})
        return future

    async def restart(self, client: Any, taken: int) -> bool:
        """This run of the consumer is a re-run (its worker died) and the
        first run took ``taken`` items: the producer, deterministic as any
        task a re-run asks for again, runs again under a key of its own,
        and the first one is let go of (its consumer is gone)."""
        if self.again is None or self.generation:
            return False  # not ours to run again, or already run again
        logger.info("stream %r: read up to item %d by an earlier run of its consumer; its producer runs again",
                    self.future.key, taken)
        old, self.future = self.future, None
        self.generation = 1
        self.run.release([old])
        self.future = await self.submit(client, self.again, {ANNOTATION: {"buffer": self.buffer}})
        return True

    async def _fetch(self, index: int, futures: bool) -> tuple[list[Any], tuple[bool, Any] | None]:
        items, end = await self.fetch(await self.run.submitting_client(), index, futures)
        # The body holds them now (shared arrays in them tied to its key), as
        # a yield's results, before the producer goes.
        values = [] if futures else list(items)
        if end is not None and end[0]:
            values.append(end[1])
        if values:
            await self.run.received(values)
        return items, end

    async def gather(self, client: Any, futures: list[Any]) -> list[Any]:
        return await self.run.gather(futures)  # straight from the producer's worker

    async def batch(self, index: int) -> tuple[list[Any], tuple[bool, Any] | None]:
        """``fetch`` on the worker's loop (where a group's children end)."""
        return await self._fetch(index, False)

    async def next(self, index: int, futures: bool = False) -> tuple[list[Any], tuple[bool, Any] | None]:
        """On the run's lane: ``fetch`` on the worker's loop. (Not asked
        ahead while the body works on a batch: the scheduler counts an
        item taken once a later one is asked for, and ``buffer`` bounds the
        items the body has not taken.)"""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._fetch(index, futures), self.run.loop))

    def release(self) -> None:
        self.released = True
        future, self.future = self.future, None
        if future is not None:
            self.run.release([future])


class ClientConsumer(RemoteConsumer):
    """A stream opened in client code: the producer is a future of the
    default client."""

    where = "client"

    def __init__(self, call: Any, buffer: int | None):
        from distributed import default_client

        super().__init__(call, buffer)
        self.client = default_client()

    async def submit(self, client: Any, call: Any, ann: dict[str, Any]) -> Any:
        import dask

        with dask.annotate(**ann):
            return client.compute(call)

    async def next(self, index: int, futures: bool = False) -> tuple[list[Any], tuple[bool, Any] | None]:
        return await self.fetch(self.client, index, futures)

    batch = next  # on the client's loop

    def next_sync(self, index: int, futures: bool = False) -> tuple[list[Any], tuple[bool, Any] | None]:
        return self.client.sync(self.fetch, self.client, index, futures)

    def release(self) -> None:
        self.released = True
        future, self.future = self.future, None
        if future is not None:
            future.release()  # the scheduler cancels it: nobody else wants it
