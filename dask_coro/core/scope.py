"""What a runner keeps for one frame that starts remote leaves, and when it
lets go of it.

Pure: no dask, no distributed. Both runners use it: on a worker a handle is
the ``distributed.Future`` of a key, in-process it is the computed value. The
decisions are the same: which key answers each leaf of the current yield,
which results later yields may reuse (held while a live lazy value of the
body depends on them, see ``ResultCache``), and what to release when a yield
or the body ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .cache import ResultCache

if TYPE_CHECKING:  # for the type checker only: this module does not import dask
    from dask.typing import Key
H = TypeVar("H")


class Scope(Generic[H]):
    """One frame's remote work.

    ident
        The name its children's keys derive from (``Frame.ident``).
    cache
        Original keys computed by earlier yields -> the keys holding them.
    held
        Handles of results later yields may reuse, by their (renamed) key.
    pending
        ``position -> (key, handle)`` for the remote leaves of the current yield.
    error
        Raised at the yield when the frame waits (planning its leaves failed).
    """

    __slots__ = ("ident", "cache", "held", "pending", "error")

    def __init__(self, ident: Any) -> None:
        self.ident = ident
        self.cache = ResultCache()
        self.held: dict[Key, H] = {}
        self.pending: dict[int, tuple[Key, H]] = {}
        self.error: BaseException | None = None

    @staticmethod
    def wanted(outputs: Sequence[Key], keep: Sequence[Key], graph: Mapping[Key, Any]) -> list[Key]:
        """The keys of a plan to ask the cluster for: the new ones among its
        outputs and kept keys (an output already held is answered by its
        handle), in order, once each."""
        return [k for k in dict.fromkeys((*keep, *outputs)) if k in graph]

    def record(
        self,
        positions: Sequence[int],
        outputs: Sequence[Key],
        keep: Iterable[Key],
        layers: Iterable[tuple[Any, dict[Key, Key]]],
        new: Mapping[Key, H],
    ) -> None:
        """Leaves ``positions`` are answered by ``outputs``; ``new`` holds the
        handles just made. Kept keys are held while their ``layers`` live."""
        held = self.held
        for pos, k in zip(positions, outputs, strict=True):
            self.pending[pos] = (k, new[k] if k in new else held[k])
        self.cache.add(layers)
        for k in keep:
            held[k] = new[k]

    def handles(self, positions: Iterable[int]) -> list[H]:
        """The handles answering ``positions`` of the current yield."""
        return [self.pending[p][1] for p in positions]

    def end_yield(self) -> list[H]:
        """The current yield ended (resumed, or abandoned by an error): the
        handles to release now. Those of its leaves not held for later
        yields, and held results no live lazy value depends on any more."""
        held = self.held
        out = [h for k, h in self.pending.values() if held.get(k) is not h]
        self.pending.clear()
        self.error = None
        for k in self.cache.sweep():
            if k in held:
                out.append(held.pop(k))
        return out

    def end_body(self) -> list[H]:
        """The body ended: every handle still held, to release."""
        out = list(self.held.values())
        self.held.clear()
        self.cache.clear()
        return out
