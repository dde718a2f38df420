"""Lifetimes' hooks into the runtime (``runtime/extensions.py``).

``LifetimesPlugin`` is installed by the preload, or by ``tie`` on first use;
shared arrays a body passes on as values go as keys of its worker
(``passed.py``); a coroutine ties the shared-memory segments in what
reaches its body (a yield's results, a group's children, a stream's items:
``results_received``) to its own key before it lets the children go
(``hold_segments``), since its body now holds them.
"""

from __future__ import annotations

from typing import Any

from ..runtime.extensions import Extension, Run, register


class LifetimesExtension(Extension):
    name = "lifetimes"
    what = "releases resources tied to keys"
    keeper = "dask-coro-lifetimes"  # LifetimesPlugin.keeps: keys resources are tied to

    def scheduler_plugin(self) -> Any:
        from .scheduler import LifetimesPlugin

        return LifetimesPlugin()

    async def submitting(self, run: Run, client: Any, graph: dict[Any, Any]) -> list[Any]:
        # Shared arrays the body passes on as values go as keys of its
        # worker, as between tasks: they reach other hosts (passed.py).
        from .passed import any_shared, pass_on

        if not any_shared():  # this process maps no segment the cluster manages
            return []
        return await pass_on(client, run.worker.address, graph)

    async def results_received(self, run: Run, results: list[Any]) -> None:
        from .tie import hold_segments

        await hold_segments(run.worker, run.key, results)


LIFETIMES = register(LifetimesExtension())
