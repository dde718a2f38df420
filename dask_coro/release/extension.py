"""Workers releasing keys: the hooks into the runtime (``runtime/extensions.py``).

With ``coro.worker-release.enabled``: the first coroutine on each worker
installs ``ReleasePlugin`` (which installs ``ReleaseWorkerPlugin`` on every
worker), and the children a run lets go of after it resumed are released
here at once (``ReleaseWorkerPlugin.let_go``, on the client's loop, after
the client's own reference counting).
"""

from __future__ import annotations

from typing import Any

from ..runtime.extensions import Extension, Run, register


class ReleaseExtension(Extension):
    name = "release"
    setting = "coro.worker-release.enabled"
    what = "lets workers release keys themselves"
    at_first_use = True

    def scheduler_plugin(self) -> Any:
        from .scheduler import ReleasePlugin

        return ReleasePlugin()

    def released(self, run: Run, futures: list[Any]) -> None:
        # From any thread: a dict lookup, then a callback on the client's loop.
        from .._internals.distributed.worker import worker_plugin
        from .worker import ReleaseWorkerPlugin

        plugin = worker_plugin(run.worker, ReleaseWorkerPlugin.name)
        if plugin is not None:
            client = futures[0].client
            client.loop.add_callback(plugin.let_go, client, [f.key for f in futures])


RELEASE = register(ReleaseExtension())
