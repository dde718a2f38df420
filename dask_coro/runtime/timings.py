"""How long a plain function's calls take in this worker process, and what
a task's round trip through the scheduler costs: what decides whether a
short child runs beside its parent rather than as a task.

Per process, one small table (``TIMINGS``):

- per function (by module and qualified name, so copies unpickled by value
  count as one), an exponentially weighted mean of its recent runs in this
  process, wherever they ran: as a task (``runtime/worker.py``: a plain
  function's run, its one step timed on its lane) or beside a run
  (``runtime/beside.py``). The time is the function's own: no wait for a
  thread, no message;
- the round trip of a child task (from its submission to its value at the
  parent, less its function's mean), measured by whoever submits children
  one by one and knows when each came back (a group), ``DEFAULT_ROUND_TRIP``
  until then.

``short(fn)`` says whether a function's calls are short enough to run
beside the parent instead of as tasks: measured (a function never run here
is not: its first calls go out as tasks and are measured where the
scheduler places them, and on their runs beside), with a mean under a
quarter of the round trip (``FRACTION``) and under ``CAP`` (2 ms) whatever
the round trip (a busy scheduler makes trips long, and a child of
milliseconds on one worker forgoes the other workers' threads). A child of
10 ms is never short. The table is read and written from lanes and the
event loop without a lock: each update is one dict store, and a lost update
only delays the mean.
"""

from __future__ import annotations

from typing import Any

from .call import PLAIN

#: A task's round trip until a group measured one (seconds).
DEFAULT_ROUND_TRIP = 0.005
#: A function is short when its mean is under this part of the round trip...
FRACTION = 0.25
#: ... and under this many seconds whatever the round trip.
CAP = 0.002
#: Weight of the newest run in a function's mean (and of a round trip's).
ALPHA = 0.25
#: Functions remembered; the oldest measured are forgotten past this.
SIZE = 1024


def name_of(run: Any) -> str:
    """The table's name for the function a coroutine function runs (its
    ``run``: the function itself, or the shim around a plain function)."""
    func = getattr(run, "func", run)
    module = getattr(func, "__module__", None) or ""
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(type(func))
    return f"{module}.{qualname}"


class Timings:
    def __init__(self) -> None:
        self.runs: dict[str, float] = {}
        self.round_trip = DEFAULT_ROUND_TRIP
        self.trips = 0  # round trips measured
        #: None: decide from the measurements. True: every plain function
        #: is short, False: none is (the conformance rounds force each).
        self.force: bool | None = None

    def ran(self, name: str, seconds: float) -> None:
        """A run of ``name`` took ``seconds`` here."""
        runs = self.runs
        mean = runs.pop(name, None)  # re-inserted: the newest last
        runs[name] = seconds if mean is None else mean + ALPHA * (seconds - mean)
        if len(runs) > SIZE:
            del runs[next(iter(runs))]

    def mean(self, name: str) -> float | None:
        return self.runs.get(name)

    def tripped(self, seconds: float) -> None:
        """A child task's round trip, its own run left out, took ``seconds``."""
        if seconds < 0:
            seconds = 0.0
        self.round_trip = seconds if not self.trips else self.round_trip + ALPHA * (seconds - self.round_trip)
        self.trips += 1

    def short(self, name: str) -> bool:
        if self.force is not None:
            return self.force
        mean = self.runs.get(name)
        return mean is not None and mean < CAP and mean < FRACTION * self.round_trip


TIMINGS = Timings()


def short_call(call: Any) -> bool:
    """Whether ``call`` (a ``CoroutineCall`` run inline) is of a plain
    function short here: a yield keeps it to run inline rather than hand it
    out to an idle thread as a task (``core.engine.Trampoline.short``)."""
    fn = call._fn
    return fn is not None and fn.kind == PLAIN and TIMINGS.short(function_name(fn))


def function_name(fn: Any) -> str:
    """``name_of`` a coroutine function's ``run``, kept on the function."""
    name: str | None = fn.__dict__.get("_dask_coro_timed")
    if name is None:
        name = fn.__dict__["_dask_coro_timed"] = name_of(fn.run)
    return name
