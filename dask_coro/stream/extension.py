"""Streams' hooks into the runtime (``runtime/extensions.py``): only the
scheduler plugin, installed by the preload (or by a stream's consumer on
first use, ``remote.py``); a run needs nothing else of it: a producer's
``emit`` and a consumer's wait reach the run through the engine's
``InPlace`` request and the run's methods for children of a feature's own."""

from __future__ import annotations

from typing import Any

from ..runtime.extensions import Extension, register


class StreamExtension(Extension):
    name = "stream"
    what = "hands a producer's items to its consumer"

    def scheduler_plugin(self) -> Any:
        from .scheduler import StreamPlugin

        return StreamPlugin()


STREAM = register(StreamExtension())
