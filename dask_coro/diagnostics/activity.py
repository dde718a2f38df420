"""Groups and streams as the scheduler sees them, for the dashboard's
Coroutines page. Pure: reports in, rows and a history of totals out.

A group is reported by the worker its coroutine runs on
(``groups/worker.py``, ``GROUP_OP``): its children counted by state, at most
every ``REPORT_INTERVAL`` while they change, and once more when it closes. A
stream is reported by ``StreamPlugin`` in the scheduler's own process as its
items are published and taken, and when its producer's task ends: no
message of its own.

Memory. A running group or stream stands for a coroutine or a producer the
scheduler runs, so there are as many as the cluster runs; one that ended is
kept ``KEEP`` seconds, at most ``MAX_ENDED`` of each kind (the oldest go
first). The history is one sample of the totals (children ended, items
produced, items taken, since the plugin started) per ``SAMPLE`` seconds in
which one changed, the last ``HISTORY`` of them.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the type checker only: this module does not import dask
    from dask.typing import Key

#: Worker stream op: ``{"key": parent, "group": n, "counts": [pending,
#: running, done, failed, cancelled], "limit": limit, "closed": bool}``.
GROUP_OP = "dask_coro_group_counts"
REPORT_INTERVAL = 0.5  # s: a worker sends a group's counts at most this often
KEEP = 60.0  # s an ended group or stream stays listed
MAX_ENDED = 200  # ended groups (and ended streams) kept, at most
SAMPLE = 1.0  # s: one sample of the totals per such interval that changed them
HISTORY = 600  # samples kept

GROUP_STATES = ("pending", "running", "done", "failed", "cancelled")
#: How a stream's producer ended, by the state its task ended in.
STREAM_ENDS = {"memory": "done", "erred": "failed", "forgotten": "cancelled"}


class GroupRow:
    """One group: the ``n``-th its parent (a coroutine's key) opened."""

    __slots__ = ("counts", "ended", "limit", "n", "parent", "since", "state")

    def __init__(self, parent: Key, n: int, now: float) -> None:
        self.parent = parent
        self.n = n
        self.counts = [0] * len(GROUP_STATES)
        self.limit: int | None = None
        self.state = "open"  # "closed" by its block; "parent-<state>" if its parent left first
        self.since = now
        self.ended: float | None = None


class StreamRow:
    """One stream: its producer's key, items published and taken (the
    consumer asked past them), the buffer it was made with."""

    __slots__ = ("buffer", "ended", "produced", "producer", "since", "state", "taken")

    def __init__(self, producer: Key, now: float) -> None:
        self.producer = producer
        self.produced = 0
        self.taken = 0
        self.buffer: int | None = None
        self.state = "running"
        self.since = now
        self.ended: float | None = None

    @property
    def buffered(self) -> int:
        """Published and not taken yet: what the stream's ``buffer`` bounds."""
        return max(self.produced - self.taken, 0)


class Activity:
    def __init__(self) -> None:
        self.groups: dict[tuple[Key, int], GroupRow] = {}
        self.streams: dict[Key, StreamRow] = {}
        #: Ended rows, oldest end first (a row that runs again leaves it).
        self.ended_groups: dict[tuple[Key, int], float] = {}
        self.ended_streams: dict[Key, float] = {}
        #: Open groups by parent key: their parent's end closes them.
        self.parents: dict[Key, set[int]] = {}
        #: Children ended (done or failed), items produced, items taken.
        self.totals = [0, 0, 0]
        self.history: deque[tuple[float, int, int, int]] = deque(maxlen=HISTORY)

    # -- groups ---------------------------------------------------------------

    def group(self, parent: Key, n: int, counts: list[int], limit: int | None, closed: bool, now: float) -> None:
        """The worker's report of group ``n`` of ``parent``."""
        if len(counts) != len(GROUP_STATES):
            raise ValueError(f"a group's counts are {GROUP_STATES}, not {counts!r}")
        ident = (parent, n)
        row = self.groups.get(ident)
        if row is None:
            row = self.groups[ident] = GroupRow(parent, n, now)
            self._start(now)
        before = row.counts[2] + row.counts[3]
        row.counts = [int(c) for c in counts]
        row.limit = limit
        self._add(0, row.counts[2] + row.counts[3] - before, now)
        if closed:
            self._end_group(row, "closed", now)
        else:  # open, or open again (its parent runs again elsewhere)
            self.ended_groups.pop(ident, None)
            row.state, row.ended = "open", None
            self.parents.setdefault(parent, set()).add(n)
        self.prune(now)

    def parent_ended(self, parent: Key, state: str, now: float) -> None:
        """``parent`` left processing (its end, or it is run again): its
        groups still open are over, as the worker did not say."""
        for n in self.parents.pop(parent, ()):
            row = self.groups.get((parent, n))
            if row is not None:
                self._end_group(row, f"parent-{state}", now)

    def _end_group(self, row: GroupRow, state: str, now: float) -> None:
        ident = (row.parent, row.n)
        open_ = self.parents.get(row.parent)
        if open_ is not None:
            open_.discard(row.n)
            if not open_:
                del self.parents[row.parent]
        if row.ended is None:
            row.state, row.ended = state, now
            self.ended_groups[ident] = now

    # -- streams --------------------------------------------------------------

    def stream(self, producer: Key, produced: int, taken: int, now: float, buffer: int | None = None) -> None:
        """Stream ``producer`` published ``produced`` items; its consumer
        took ``taken``."""
        row = self.streams.get(producer)
        if row is None:
            row = self.streams[producer] = StreamRow(producer, now)
            self._start(now)
        if buffer is not None:
            row.buffer = buffer
        self._add(1, produced - row.produced, now)
        self._add(2, taken - row.taken, now)
        row.produced, row.taken = produced, taken
        self.prune(now)

    def stream_ended(self, producer: Key, state: str | None, now: float) -> None:
        """Its producer's task ended in ``state`` (a key of ``STREAM_ENDS``),
        or, None, runs again (its worker died). A row ended keeps its end."""
        row = self.streams.get(producer)
        if row is None:
            return
        if state is None:
            self.ended_streams.pop(producer, None)
            row.state, row.ended = "running", None
        elif row.ended is None:
            row.state, row.ended = STREAM_ENDS.get(state, state), now
            self.ended_streams[producer] = now
        self.prune(now)

    # -- bounds and history ---------------------------------------------------

    def prune(self, now: float) -> None:
        """Forget what ended more than ``KEEP`` s ago, and the oldest ended
        beyond ``MAX_ENDED`` of each kind."""
        _prune(self.ended_groups, self.groups, now)
        _prune(self.ended_streams, self.streams, now)

    def _start(self, now: float) -> None:
        """The first sample: the totals when the first row came (the plot's start)."""
        if not self.history:
            t = self.totals
            self.history.append((now, t[0], t[1], t[2]))

    def _add(self, which: int, delta: int, now: float) -> None:
        # A row reported anew from zero (a re-run) does not take back what
        # was counted: the totals only grow.
        if delta <= 0:
            return
        self._start(now)
        history, totals = self.history, self.totals
        totals[which] += delta
        if len(history) > 1 and now - history[-1][0] < SAMPLE:
            history[-1] = (history[-1][0], totals[0], totals[1], totals[2])  # the same interval
        else:
            history.append((now, totals[0], totals[1], totals[2]))

    def rows(self, now: float) -> tuple[list[GroupRow], list[StreamRow]]:
        """The groups and streams kept, running ones first, then the newest."""
        self.prune(now)

        def order(row: GroupRow | StreamRow) -> tuple[bool, float]:
            return (row.ended is not None, -row.since)

        return sorted(self.groups.values(), key=order), sorted(self.streams.values(), key=order)

    def series(self, now: float) -> list[tuple[float, int, int, int]]:
        """The history, ending with the totals of ``now``."""
        out = list(self.history)
        if out and out[-1][0] < now:
            out.append((now, self.totals[0], self.totals[1], self.totals[2]))
        return out


def _prune(ended: dict[Any, float], rows: dict[Any, Any], now: float) -> None:
    while ended:
        ident, at = next(iter(ended.items()))
        if at > now - KEEP and len(ended) <= MAX_ENDED:
            break
        del ended[ident]
        rows.pop(ident, None)
