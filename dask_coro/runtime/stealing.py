"""The runtime's own extension: work stealing's scheduler plugin.

``InlinePlugin`` (``scheduler.py``) tells workers running calls inline how
many threads are idle. It is registered in the one table of extensions
(``extensions.py``) as a feature's plugins are, so the preload and the first
coroutine task on each worker install it the same way.
"""

from __future__ import annotations

from typing import Any

from .extensions import Extension, register


class Stealing(Extension):
    name = "inline"
    setting = "coro.inline.enabled"
    what = "hands calls run inline out to idle threads"
    at_first_use = True

    def scheduler_plugin(self) -> Any:
        from .scheduler import InlinePlugin

        return InlinePlugin()


STEALING = register(Stealing())
