"""``distributed.dashboard``: the scheduler's Bokeh dashboard, its HTTP
server and its pages' template.
"""

from __future__ import annotations

import sys
from typing import Any


def dashboard_prefix(scheduler: Any) -> str | None:
    """The URL prefix (``""`` or ``"/<prefix>"``) of the scheduler's Bokeh
    dashboard, or None if it has none. ``distributed.dashboard.scheduler.connect``
    adds a ``BokehTornado`` to ``Scheduler.http_application`` (a
    ``RoutingApplication``, its ``applications`` list) only when the dashboard
    is on and bokeh imports; the Bokeh app's ``prefix`` is the scheduler's
    ``http_prefix``. Without bokeh imported there is no such app."""
    tornado_module = sys.modules.get("bokeh.server.tornado")
    app = getattr(scheduler, "http_application", None)
    if tornado_module is None or app is None:
        return None
    for sub in getattr(app, "applications", ()):
        if isinstance(sub, tornado_module.BokehTornado):
            return str(sub.prefix)
    return None


def add_http_routes(scheduler: Any, routes: list[tuple[str, Any, dict[str, Any]]]) -> None:
    """Serve these tornado routes on the scheduler's HTTP server, beside the
    dashboard (``Scheduler.http_application``, a tornado ``Application``:
    ``add_handlers`` takes effect for the next request)."""
    scheduler.http_application.add_handlers(r".*", routes)


def add_dashboard_page(scheduler: Any, page: str) -> None:
    """List ``page`` in the navigation bar of the dashboard's pages, before
    "info". ``distributed.dashboard.scheduler.template_variables`` is memoized
    per scheduler; every Bokeh page's template variables are a shallow copy of
    its answer (``BokehApplication``'s ``extra``), so they share its ``pages``
    list, which ``http/templates/base.html`` reads at each page load."""
    from distributed.dashboard.scheduler import template_variables

    pages = template_variables(scheduler)["pages"]
    if page not in pages:
        pages.insert(pages.index("info") if "info" in pages else len(pages), page)


_DASHBOARD_PAGE = '{% extends "base.html" %}{% block content %}{{ content }}{% endblock %}'


def render_dashboard_page(scheduler: Any, content: str) -> str:
    """A page in the dashboard's frame: distributed's ``http/templates/base.html``
    (its navigation bar, stylesheet and icons, by relative URLs) rendered with
    jinja2 as the Bokeh pages are (``distributed.dashboard.components.scheduler.env``,
    no autoescape), ``content`` (HTML) in its ``content`` block."""
    from distributed.dashboard.components.scheduler import env
    from distributed.dashboard.scheduler import template_variables

    return str(env.from_string(_DASHBOARD_PAGE).render(**template_variables(scheduler), content=content))
