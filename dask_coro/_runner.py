"""The worker side: a coroutine task running on a distributed worker.

distributed awaits ``CoroutineTask.__call__`` on the worker's event loop
(``Worker.execute`` -> ``_run_task_async``). The runner:

1. steps the body on the worker's thread pool (CPU work never blocks the loop),
   inside one ``contextvars.Context`` per run, where ``current_key()`` is set;
2. at the first yield, secedes: a ``SecedeEvent`` turns the task into a
   long-running one on worker and scheduler, so a waiting coroutine holds no
   slot and no thread, only this heap object;
3. per yield, submits all children in one ``update-graph`` message
   (``Client.get(..., sync=False)``), waits for them, and resumes the body;
4. releases a result as soon as no live lazy value of the body depends on it
   (``ResultCache``), and everything at the end;
5. watches its own key through a worker plugin: when the scheduler cancels
   the task (root future cancelled, client closed), it stops waiting, closes
   the body (``finally`` blocks run) and releases its children, whose own
   runners then see their keys cancelled in turn.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Hashable
from time import time
from typing import TYPE_CHECKING, Any

import dask
from dask.utils import funcname
from distributed import Future, Reschedule, get_client
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.worker import get_worker, thread_state
from distributed.worker_state_machine import SecedeEvent

from . import _config
from ._cache import ResultCache
from ._classify import classifier
from ._context import running_key
from ._driver import Driver, Returned, Step, Yielded
from ._exceptions import CoroutineCancelledError, DaskCoroError
from ._lifetimes_worker import hold_segments
from ._plan import plan_yield
from ._structure import Structure
from ._tree_scheduler import ANNOTATION, TreePlugin

if TYPE_CHECKING:
    from distributed import Client, Worker

    from ._api import CoroutineTask

logger = logging.getLogger("dask_coro")

_RUNNING_STATES = ("executing", "long-running")


async def run_on_worker(task: CoroutineTask, args: tuple, kwargs: dict) -> Any:
    return await _Run(get_worker(), task).main(args, kwargs)


class _KeyWatcher(WorkerPlugin):
    """Wakes the run of a key whenever the worker's state machine moves it.

    ``WorkerState._notify_plugins`` calls ``transition`` on the event loop for
    every transition of every task; we only look up a dict.
    """

    name = "dask-coro-key-watcher"
    idempotent = True

    def __init__(self) -> None:
        self.runs: dict[Hashable, _Run] = {}
        self.client: Client | None = None
        self.tree: asyncio.Future[None] | None = None  # TreePlugin installed

    def transition(self, key: Hashable, start: str, finish: str, **kwargs: Any) -> None:
        run = self.runs.get(key)
        if run is not None:
            run.changed.set()


def _watcher(worker: Worker) -> _KeyWatcher:
    # Worker.plugins is the same dict the WorkerState notifies; inserting into it
    # is synchronous (Worker.plugin_add is a coroutine that would also replace
    # an existing plugin, dropping the runs it watches).
    w = worker.plugins.get(_KeyWatcher.name)
    if w is None:
        w = worker.plugins[_KeyWatcher.name] = _KeyWatcher()
    return w  # type: ignore[return-value]


class _Cancelled(Exception):
    """Internal: the scheduler released our key while we were running."""


class _Run:
    def __init__(self, worker: Worker, task: CoroutineTask):
        self.worker = worker
        self.key = task.key
        self.func = task.func
        self.name = funcname(task.func)
        self.loop = asyncio.get_running_loop()
        self.executor = worker.executors["default"]
        self.ctx = contextvars.copy_context()
        self.ctx.run(running_key.set, self.key)
        self.changed = asyncio.Event()
        self.cache = ResultCache()
        self.held: dict[Hashable, Future] = {}  # renamed key -> our future for it
        self.start = time()
        self.seceded = False

    # -- helpers -------------------------------------------------------------

    def _in_pool(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        return self.loop.run_in_executor(self.executor, self.ctx.run, fn, *args)

    def _alive(self) -> bool:
        ts = self.worker.state.tasks.get(self.key)
        return ts is not None and ts.state in _RUNNING_STATES

    def _secede(self) -> None:
        # As distributed.secede() does, but from the event loop: no thread to
        # hand back, only the slot.
        self.worker.handle_stimulus(
            SecedeEvent(
                key=self.key,
                compute_duration=time() - self.start,
                stimulus_id=f"dask-coro-secede-{time()}",
            )
        )
        self.seceded = True

    async def _client(self) -> Client:
        # One lookup per worker: get_client() also logs a "worker-get-client"
        # event, which is a message to the scheduler on every call.
        client = self.watcher.client
        if client is None or client.status != "running":
            client = get_client()
            if client.status != "running":
                await client  # the worker's client is created lazily, unstarted
            comm = getattr(client, "scheduler_comm", None)
            # A client batches its messages to the scheduler over 10 ms
            # (Client._ensure_connected); a coroutine waits for each yield's
            # message, so on the worker's own client use coro.client-batch-interval
            # (default the 2 ms of the worker's stream, Worker.batched_stream).
            # null or 0 leaves distributed's interval alone.
            interval = _config.get_timedelta("coro.client-batch-interval", allow_none=True)
            if "-worker-" in client.id and comm is not None and interval:
                comm.interval = interval
            self.watcher.client = client
        return client

    async def _annotations(self) -> dict[str, Any]:
        """Annotations for our children: our key, which the scheduler's
        TreePlugin (installed once per worker) records as their parent, unless
        ``coro.tree.enabled`` is off. (Their span is ours already: we run in
        the context Worker.execute annotates with our task's span, so the whole
        tree lives in the span its root was computed in.)"""
        out: dict[str, Any] = {}
        if not _config.get("coro.tree.enabled"):
            return out
        watcher = self.watcher
        if watcher.tree is None:
            watcher.tree = asyncio.ensure_future(_install_tree(self.worker))
        try:
            await asyncio.shield(watcher.tree)
        except Exception:
            return out  # logged once, by _install_tree
        out[ANNOTATION] = self.key
        return out

    def _release(self, keys: list[Hashable]) -> None:
        for k in keys:
            f = self.held.pop(k, None)
            if f is not None:
                f.release()

    # -- the run -------------------------------------------------------------

    async def main(self, args: tuple, kwargs: dict) -> Any:
        ts = self.worker.state.tasks.get(self.key)
        if ts is None or ts.state != "executing":
            raise DaskCoroError(
                f"coroutine task {self.key!r} is not executing on this worker "
                f"(state {getattr(ts, 'state', None)!r}); was its key renamed by a "
                "graph optimization? Compute coroutine calls without low-level fusion."
            )
        watcher = self.watcher = _watcher(self.worker)
        watcher.runs[self.key] = self
        driver = Driver(self.name)
        step: Step | None = None
        try:
            step = await self._in_pool(driver.start, self.func, args, kwargs)
            index = 0
            while type(step) is Yielded:
                if not self._alive():
                    raise _Cancelled
                if not self.seceded:
                    self._secede()
                step = await self._resume(driver, step, index)
                index += 1
                self._release(self.cache.sweep())
            if type(step) is Returned:
                return step.value
            raise step.error
        except _Cancelled:
            logger.debug("coroutine %r cancelled; closing it", self.key)
            step = None
            closed = await self._in_pool(driver.close)
            if closed is not None:
                logger.warning(
                    "coroutine %r raised while closing after cancellation: %r",
                    self.key,
                    closed.error,
                )
            ts = self.worker.state.tasks.get(self.key)
            if ts is not None and ts.state in (*_RUNNING_STATES, "resumed"):
                # Asked for again while we were closing: run it again rather than
                # report the cancellation as the task's error.
                raise Reschedule() from None
            # The worker discards the outcome of a cancelled task.
            raise CoroutineCancelledError(f"coroutine {self.key!r} was cancelled") from None
        except asyncio.CancelledError:
            driver.close()  # the worker is closing; no pool to run on
            raise
        finally:
            if watcher.runs.get(self.key) is self:
                del watcher.runs[self.key]
            self.cache.clear()
            self._release(list(self.held))

    async def _resume(self, driver: Driver, step: Yielded, index: int) -> Step:
        """Compute what the body yielded and resume it with the result (or
        raise the error at the yield)."""
        try:
            structure = Structure(step.value, classifier(self.name, index))
            plan = plan_yield(
                structure.leaves, structure.paths, self.cache.known, self.key, index
            )
        except Exception as e:
            return await self._in_pool(driver.throw, e)
        del step
        client = await self._client()
        new: dict[Hashable, Future] = {}
        if plan.graph:
            wanted = [k for k in dict.fromkeys([*plan.keep, *plan.outputs]) if k in plan.graph]
            # Children get priority over unrelated queued work: the scheduler
            # ranks a graph by its submitting task, which Client._graph_to_futures
            # reads from thread_state.key; the loop thread has none of its own.
            annotations = await self._annotations()
            previous = getattr(thread_state, "key", None)
            thread_state.key = self.key
            try:
                with dask.annotate(**annotations):
                    futures = client.get(plan.graph, wanted, sync=False)
            finally:
                thread_state.key = previous
            new = dict(zip(wanted, futures))
        outputs = [new.get(k) or self.held[k] for k in plan.outputs]
        # Delayed results are held until no live lazy value needs them; the
        # rest (finalized collections) only until the body has them.
        self.cache.add(plan.layers)
        for k in plan.keep:
            self.held[k] = new[k]
        transient = [f for k, f in new.items() if k not in self.held]
        del plan, new
        try:
            results = await self._wait(client, outputs)
            # Before the children go: segments in their results are ours now.
            await hold_segments(self.worker, self.key, results)
        except _Cancelled:
            raise
        except Exception as e:
            del structure, outputs
            return await self._in_pool(driver.throw, e)
        finally:
            for f in transient:
                f.release()
        value = structure.rebuild(results)
        del structure, results, outputs
        return await self._in_pool(driver.send, value)

    async def _wait(self, client: Client, futures: list[Future]) -> list[Any]:
        """The results of ``futures``; raises the first error, or ``_Cancelled``."""
        if not futures:
            return []
        gathering = asyncio.ensure_future(client.gather(futures, asynchronous=True))
        try:
            while True:
                self.changed.clear()
                if not self._alive():
                    raise _Cancelled
                changed = asyncio.ensure_future(self.changed.wait())
                done, _ = await asyncio.wait(
                    (gathering, changed), return_when=asyncio.FIRST_COMPLETED
                )
                changed.cancel()
                if gathering in done:
                    return gathering.result()
        finally:
            if not gathering.done():
                # Cancelling Client._gather mid-way orphans its inner tasks, which
                # then log "Task exception was never retrieved"; it ends on its
                # own once our futures are released, so only retrieve its end.
                gathering.add_done_callback(_retrieve)


async def _install_tree(worker: Worker) -> None:
    from distributed.protocol.pickle import dumps

    try:
        await worker.scheduler.register_scheduler_plugin(
            plugin=dumps(TreePlugin()), name=TreePlugin.name, idempotent=True
        )
    except Exception as e:
        logger.warning(
            "dask_coro cannot record coroutine trees from worker %s (progress and "
            "tree will show nothing of its coroutines): %r",
            worker.address,
            e,
        )
        raise


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
