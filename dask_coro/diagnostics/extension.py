"""The tree's hooks into the runtime (``runtime/extensions.py``).

With ``coro.tree.enabled``: the first coroutine on each worker installs
``TreePlugin``; every child a coroutine submits carries its key (the
runtime's ``PARENT``: ``parent``), which the plugin records as the child's parent; and a run
that calls inline counts its calls per function and sends what changed to
the plugin every ``CALLS_INTERVAL`` s and at its end, on the worker's stream
(ahead of the task's own end), so progress and tree count inline calls too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..runtime.extensions import Extension, Run, register
from .book import CALLS_OP

logger = logging.getLogger("dask_coro")

CALLS_INTERVAL = 0.5  # s between two reports of the inline calls of a run


class TreeExtension(Extension):
    name = "diagnostics"
    setting = "coro.tree.enabled"
    what = "records the coroutine trees progress and tree show"
    at_first_use = True
    counts_calls = True
    parent = True

    def scheduler_plugin(self) -> Any:
        from .scheduler import TreePlugin

        return TreePlugin()

    def run_started(self, run: Run) -> None:
        if run.trampoline.calls is None:  # runs nothing inline: nothing to count
            return
        reported: dict[str, tuple[int, int, int]] = {}  # inline calls sent, by name
        reporter = asyncio.ensure_future(_report_calls(run, reported))
        run.notes[self.name] = (reporter, reported)

    async def run_ended(self, run: Run, outcome: Any) -> None:
        note = run.notes.pop(self.name, None)
        if note is None:
            return
        reporter, reported = note
        reporter.cancel()
        if outcome is not None:  # the last counts, ahead of the task's own end
            _send_calls(run, reported)


async def _report_calls(run: Run, reported: dict[str, tuple[int, int, int]]) -> None:
    """Send the counts of inline calls now and then while the run runs."""
    try:
        while True:
            await asyncio.sleep(CALLS_INTERVAL)
            _send_calls(run, reported)
    except asyncio.CancelledError:
        pass
    except Exception as e:  # never fail the task for its diagnostics
        logger.debug("coroutine %r: reporting inline calls failed: %r", run.key, e)


def _own_step(func: Any) -> bool:
    """A step of dask_coro's own that the engine runs as a call in the body's
    stack (``core.calls.InPlace``): a group's wait for its next child
    (``_more``), a stream's emit or take. Not a function of the user's tree:
    progress, the tree and the dashboard leave it out. A function of
    ``dask_coro.examples`` is the user's (it stands for one)."""
    module = getattr(func, "__module__", None) or ""
    return module.startswith("dask_coro.") and module != "dask_coro.examples"


def _send_calls(run: Run, reported: dict[str, tuple[int, int, int]]) -> None:
    """Send what changed in the counts of inline calls since ``reported``,
    by function name, to the scheduler's TreePlugin (installed before the run
    started: a stream message nobody handles would close the stream)."""
    from dask.utils import funcname

    from .._internals.distributed.worker import scheduler_stream_open, send_on_worker_stream
    from ..core.localize import evaluate

    totals: dict[str, tuple[int, int, int]] = {}
    for func, (started, done, failed) in run.trampoline.call_counts().items():
        if func is evaluate or _own_step(func):
            continue  # a value computed in place (its calls are counted), a step of ours
        name = funcname(func)
        s, d, f = totals.get(name, (0, 0, 0))
        totals[name] = (s + started, d + done, f + failed)
    delta = {}
    for name, now in totals.items():
        before = reported.get(name, (0, 0, 0))
        if now != before:
            delta[name] = [a - b for a, b in zip(now, before, strict=True)]
    if not delta or not scheduler_stream_open(run.worker):
        return
    reported.update(totals)
    send_on_worker_stream(run.worker, {"op": CALLS_OP, "key": run.key, "calls": delta})


TREE = register(TreeExtension())
