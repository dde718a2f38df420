"""Promises' hooks into the runtime (``runtime/extensions.py``): only the
scheduler plugin, installed by the preload (or by a ``Promise`` on first
use); a run needs nothing of it."""

from __future__ import annotations

from typing import Any

from ..runtime.extensions import Extension, register


class PromiseExtension(Extension):
    name = "promise"
    what = "resolves promises"
    keeper = "dask-coro-promises"  # PromisePlugin.keeps: promises and their targets

    def scheduler_plugin(self) -> Any:
        from .scheduler import PromisePlugin

        return PromisePlugin()


PROMISE = register(PromiseExtension())
