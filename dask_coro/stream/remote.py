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
import concurrent.futures
import logging
import sys
import uuid
import weakref
from contextvars import ContextVar
from typing import Any

from dask.base import tokenize
from dask.sizeof import sizeof

from .._exceptions import DaskCoroError
from .._internals.distributed.client import future_in_memory
from .._internals.distributed.worker import send_on_worker_stream, store_own_data
from ..runtime.extensions import Run
from .book import ANNOTATION, NOTE, PUBLISH

logger = logging.getLogger("dask_coro")

#: Items of at most this many bytes (``sizeof``) travel with their
#: publication, a copy held by the scheduler until the consumer took them.
SMALL = 16 * 1024

#: NumPy arrays of a numeric dtype of at least this many bytes in an item
#: (the item itself, or in lists, tuples and dicts) go through shared memory:
#: copied into a segment owned by the item's key on emit, the consumer maps
#: it (``lifetimes.shm``). Smaller ones are not worth a segment's costs.
SHARED = 1 << 20
#: Segment names a producer ties ahead of the items that will need them (one
#: round trip to the scheduler for several, while the body makes the next).
AHEAD = 4

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
        #: Segment names tied to the producer's key, for items to come, and
        #: segments of items given back (``lifetimes.shm.Pool``).
        self.pool: Any = None
        #: The size of the last array the producer shared (what it makes
        #: the segments ahead for).
        self.size = 0
        #: Names on their way to the scheduler: their tie's answer (None if
        #: the producer's key is forgotten).
        self.pending: concurrent.futures.Future[list[str] | None] | None = None
        #: Publishes the items in order once one held shared memory, and
        #: the last item given to it.
        self.publisher: concurrent.futures.ThreadPoolExecutor | None = None
        self.last: concurrent.futures.Future[None] | None = None


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


def _shareable(a: Any) -> bool:
    np = sys.modules.get("numpy")
    return (
        np is not None and type(a) is np.ndarray and a.nbytes >= SHARED and not a.dtype.hasobject
    )


def _count_shareable(x: Any, born: dict[int, str] | None = None) -> int:
    """The arrays of item ``x`` that go through shared memory (``SHARED``),
    but those handed over in the segment they were made in (``born``)."""
    if _shareable(x):
        return 0 if born and id(x) in born else 1
    t = type(x)
    if t is list or t is tuple:
        return sum(_count_shareable(v, born) for v in x)
    if t is dict:
        return sum(_count_shareable(v, born) for v in x.values())
    return 0


def _refs(container: Any, key: Any) -> int:
    """References to ``container[key]``: 2 if the container's is its only
    one (``sys.getrefcount`` counts its own argument)."""
    return sys.getrefcount(container[key])


def _refs_as_expected() -> bool:
    """``_refs`` tells an object held only by its container from one held
    elsewhere too, on this interpreter (an interpreter that borrows
    references on its stack counts one less: then nothing is handed over)."""
    held = object()
    return _refs([object()], 0) == 2 and _refs([held], 0) == 3


def _born(container: Any, key: Any, pool: Any, born: dict[int, str]) -> None:
    """Note in ``born`` the arrays of ``container[key]`` and below made in a
    segment of the producer's ``pool`` and held by nothing but their
    container, each container on the way held by nothing but its own: no
    name in the body, no view reaches them, so no one writes them after the
    emit (``shm.hand_over``). ``id`` -> the segment's name."""
    if _refs(container, key) != 2:
        return
    x = container[key]
    if _shareable(x):
        name = pool.made_here(x)
        if name is not None:
            born[id(x)] = name
        return
    t = type(x)
    if t is list or t is tuple:
        for i in range(len(x)):
            _born(x, i, pool, born)
    elif t is dict:
        for k in x:
            _born(x, k, pool, born)


class _Released(Exception):
    """A segment's release ran before it was made: the producer's key is
    forgotten (it is being cancelled)."""


def _share(
    x: Any, names: list[str], p: Producer, digests: dict[int, str] | None = None, born: dict[int, str] | None = None
) -> Any:
    """``x`` with its shareable arrays copied into the segments of those
    ``names`` (taken from the list, in order), or handed over in the segment
    they were made in (``born``, from ``_born``). With ``digests``
    (xxhash is installed), a contiguous array is hashed as it is copied (one
    pass over its bytes): its copy's digest under the copy's ``id``."""
    if _shareable(x):
        from ..lifetimes import shm

        p.size = x.nbytes
        if born and id(x) in born:
            # No one writes it any more: hashed on the publisher's thread,
            # while the body makes the next item.
            return shm.hand_over(born[id(x)], x, p.pool)
        hasher = None
        if digests is not None and (x.flags.c_contiguous or x.flags.f_contiguous):
            import xxhash

            hasher = xxhash.xxh3_128()
        out = shm.copy_into(names.pop(0), x, p.pool, hasher)
        if out is None:
            raise _Released
        if hasher is not None and digests is not None:
            digests[id(out)] = hasher.hexdigest()
        return out
    t = type(x)
    if t is list or t is tuple:
        return t(_share(v, names, p, digests, born) for v in x)
    if t is dict:
        return {k: _share(v, names, p, digests, born) for k, v in x.items()}
    return x


def _reserve(run: Run, p: Producer, n: int) -> None:
    """On the run's lane: ``n`` segment names recorded on this host, tied to
    the producer's key on the loop (``p.pending``)."""
    from ..lifetimes.shm import reserve, spares
    from ..lifetimes.tie import tie_names

    names = reserve(run.worker, n)
    # Half of them are made ahead, the others kept for the segments of items
    # given back (``Pool``); once one was, later items are copied into those:
    # none is made ahead any more, nor while earlier streams left spares.
    ahead = [] if p.pool.recycling or not p.size or spares.held else names[: n // 2]
    size = p.size

    async def tie() -> list[str] | None:
        if not await tie_names(run.worker, run.key, names):
            return None
        if ahead:
            # Made ahead of the items, of the last one's size, in a thread
            # while the body makes them: the emit only copies.
            from ..lifetimes.shm import prepare

            for name in ahead:
                await asyncio.to_thread(prepare, name, size)
        return names

    p.pending = asyncio.run_coroutine_threadsafe(tie(), run.loop)


async def _names(run: Run, p: Producer, n: int) -> list[str] | None:
    """On the run's lane: ``n`` segment names tied to the producer's key
    (a segment is tied before it exists: a worker dying at any moment leaves
    nothing nobody releases); None if that key is forgotten (the producer is
    being cancelled). The next ones are asked for ahead: a release of an item's
    segment in this process gives it back under one of them (``Pool``)."""
    if p.pool is None:
        from ..lifetimes.shm import Pool, spares

        spares.start(run.worker, run.loop)
        p.pool = Pool()
    pool = p.pool
    while True:
        if p.pending is not None and (p.pending.done() or len(pool) < n):
            names = await asyncio.wrap_future(p.pending)
            p.pending = None
            if names is None:
                return None
            pool.add(names)
        if len(pool) >= n:
            break
        _reserve(run, p, n - len(pool) + 2 * AHEAD)
    out = pool.take(n)
    if p.pending is None and pool.unmade() < AHEAD:
        _reserve(run, p, 2 * AHEAD)
    return out


def _publication(run: Run, index: int, x: Any, token: str | None) -> dict[str, Any]:
    """On the run's lane: what publishes item ``index``, with its ``token``
    (for a re-run to compare) or None: it is computed later, off the lane
    (``_publish_later``; hashing 10 MB takes milliseconds)."""
    from distributed.protocol.pickle import dumps

    nbytes = sizeof(x)
    msg = {"op": PUBLISH, "key": run.key, "index": index, "token": token, "nbytes": nbytes}
    if nbytes <= SMALL:
        # A copy rides along: the consumer gets it from the scheduler with
        # the item's key, without a gather from this worker.
        msg["value"] = dumps(x)
    return msg


def _publisher(p: Producer) -> concurrent.futures.ThreadPoolExecutor:
    """The producer's thread that publishes its items in order once one held
    shared memory: such an item's token is computed there, on a copy no one
    changes, while the body goes on making the next one (hashing 10 MB takes
    longer than copying it)."""
    if p.publisher is None:
        p.publisher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dask-coro-stream-publish")
    return p.publisher


def _digested(x: Any, xxhash: Any, digests: dict[int, str]) -> Any:
    """``x`` with its arrays in shared memory (contiguous: ``_share`` made
    them) as their dtype, shape, strides and a hash of their bytes (taken
    from ``digests`` if ``_share`` hashed them as it copied them)."""
    import numpy as np

    from ..lifetimes.shm import ShmArray

    if type(x) is ShmArray and x._segment is not None:
        digest = digests.get(id(x))
        if digest is None:
            digest = xxhash.xxh3_128_hexdigest(x.view(np.ndarray).ravel(order="K"))  # no copy: contiguous
        return ("dask-coro-shared-array", x.dtype.str, x.shape, x.strides, digest)
    t = type(x)
    if t is list or t is tuple:
        return t(_digested(v, xxhash, digests) for v in x)
    if t is dict:
        return {k: _digested(v, xxhash, digests) for k, v in x.items()}
    return x


def _xxhash() -> Any:
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash


def _token(x: Any, digests: dict[int, str] | None = None) -> str:
    """The token of an item holding shared memory: its arrays hashed with
    xxh3 (twice as fast as the xxh64 ``tokenize`` takes), if installed."""
    xxhash = _xxhash()
    if xxhash is None:
        return tokenize(x)
    return tokenize(_digested(x, xxhash, digests or {}))


def _publish_later(run: Run, x: Any, msg: dict[str, Any]) -> None:
    """On the publisher's thread: ``x``'s token, then ``_send``."""
    if msg["token"] is None:
        try:
            msg["token"] = _token(x) if msg.get("shared") else tokenize(x)
        except Exception:  # pragma: no cover - tokenize falls back to a random token itself
            logger.exception("stream %r: item %d could not be tokenized", run.key, msg["index"])
            msg["token"] = uuid.uuid4().hex
    run.loop.call_soon_threadsafe(_send, run, x, msg)


async def published(run: Run) -> None:
    """On the worker's loop, as the run ends: every item the producer emitted
    is published (on the worker's stream, ahead of its task's end)."""
    p: Producer | None = run.notes.get(NOTE)
    if p is not None and p.pool is not None:
        p.pool.close()
    if p is None or p.publisher is None:
        return
    if p.last is not None:
        await asyncio.wrap_future(p.last)
    p.publisher.shutdown(wait=False)


def let_go_of_publisher(run: Run) -> None:
    """The run was cancelled: its items not published yet are dropped (the
    scheduler lets go of them as it hears of them)."""
    p: Producer | None = run.notes.get(NOTE)
    if p is not None and p.pool is not None:
        p.pool.close()
    if p is not None and p.publisher is not None:
        p.publisher.shutdown(wait=False)


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


async def emit_on_worker(run: Run, box: list[Any]) -> None:
    """``emit(x)`` in a run on a worker (on the run's lane), ``box`` holding
    ``x`` (its only reference here). Returns at once while the buffer has
    room (as last heard from the scheduler); else the body waits, without
    its thread, until the consumer takes an item."""
    p: Producer | None = run.notes.get(NOTE)
    if p is None:
        p = await _on_loop(run, _producer(run))
    if not p.on:
        return  # no stream's producer: the item is dropped
    born: dict[int, str] | None = None
    if p.pool is not None and p.pool.armed:
        # Arrays the body made in segments given back and keeps no
        # reference to are handed over in them (``shm.hand_over``); the
        # segments it made nothing in are not offered any more (copied
        # into, ``Pool.take``).
        born = {}
        if _HAND_OVER:
            _born(box, 0, p.pool, born)
        p.pool.disarm()
    x = box.pop()
    i = p.index
    if p.buffer is not None and i - p.taken >= p.buffer:
        if not await _on_loop(run, _room(run, p, i)):
            return
    shared: list[str] = []
    n = _count_shareable(x, born)
    if n or born:
        # With n = 0 (every array handed over in its segment) this still
        # ties names ahead: what segments are given back under.
        names = await _names(run, p, n)
        if names is None:
            return  # our consumer let go of us
        shared = list(names) + list(born.values() if born else ())
        digests: dict[int, str] | None = {} if _xxhash() is not None else None
        try:
            x = _share(x, names, p, digests, born)
        except _Released:
            return  # our consumer let go of us
        # Every array hashed as it was copied: the token is at hand (the
        # rest of the item is small); else (an array not hashed, or one
        # handed over) it is taken on the publisher's thread, while the body
        # makes the next item.
        token = _token(x, digests) if digests is not None and not born and len(digests) == n else None
    else:
        token = tokenize(x)
    p.index = i + 1
    msg = _publication(run, i, x, token)
    if shared:
        # The scheduler hands them over from the producer's key to the item's.
        msg["shared"] = shared
    if token is None or p.publisher is not None:
        p.last = _publisher(p).submit(_publish_later, run, x, msg)
    else:
        run.loop.call_soon_threadsafe(_send, run, x, msg)
    if p.size and p.pool is not None:
        # The body's next arrays of an item's size made in segments given
        # back or kept (``shm.hand_over``; NumPy's allocator was installed
        # in the body's context by its first ``emit``, ``allocate_here``).
        p.pool.arm(p.size)


#: ``_refs`` counts as this module expects (checked once).
_HAND_OVER = _refs_as_expected()

#: NumPy's allocator of arrays in segments given back is installed in this
#: context (a producer body's).
_allocating: ContextVar[bool] = ContextVar("dask_coro_allocating", default=False)


def allocate_here() -> None:
    """In ``emit``, in the body's own context (a context variable set by
    a call the body yields is not the body's): NumPy's arrays made in the
    body from now on come from the segments its producer arms
    (``emit_on_worker``) when they fit one (``lifetimes.shm.hand_over``);
    the others, and all of them while none is armed, as before."""
    if _HAND_OVER and not _allocating.get():
        from ..lifetimes.shm import install_allocator

        install_allocator()
        _allocating.set(True)


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
        #: This consumer's host (a worker's): items holding shared memory
        #: published on it ride along with their publication.
        self.host: str | None = None
        self.key: Any = None  # the producer's, once submitted

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

    async def fetch(
        self, client: Any, index: int, futures: bool = False, keep: list[int] | None = None
    ) -> tuple[list[Any], tuple[bool, Any] | None]:
        if self.future is None:
            await install(client)
            call, self.call = self.call, None
            self.future = await self.submit(client, call, {ANNOTATION: {"buffer": self.buffer}})
            if self.released:  # the stream was closed (from another thread) while we submitted
                self.release()
                return [], None
        key = self.key = self.future.key
        r = await client.scheduler.dask_coro_stream_next(
            key=key, index=index, client=client.id if futures else None, keep=keep, host=self.host
        )
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
        from distributed.comm.addressing import get_address_host

        from .._internals.dask_private import annotations_in_effect

        super().__init__(call, buffer)
        self.run = run
        self.host = get_address_host(run.worker.address)
        #: Items given to the body that hold shared-memory segments, by
        #: index: weak references to this process's mappings of them.
        self.given: list[tuple[int, list[Any]]] = []
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
        keep, hold = self._still_held(index)
        if hold:
            await self._hold(hold)
        items, end = await self.fetch(await self.run.submitting_client(), index, futures, keep)
        if not futures:
            await self._given(index, items)
        if end is not None and end[0]:
            # The producer's value: the body holds it now (shared arrays in it
            # tied to its key), as a yield's results, before the producer goes.
            await self.run.received([end[1]])
        return items, end

    # Shared memory in the items. An item is let go of once the body asks for
    # a later one: its segments are released with its key, unless the body
    # still holds an array over one (then it is tied to the body's key, as a
    # yield's results are). The body's loop variable holds the last item it
    # took while it asks for the next: that item is kept one request longer,
    # and looked at again then.

    async def _given(self, index: int, items: list[Any]) -> None:
        shm = sys.modules.get("dask_coro.lifetimes.shm")
        if shm is None or not shm.any_attached():
            return
        for i, item in enumerate(items, index):
            segments = shm.segments_held(item)
            if segments:
                self.given.append((i, [weakref.ref(s) for s in segments]))
            copies = {s.name for s in segments if s.name != s.origin}
            if copies:
                # This host's copy of another host's segment, made as the
                # item arrived: it goes with the item's key, as a copy that
                # arrives as a task's dependency does.
                from ..lifetimes.tie import hold_names
                from .book import item_key

                await hold_names(self.run.worker, item_key(self.key, i), copies)

    def _still_held(self, index: int | None) -> tuple[list[int], set[str]]:
        """Before asking for item ``index`` (None: letting go of every item):
        the items to keep one request longer, and the segments the body
        still holds, to tie to its key first."""
        keep: list[int] = []
        hold: set[str] = set()
        given, self.given = self.given, []
        for i, refs in given:
            names = {s.name for r in refs if (s := r()) is not None}
            if not names:
                continue
            if index is not None and i >= index - 1:
                keep.append(i)
                self.given.append((i, refs))
            else:
                hold |= names
        return keep, hold

    async def _hold(self, names: set[str]) -> None:
        from ..lifetimes.tie import hold_names

        await hold_names(self.run.worker, self.run.key, names)

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
        """Let go of the producer (any thread): of the items' shared memory,
        what the body still holds is tied to its key first."""
        self.released = True
        future, self.future = self.future, None
        if future is None:
            return
        _, hold = self._still_held(None)
        if not hold:
            self.run.release([future])
            return

        async def hold_then_release() -> None:
            try:
                await self._hold(hold)
            finally:
                self.run.release([future])

        asyncio.run_coroutine_threadsafe(hold_then_release(), self.run.loop)


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
