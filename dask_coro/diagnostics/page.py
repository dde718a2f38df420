"""The dashboard's "Coroutines" page as HTML (served by ``dashboard.py``).
Pure: ``TreePlugin``'s answers in, markup out; every key and name is escaped
here, and nowhere else.

Each root shows its state, its counts and its tasks by function; the page of
one task (``coroutines?key=...``) shows its tree. Above the roots: the groups
(children by state) and streams (items produced, buffered, taken) the
scheduler heard of (``activity.py``), and a plot of their totals over time. The markup carries its data
in attributes (``data-key``, ``data-state``, ``data-function``) for scripts and
tests that read the page.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from typing import Any
from urllib.parse import quote

from dask.utils import format_time, key_split

from .activity import GROUP_STATES
from .book import DONE, FAILED

MAX_ROOTS = 50  # the newest roots the list shows
MAX_NODES = 500  # the nodes a task's page lists
MAX_ROWS = 50  # the groups (and the streams) the list shows
REFRESH_MS = 1000  # the page fetches its content again this often

_FINISHED = (DONE, FAILED, "forgotten")
_STATE_COLORS = {DONE: "#a6dba0", FAILED: "#f4a582", "processing": "#fee08b", "released": "#c2a5cf"}
# A group's and a stream's states (``activity.py``) alike.
_STATE_COLORS.update({"open": "#fee08b", "running": "#fee08b", "closed": "#a6dba0", "done": "#a6dba0",
                      "failed": "#f4a582", "cancelled": "#c2a5cf"})

Functions = dict[str, dict[str, int]]


# -- per-function counts ---------------------------------------------------------


def function_counts(nodes: Iterable[Sequence[Any]]) -> Functions:
    """Recorded tree nodes (``TreeBook.subtree``'s tuples) counted by function:
    the name is the key's prefix (``dask.utils.key_split``; a coroutine's
    children keep their call's prefix, ``core.keys``). A task counts as started
    once it was submitted, as done or failed once it reached memory or erred.

    The book's own counts (an answer's ``"functions"``) are of inline calls
    only: ``functions_of`` adds the two."""
    out: Functions = {}
    for key, _parent, _depth, state, *_ in nodes:
        counts = out.setdefault(key_split(key), {"started": 0, "done": 0, "failed": 0})
        counts["started"] += 1
        if state == DONE:
            counts["done"] += 1
        elif state == FAILED:
            counts["failed"] += 1
    return out


def functions_of(answer: dict[str, Any], nodes: Callable[[], Iterable[Sequence[Any]]]) -> Functions:
    """The per-function counts of an answer of ``TreePlugin.handle_tree`` or
    ``handle_progress``: its tasks, counted from its recorded ``nodes()``,
    plus the calls run inline (its ``"functions"``, which count those only)."""
    out = function_counts(nodes())
    for name, inline in (answer.get("functions") or {}).items():
        counts = out.setdefault(name, {"started": 0, "done": 0, "failed": 0})
        for what in ("started", "done", "failed"):
            counts[what] += inline.get(what, 0)
    return out


# -- markup ------------------------------------------------------------------------


def _e(x: Any) -> str:
    return html.escape(str(x))


def _link(key: Any) -> str:
    # Relative, as the dashboard's own links: right under any http prefix.
    return f'<a href="coroutines?key={quote(str(key), safe="")}">{_e(key)}</a>'


def _state(state: str) -> str:
    color = _STATE_COLORS.get(state, "#e0e0e0")
    return f'<span class="dask-coro-state" style="background: {color}">{_e(state)}</span>'


def _counts(counts: dict[str, int] | None) -> str:
    if not counts:
        return '<p class="dask-coro-counts">no child submitted yet</p>'
    parts = [f'<span class="{name}">{int(counts.get(name, 0))}</span> {name}' for name in ("spawned", "done", "failed")]
    parts.append(f'depth <span class="depth">{int(counts.get("depth", 0))}</span>')
    if counts.get("untracked"):
        parts.append(f"{int(counts['untracked'])} beyond coro.tree.max-nodes (counted, not listed)")
    if counts.get("replayed"):
        parts.append(f"{int(counts['replayed'])} replayed differently")
    return f'<p class="dask-coro-counts">{" · ".join(parts)}</p>'


def render_functions(functions: Functions) -> str:
    """A table of tasks (and, once the book counts them, inline calls) by
    function, the most started first."""
    if not functions:
        return ""
    rows = "".join(
        f'<tr data-function="{_e(name)}"><td class="function">{_e(name)}</td>'
        + "".join(f'<td class="{c}">{int(counts.get(c, 0))}</td>' for c in ("started", "done", "failed"))
        + "</tr>"
        for name, counts in sorted(functions.items(), key=lambda kv: (-kv[1].get("started", 0), kv[0]))
    )
    return (
        '<table class="dask-coro-functions"><thead><tr><th>function</th><th>started</th>'
        f"<th>done</th><th>failed</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _root(answer: dict[str, Any], functions: Functions) -> str:
    key, state = answer["key"], answer["state"]
    return (
        f'<section class="dask-coro-root" data-key="{_e(key)}" data-state="{_e(state)}">'
        f"<h3>{_link(key)} {_state(state)}</h3>"
        f"{_counts(answer.get('counts'))}{render_functions(functions)}</section>"
    )


# -- groups and streams ----------------------------------------------------------

_GROUP_COLORS = {"done": "#a6dba0", "failed": "#f4a582", "cancelled": "#c2a5cf", "running": "#fee08b",
                 "pending": "#e0e0e0"}
_SERIES = (("children ended", "#1b7837"), ("items produced", "#2166ac"), ("items taken", "#d6604d"))


def _bar(counts: Sequence[int]) -> str:
    total = sum(counts)
    if not total:
        return ""
    by = dict(zip(GROUP_STATES, counts, strict=True))
    parts = "".join(
        f'<span style="width: {100 * by[name] / total:.1f}%; background: {_GROUP_COLORS[name]}"></span>'
        for name in ("done", "failed", "cancelled", "running", "pending") if by[name]
    )
    return f'<span class="dask-coro-bar">{parts}</span>'


def render_groups(rows: Sequence[Any], limit: int = MAX_ROWS) -> str:
    """The groups (``activity.GroupRow``), as ``Activity.rows`` orders them:
    their children by state."""
    if not rows:
        return ""
    out = []
    for row in rows[:limit]:
        cells = "".join(f'<td class="{name}">{int(c)}</td>' for name, c in zip(GROUP_STATES, row.counts, strict=True))
        out.append(
            f'<tr data-group="{_e(row.parent)}" data-index="{int(row.n)}" data-state="{_e(row.state)}">'
            f'<td class="key">group {int(row.n)} of {_link(row.parent)}</td><td>{_state(row.state)}</td>'
            f'<td class="limit">{"" if row.limit is None else int(row.limit)}</td>{cells}'
            f"<td>{_bar(row.counts)}</td></tr>"
        )
    more = f"<p>and {len(rows) - limit} more group(s), not listed.</p>" if len(rows) > limit else ""
    head = "".join(f"<th>{name}</th>" for name in GROUP_STATES)
    return (
        '<h3>Groups</h3><table class="dask-coro-groups"><thead><tr><th>group</th><th>state</th>'
        f'<th>limit</th>{head}<th></th></tr></thead><tbody>{"".join(out)}</tbody></table>{more}'
    )


def render_streams(rows: Sequence[Any], limit: int = MAX_ROWS) -> str:
    """The streams (``activity.StreamRow``): items produced (published),
    buffered (published, not taken), taken."""
    if not rows:
        return ""
    out = []
    for row in rows[:limit]:
        out.append(
            f'<tr data-stream="{_e(row.producer)}" data-state="{_e(row.state)}">'
            f'<td class="key">{_link(row.producer)}</td><td class="function">{_e(key_split(row.producer))}</td>'
            f'<td>{_state(row.state)}</td><td class="produced">{int(row.produced)}</td>'
            f'<td class="buffered">{int(row.buffered)}</td><td class="taken">{int(row.taken)}</td>'
            f'<td class="buffer">{"" if row.buffer is None else int(row.buffer)}</td></tr>'
        )
    more = f"<p>and {len(rows) - limit} more stream(s), not listed.</p>" if len(rows) > limit else ""
    return (
        '<h3>Streams</h3><table class="dask-coro-streams"><thead><tr><th>producer</th><th>function</th>'
        "<th>state</th><th>produced</th><th>buffered</th><th>taken</th><th>buffer</th></tr></thead>"
        f'<tbody>{"".join(out)}</tbody></table>{more}'
    )


def render_plot(series: Sequence[tuple[float, int, int, int]], width: int = 640, height: int = 150) -> str:
    """The totals over time (``Activity.series``) as an SVG step plot:
    children of groups ended, stream items produced and taken."""
    if len(series) < 2:
        return ""
    t0, t1 = series[0][0], series[-1][0]
    span = max(t1 - t0, 1e-9)
    top = max(max(s[1:]) for s in series) or 1
    left, right, pad = 40, width - 10, 12
    bottom = height - 20

    def x(t: float) -> float:
        return left + (right - left) * (t - t0) / span

    def y(v: float) -> float:
        return bottom - (bottom - pad) * v / top

    lines, legend = [], []
    for i, (name, color) in enumerate(_SERIES, start=1):
        points = [f"{x(series[0][0]):.1f},{y(series[0][i]):.1f}"]
        for before, now in pairwise(series):  # a step: flat until the change
            points.append(f"{x(now[0]):.1f},{y(before[i]):.1f}")
            points.append(f"{x(now[0]):.1f},{y(now[i]):.1f}")
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(points)}"/>')
        slug = name.replace(" ", "-")
        legend.append(
            f'<span class="{slug}" style="color: {color}">&#9632; {name} '
            f'<span class="total">{int(series[-1][i])}</span></span>'
        )
    axes = (
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#888"/>'
        f'<line x1="{left}" y1="{pad}" x2="{left}" y2="{bottom}" stroke="#888"/>'
        f'<text x="{left - 4}" y="{pad + 4}" text-anchor="end">{int(top)}</text>'
        f'<text x="{left - 4}" y="{bottom}" text-anchor="end">0</text>'
        f'<text x="{left}" y="{height - 4}">-{_e(format_time(span))}</text>'
        f'<text x="{right}" y="{height - 4}" text-anchor="end">now</text>'
    )
    return (
        f'<div class="dask-coro-plot" data-samples="{len(series)}"><p>{" · ".join(legend)}</p>'
        f'<svg width="{width}" height="{height}" font-size="10" font-family="sans-serif">{axes}{"".join(lines)}</svg></div>'
    )


def render_activity(groups: Sequence[Any], streams: Sequence[Any], series: Sequence[tuple[float, int, int, int]]) -> str:
    """The groups, the streams and the plot of their totals; nothing if
    the scheduler heard of none."""
    if not groups and not streams:
        return ""
    return f'<div class="dask-coro-activity">{render_plot(series)}{render_groups(groups)}{render_streams(streams)}</div>'


def render_roots(
    roots: Sequence[tuple[dict[str, Any], Functions]], total: int, activity: str = ""
) -> str:
    """The list: ``roots`` are (``handle_progress`` answer, functions) of the
    newest of ``total`` recorded roots, newest first; ``activity``
    (``render_activity``) above them."""
    running = sum(1 for answer, _ in roots if answer["state"] not in _FINISHED)
    if not total:
        body = (
            "<p>No coroutine tree is recorded. A root's tree appears when the coroutine "
            "a client computed submits its first children, and is kept until the root "
            "is forgotten.</p>"
        )
    else:
        shown = f", the newest {len(roots)} shown" if len(roots) < total else ""
        body = f"<p>{total} root(s){shown}; {running} of them running.</p>"
        body += "".join(_root(answer, functions) for answer, functions in roots)
    return f'<div class="dask-coro" data-roots="{total}"><h2>Coroutines</h2>{activity}{body}</div>'


def render_tree(answer: dict[str, Any], functions: Functions, limit: int = MAX_NODES) -> str:
    """The page of one task: a ``handle_tree`` answer, its subtree in
    submission order (parents before children), indented by depth."""
    key, root, nodes = answer["key"], answer.get("root"), answer["nodes"]
    where = "" if root is None or root == key else f"<p>In the tree of {_link(root)}.</p>"
    base = nodes[0][2] if nodes else 0
    rows = []
    for n_key, _parent, depth, state, start, stop, replaces in nodes[:limit]:
        took = "" if stop is None else format_time(max(stop - start, 0.0))
        note = f" (replaces {_e(replaces)})" if replaces is not None else ""
        rows.append(
            f'<tr data-key="{_e(n_key)}" data-state="{_e(state)}">'
            f'<td class="key" style="padding-left: {depth - base + 0.5}em">{_link(n_key)}{note}</td>'
            f'<td class="function">{_e(key_split(n_key))}</td><td>{_state(state)}</td><td>{took}</td></tr>'
        )
    more = f"<p>and {len(nodes) - limit} more node(s), not listed.</p>" if len(nodes) > limit else ""
    return (
        f'<div class="dask-coro" data-key="{_e(key)}" data-state="{_e(answer["state"])}">'
        f'<h2>Coroutine {_e(key)} {_state(answer["state"])}</h2>'
        f'<p><a href="coroutines">All coroutines</a></p>{where}'
        f"{_counts(answer.get('counts'))}{render_functions(functions)}"
        '<table class="dask-coro-tree"><thead><tr><th>task</th><th>function</th><th>state</th>'
        f"<th>time</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{more}</div>"
    )


def render_unknown(key: str, roots: Sequence[Any]) -> str:
    """The answer for a key no recorded tree holds."""
    known = ", ".join(_link(r) for r in roots[:MAX_ROOTS]) or "none"
    return (
        f'<div class="dask-coro" data-missing="{_e(key)}"><h2>Coroutines</h2>'
        f"<p>No coroutine tree on this scheduler holds the key {_e(repr(key))}: it never "
        "ran as a coroutine here, or its root was forgotten (a tree is kept until its "
        f'root is). <a href="coroutines">All coroutines</a>; roots: {known}.</p></div>'
    )


def render_no_plugin(name: str) -> str:
    """The answer once the plugin that records the trees was removed."""
    return (
        f'<div class="dask-coro"><h2>Coroutines</h2><p>The scheduler plugin {_e(repr(name))} '
        "that records coroutine trees is not installed on this scheduler.</p></div>"
    )


_STYLE = """<style>
.dask-coro { padding: 0 1em; font-family: sans-serif; }
.dask-coro table { border-collapse: collapse; margin: 0.3em 0 1em; }
.dask-coro th, .dask-coro td { padding: 0.15em 0.8em; border-bottom: 1px solid #ddd; text-align: right; }
.dask-coro th:first-child, .dask-coro td:first-child { text-align: left; }
.dask-coro td.key, .dask-coro td.function { text-align: left; font-family: monospace; }
.dask-coro-state { padding: 0 0.4em; border-radius: 3px; font-size: 0.8em; }
.dask-coro-root h3 { font-family: monospace; margin-bottom: 0.2em; }
#dask-coro-status { color: #888; font-size: 0.8em; padding: 0 1em; }
.dask-coro-bar { display: inline-flex; width: 10em; height: 0.8em; background: #f4f4f4; }
.dask-coro-bar span { display: inline-block; height: 100%; }
.dask-coro-plot p { margin: 0.3em 0; font-size: 0.9em; }
</style>"""

# The page replaces its content with a fresh fragment from the same URL
# (``fragment=1``) every REFRESH_MS; ``data-refreshes`` counts the swaps, the
# status line says when it last did or that the scheduler did not answer.
_SCRIPT = """<script>
(function () {
  var live = document.getElementById("dask-coro-live");
  var status = document.getElementById("dask-coro-status");
  var refreshes = 0;
  function refresh() {
    var url = new URL(location.href);
    url.searchParams.set("fragment", "1");
    fetch(url, {cache: "no-store"})
      .then(function (r) { return r.text(); })
      .then(function (text) {
        live.innerHTML = text;
        live.dataset.refreshes = ++refreshes;
        status.textContent = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function (e) { status.textContent = "the scheduler did not answer: " + e; })
      .finally(function () { setTimeout(refresh, %d); });
  }
  setTimeout(refresh, %d);
})();
</script>"""


def page(fragment: str) -> str:
    """The page's content block: ``fragment`` and the script that refreshes it."""
    return (
        f'{_STYLE}<div id="dask-coro-live" data-refreshes="0">{fragment}</div>'
        f'<p id="dask-coro-status"></p>{_SCRIPT % (REFRESH_MS, REFRESH_MS)}'
    )
