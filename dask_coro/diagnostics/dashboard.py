"""The "Coroutines" page of the scheduler's dashboard: each root's tree as
``TreePlugin`` records it, served by the scheduler's HTTP server at
``<prefix>/coroutines`` and listed in the dashboard's navigation bar.

A plain HTML page in the dashboard's frame, whose script fetches its own
content again (``?fragment=1``) every second and swaps it in, rather than a
Bokeh app: the one renderer (``page.py``) runs here, so what a browser shows is
what a plain HTTP request reads; a viewer costs a request a second, not a Bokeh
session and websocket; and the dashboard's Bokeh server is built before any
plugin starts, so a Bokeh app would need a server of its own.

Installed by ``TreePlugin.start``, only on a scheduler with a dashboard. The
plugin is installed by the first coroutine that runs on a worker (or by
``--preload dask_coro``), so the page appears from then on; a page of the
dashboard loaded before lists it after a reload.

``GET coroutines``: the groups and streams the scheduler heard of, with a
plot of their totals over time, then the newest roots (``page.MAX_ROOTS``),
each with its counts and its tasks by function. ``GET coroutines?key=<key>``: that task's
tree; 404 with a message naming the key if no recorded tree holds it.
"""

from __future__ import annotations

import logging
import weakref
from functools import partial
from time import time
from typing import Any

from tornado import web

from .._internals.distributed.dashboard import (
    add_dashboard_page,
    add_http_routes,
    dashboard_prefix,
    render_dashboard_page,
)
from .._internals.distributed.scheduler import scheduler_plugin
from . import page

logger = logging.getLogger("dask_coro")

PAGE = "coroutines"

_serving: weakref.WeakSet[Any] = weakref.WeakSet()  # schedulers whose dashboard has the page


def install(scheduler: Any, plugin_name: str) -> bool:
    """Serve the page on ``scheduler``'s dashboard, once per scheduler,
    showing the scheduler plugin named ``plugin_name`` (looked up at each
    request: a plugin registered again is the one shown). Returns False, and
    does nothing, on a scheduler without a dashboard (``dashboard=False``, or
    bokeh not installed)."""
    if scheduler in _serving:
        return True
    prefix = dashboard_prefix(scheduler)
    if prefix is None:
        return False
    kwargs = {"scheduler": scheduler, "plugin_name": plugin_name}
    add_http_routes(scheduler, [(f"{prefix}/{PAGE}", CoroutinesPage, kwargs)])
    add_dashboard_page(scheduler, PAGE)
    _serving.add(scheduler)
    return True


class CoroutinesPage(web.RequestHandler):
    def initialize(self, scheduler: Any, plugin_name: str) -> None:
        self.scheduler = scheduler
        self.plugin_name = plugin_name

    def get(self) -> None:
        plugin = scheduler_plugin(self.scheduler, self.plugin_name)
        key = self.get_argument("key", None)
        if plugin is None:  # removed since the page was installed
            status, body = 404, page.render_no_plugin(self.plugin_name)
        elif key is None:
            status, body = 200, _roots(plugin)
        else:
            status, body = _tree(plugin, key)
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        if self.get_argument("fragment", ""):
            self.finish(body)
        else:
            self.finish(render_dashboard_page(self.scheduler, page.page(body)))


def _roots(plugin: Any) -> str:
    roots = list(plugin.book.roots)
    newest = roots[: -page.MAX_ROOTS - 1 : -1]
    shown = [
        (answer, page.functions_of(answer, partial(plugin.book.subtree, answer["key"])))
        for answer in plugin.handle_progress(newest)
    ]
    now = time()
    groups, streams = plugin.activity.rows(now)
    activity = page.render_activity(groups, streams, plugin.activity.series(now))
    return page.render_roots(shown, len(roots), activity)


def _tree(plugin: Any, key: str) -> tuple[int, str]:
    # A key in the URL is a string; a root whose key is not (a tuple) is
    # found by its str().
    if key not in plugin.book.nodes:
        key = next((k for k in plugin.book.roots if str(k) == key), key)
    answer = plugin.handle_tree(key)
    if not answer["nodes"]:
        return 404, page.render_unknown(key, list(plugin.book.roots)[::-1])
    return 200, page.render_tree(answer, page.functions_of(answer, lambda: answer["nodes"]))
