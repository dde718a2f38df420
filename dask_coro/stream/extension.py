"""Streams' hooks into the runtime (``runtime/extensions.py``): the
scheduler plugin, installed by the preload (or by a stream's consumer on
first use, ``remote.py``), and a producer's end, which waits for its items
to be published; a producer's ``emit`` and a consumer's wait reach the run
through the engine's ``InPlace`` request and the run's methods for children
of a feature's own."""

from __future__ import annotations

from typing import Any

from ..runtime.extensions import Extension, Run, register
from .book import NOTE


class StreamExtension(Extension):
    name = "stream"
    what = "hands a producer's items to its consumer"

    def scheduler_plugin(self) -> Any:
        from .scheduler import StreamPlugin

        return StreamPlugin()

    async def run_ended(self, run: Run, outcome: Any) -> None:
        # A producer publishes its items holding shared memory from a thread
        # of its own: all of them before its task's end (which the consumer
        # hears of after them), unless it was cancelled.
        if NOTE not in run.notes:
            return
        from .remote import let_go_of_publisher, published

        if outcome is None:
            let_go_of_publisher(run)
        else:
            await published(run)


STREAM = register(StreamExtension())
