"""Worker side: a waiting coroutine lends its task's resources and takes
them back before its body goes on (``lent``), through ``ResourceLender``,
one per worker.

``lent`` is the one call the runner makes, around each wait of a run (its
children, or an asyncio await of an async body), once the task is
long-running. The worker's state machine lends and takes
(``_internals.lend_resources``, ``take_resources``), so a task queued for the
resource starts as soon as it is lent, and the worker never counts more in
use than it has. A run that wants its resources back while they are in use
waits (``book.Lending``); every transition that may free some (a task
leaving ``executing`` or ``long-running``, another run lending) looks again,
once per turn of the event loop. The scheduler hears of both on the worker's
stream (``scheduler.ResourcePlugin``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from dask.typing import Key
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol.pickle import dumps

from .._exceptions import Released
from .._internals.distributed.worker import (
    add_worker_plugin_now,
    scheduler_stream_open,
    send_on_worker_stream,
)
from .._internals.distributed.worker_state_machine import (
    available_resources,
    lend_resources,
    take_resources,
    task_resources,
    task_run_id_priority,
    worker_task_state,
)
from .book import Lending
from .scheduler import OP, ResourcePlugin

logger = logging.getLogger("dask_coro")

T = TypeVar("T")

#: What a run raises when it stops waiting for good (cancelled, its worker
#: closing): it takes nothing back, the task no longer counts its resources.
_ENDING = (Released, asyncio.CancelledError, SystemExit, KeyboardInterrupt)

#: A task leaving one of these states may free resources.
_HOLDING = frozenset({"executing", "long-running", "cancelled", "resumed"})


async def lent(
    worker: Any,
    key: Key,
    waiting: Awaitable[T],
    until: Callable[[asyncio.Future[Any]], Awaitable[Any]],
) -> T:
    """Await ``waiting`` with the resources of task ``key`` (long-running
    here) lent, and take them back before returning or raising what it
    raised; a run that ends meanwhile (``_ENDING``) takes nothing back.
    ``until`` is how the run awaits (raises ``Released`` if its task stops
    running here): the wait to take them back is one too."""
    if not task_resources(worker, key):
        return await waiting
    lender = _lender(worker)
    try:
        await lender.install()
    except BaseException:  # the worker is closing
        if asyncio.iscoroutine(waiting):
            waiting.close()  # never started: no "never awaited" warning
        raise
    lender.lend(key)
    try:
        try:
            out = await waiting
        except _ENDING:
            raise
        except BaseException:
            await lender.take(key, until)  # before the error is thrown into the body
            raise
        await lender.take(key, until)
        return out
    finally:
        lender.forget(key)


def _lender(worker: Any) -> ResourceLender:
    lender: ResourceLender = add_worker_plugin_now(worker, ResourceLender.name, ResourceLender)
    if lender.worker is None:
        lender.setup(worker)
    return lender


class ResourceLender(WorkerPlugin):
    """The resources waiting coroutines on one worker lent (``book.Lending``),
    and the runs waiting to take them back."""

    name = "dask-coro-resource-lender"
    idempotent = True

    def __init__(self) -> None:
        self.book = Lending()
        self.worker: Any = None
        self.wakers: dict[Key, asyncio.Future[None]] = {}
        self.looking = False  # a look at the waiting runs is scheduled
        self.installing: asyncio.Future[bool] | None = None

    def setup(self, worker: Any) -> None:
        self.worker = worker

    async def install(self) -> bool:
        """Install ``ResourcePlugin`` on the scheduler, once (a stream message
        with no handler there would close the worker's stream); whether it
        is. Without it the scheduler's ``used_resources`` go on counting lent
        resources as used, and nothing else changes."""
        if self.installing is None or (self.installing.done() and not self.installing.result()):
            self.installing = asyncio.ensure_future(self._install())
        return await asyncio.shield(self.installing)

    async def _install(self) -> bool:
        plugin = ResourcePlugin()
        try:
            await self.worker.scheduler.register_scheduler_plugin(
                plugin=dumps(plugin), name=plugin.name, idempotent=True
            )
        except Exception as e:
            logger.warning(
                "dask_coro cannot install %s from worker %s: %r; the scheduler's "
                "used_resources count lent resources as used",
                plugin.name, self.worker.address, e,
            )
            return False
        return True

    def _tell(self, key: Key, lent: bool, resources: dict[str, float]) -> None:
        installing = self.installing
        if installing is None or not installing.done() or not installing.result():
            return
        if not scheduler_stream_open(self.worker):
            return
        found = task_run_id_priority(self.worker, key)
        if found is None:
            return  # forgotten here: the scheduler let go of it too
        run_id, _ = found
        send_on_worker_stream(
            self.worker,
            {"op": OP, "key": key, "run_id": run_id, "lent": lent, "resources": resources},
        )

    def lend(self, key: Key) -> None:
        resources = lend_resources(self.worker, key)
        if not resources:
            return
        self.book.lend(key, resources)
        self._tell(key, True, resources)
        if self.book.waiting:
            self._look_soon()  # what it lent may be what another run waits for

    async def take(self, key: Key, until: Callable[[asyncio.Future[Any]], Awaitable[Any]]) -> None:
        """Take back what ``key`` lent, waiting until the worker has it free."""
        if key not in self.book.lent:
            return
        found = task_run_id_priority(self.worker, key)
        # A task forgotten meanwhile is passed over by the grants (it is not
        # long-running); ``until`` raises Released for it at once.
        self.book.wait(key, () if found is None else found[1])
        woken = self.wakers[key] = asyncio.get_running_loop().create_future()
        self._look()
        try:
            await until(woken)
        finally:
            if self.wakers.get(key) is woken:
                del self.wakers[key]

    def forget(self, key: Key) -> None:
        """``key`` stops waiting for good with its resources lent: the worker
        counts them as free already, and the task ends holding none."""
        if self.book.forget(key) is not None and self.book.waiting:
            self._look_soon()

    def transition(self, key: Key, start: str, finish: str, **kwargs: Any) -> None:
        # On the event loop, inside the state machine's step: look after it.
        if self.book.waiting and start in _HOLDING:
            self._look_soon()

    def _look_soon(self) -> None:
        if not self.looking:
            self.looking = True
            asyncio.get_running_loop().call_soon(self._look)

    def _look(self) -> None:
        """Give the waiting runs whose resources are free their resources back."""
        self.looking = False
        worker = self.worker
        alive = lambda key: worker_task_state(worker, key) == "long-running"  # noqa: E731
        key: Any
        for key in self.book.grants(available_resources(worker), alive):
            resources = self.book.lent[key]
            if not take_resources(worker, key, resources):
                break  # not free after all: the next transition looks again
            self.book.taken(key)
            self._tell(key, False, resources)
            woken = self.wakers.get(key)
            if woken is not None and not woken.done():
                woken.set_result(None)
