"""The pure part of a stream: what its producer published, what its
consumer took, and whether the producer has room for one more item
(``buffer``). The scheduler plugin keeps one per producer key."""

from __future__ import annotations

from typing import Any

#: The op of a published item on the producer's worker's stream.
PUBLISH = "dask-coro-stream-publish"

#: The annotation that makes a coroutine task a stream's producer:
#: ``{"buffer": n}``.
ANNOTATION = "dask_coro_stream"

#: Where a run keeps what it is as a producer (``Run.notes``).
NOTE = "stream"

#: How a producer's task ended, as the consumer hears it.
ENDED = ("memory", "erred", "forgotten")


def item_key(producer: Any, index: int) -> tuple[str, int]:
    """The key of item ``index`` of the producer whose key is ``producer``."""
    name = producer if isinstance(producer, str) else str(producer)
    return (f"{name}-item", index)


class Replay(Exception):
    """A re-run producer published, at an index the first run published,
    an item with another token."""


class StreamBook:
    """One stream: items ``0 .. published - 1`` were published (their
    tokens kept, to check a re-run); the consumer asked for item ``taken``
    (so took every item before it); ``held`` are the item keys the book
    holds for the consumer; ``ended`` how the producer's task ended."""

    def __init__(self, producer: Any):
        self.producer = producer
        self.tokens: list[str] = []
        self.taken = 0
        self.held: dict[int, Any] = {}
        self.ended: str | None = None
        #: Copies of small items (pickled), by index, until taken.
        self.values: dict[int, bytes] = {}
        #: The index the producer waits to publish (its buffer is full).
        self.blocked: int | None = None
        #: The host of the worker that published each item holding shared
        #: memory (its copy rides along only to a consumer of that host).
        self.hosts: dict[int, str] = {}

    @property
    def published(self) -> int:
        return len(self.tokens)

    def publish(self, index: int, token: str) -> bool:
        """Item ``index`` with ``token``: True if new (hold it), False if an
        earlier run published it already (the same: skip it). ``Replay`` if
        it differs, ``ValueError`` if an item before it is missing."""
        if index < len(self.tokens):
            if self.tokens[index] != token:
                raise Replay(
                    f"the producer {self.producer!r} was run again and emitted an item at "
                    f"index {index} that differs from the one its first run emitted there"
                )
            return False
        if index != len(self.tokens):
            raise ValueError(f"item {index} of {self.producer!r} published before item {len(self.tokens)}")
        self.tokens.append(token)
        self.held[index] = item_key(self.producer, index)
        return True

    def take(self, index: int, keep: Any = ()) -> list[Any]:
        """The consumer asks for item ``index``: it took every item before
        (a re-run consumer asks for 0 again). The keys the book lets go of:
        those before ``index`` but the ones the consumer asks to ``keep``
        a while (it may still hold their shared memory)."""
        self.taken = max(self.taken, index)
        gone = [i for i in self.held if i < index and i not in keep]
        for i in gone:
            self.values.pop(i, None)
            self.hosts.pop(i, None)
        return [self.held.pop(i) for i in gone]

    def small(self, index: int, n: int, host: str | None) -> list[bytes] | None:
        """The copies of items ``index .. index + n - 1`` that ride along to a
        consumer on ``host``, if every one has one (an item holding shared
        memory rides along only to its own host: elsewhere it is fetched, and
        its bytes cross once)."""
        out = []
        for i in range(index, index + n):
            v = self.values.get(i)
            if v is None or self.hosts.get(i, host) != host:
                return None
            out.append(v)
        return out or None

    def ready(self, index: int) -> list[Any]:
        """The keys of the items from ``index`` that are published."""
        return [item_key(self.producer, i) for i in range(index, len(self.tokens))]

    def room(self, index: int, buffer: int | None) -> bool:
        """Whether the producer may publish item ``index``: fewer than
        ``buffer`` items before it not yet taken."""
        return buffer is None or index - self.taken < buffer

    def let_go(self) -> list[Any]:
        out = list(self.held.values())
        self.held.clear()
        self.values.clear()
        self.hosts.clear()
        return out
