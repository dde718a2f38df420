"""The dashboard's "Coroutines" page: its markup without a cluster, its route
on a real scheduler's dashboard, the groups and streams it lists, and what
headless Chromium renders of it while a workload runs (skipped without Debian's ``chromium`` package; CI
installs it)."""

from __future__ import annotations

import asyncio
import re
import shutil
from urllib.parse import quote

import dask
import pytest
from bodies import boom, plain_inc, sq
from dask.utils import key_split
from distributed import Event
from distributed.utils_test import async_poll_for, gen_cluster
from tornado.httpclient import AsyncHTTPClient

import dask_coro
from dask_coro import coroutine, emit, stream
from dask_coro.diagnostics import activity, dashboard
from dask_coro.diagnostics.activity import Activity
from dask_coro.diagnostics.book import TreeBook
from dask_coro.diagnostics.page import (
    function_counts,
    functions_of,
    page,
    render_activity,
    render_roots,
)
from dask_coro.diagnostics.scheduler import NAME
from dask_coro.examples import fib

DASHBOARD = {"dashboard": True, "dashboard_address": "127.0.0.1:0"}
FIB5_CALLS = 15  # fib(5) calls fib 15 times, itself included

# -- markup, without a cluster ----------------------------------------------------


def test_function_counts_from_recorded_nodes():
    book = TreeBook()
    book.children("root-1", ["fib-1", "fib-2", "inc-3"], 1.0)
    book.state("fib-1", "memory", 2.0)
    book.state("inc-3", "erred", 2.0)
    assert function_counts(book.subtree("root-1")) == {
        "root": {"started": 1, "done": 0, "failed": 0},
        "fib": {"started": 2, "done": 1, "failed": 0},
        "inc": {"started": 1, "done": 0, "failed": 1},
    }


def test_tasks_and_inline_calls_are_added_up_by_function():
    inline = {"fib": {"started": 40, "done": 39, "failed": 0}, "inc": {"started": 2, "done": 1, "failed": 1}}
    tasks = [("fib-1", None, 0, "memory", 0.0, 1.0, None), ("fib-2", "fib-1", 1, "processing", 0.0, None, None)]
    assert functions_of({"key": "r", "functions": inline}, lambda: tasks) == {
        "fib": {"started": 42, "done": 40, "failed": 0},
        "inc": {"started": 2, "done": 1, "failed": 1},
    }
    assert functions_of({"key": "r"}, lambda: tasks[:1]) == {
        "fib": {"started": 1, "done": 1, "failed": 0}
    }


def test_keys_and_names_are_escaped():
    key = "<script>alert(1)</script>-1"
    answer = {"key": key, "state": "processing", "counts": None}
    markup = render_roots([(answer, {"<b>": {"started": 1}})], total=1)
    assert "<script>" not in markup and "<b>" not in markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;-1" in markup
    assert f'href="coroutines?key={quote(key, safe="")}"' in markup
    assert "no child submitted yet" in markup
    assert "No coroutine tree is recorded" in render_roots([], total=0)
    assert 'id="dask-coro-live"' in page(markup) and "setTimeout(refresh, 1000)" in page(markup)


def test_activity_counts_groups_and_streams_and_keeps_totals():
    a = Activity()
    a.group("p-1", 0, [2, 1, 0, 0, 0], 1, False, 10.0)
    a.stream("s-1", 1, 0, 10.2, buffer=2)
    a.group("p-1", 0, [1, 1, 1, 0, 0], 1, False, 10.5)  # the same interval: one sample
    a.stream("s-1", 3, 1, 12.0)
    [g], [st] = a.rows(12.0)
    assert (g.counts, g.state, g.limit) == ([1, 1, 1, 0, 0], "open", 1)
    assert (st.produced, st.buffered, st.taken, st.buffer, st.state) == (3, 2, 1, 2, "running")
    assert a.totals == [1, 3, 1]
    assert a.series(13.0) == [(10.0, 0, 0, 0), (10.2, 1, 1, 0), (12.0, 1, 3, 1), (13.0, 1, 3, 1)]
    # Its parent ended before the worker said the group closed: over.
    a.parent_ended("p-1", "erred", 13.0)
    assert (g.state, a.parents) == ("parent-erred", {})
    a.stream_ended("s-1", "memory", 13.0)
    a.stream_ended("s-1", "forgotten", 13.5)  # its first end stays
    assert st.state == "done"
    # A parent run again reports its group from zero: open again; the totals only grow.
    a.group("p-1", 0, [0, 1, 0, 0, 0], 1, False, 14.0)
    assert g.state == "open" and a.totals == [1, 3, 1]
    with pytest.raises(ValueError, match="counts"):
        a.group("p-1", 0, [1, 2], None, False, 14.0)


def test_activity_forgets_what_ended_after_a_while_and_beyond_a_cap(monkeypatch):
    monkeypatch.setattr(activity, "MAX_ENDED", 3)
    a = Activity()
    for i in range(5):
        a.group(f"p-{i}", 0, [0, 0, 1, 0, 0], None, True, float(i))
        a.stream(f"s-{i}", 1, 1, float(i))
        a.stream_ended(f"s-{i}", "memory", float(i))
    a.group("running", 0, [0, 1, 0, 0, 0], None, False, 0.0)
    # The three newest ended of each kind, and every running one.
    assert sorted(k for k, _ in a.groups) == ["p-2", "p-3", "p-4", "running"]
    assert sorted(a.streams) == ["s-2", "s-3", "s-4"]
    groups, streams = a.rows(4.0 + activity.KEEP)  # p-4 and s-4 ended KEEP s ago
    assert [g.parent for g in groups] == ["running"] and streams == []
    assert a.totals == [5, 5, 5]


def test_groups_and_streams_markup():
    a = Activity()
    a.group("<b>-1", 3, [1, 2, 3, 4, 5], 3, False, 1.0)
    a.stream("squares-2", 5, 2, 2.0, buffer=4)
    markup = render_activity(*a.rows(3.0), a.series(3.0))
    assert "<b>-1" not in markup and 'data-group="&lt;b&gt;-1" data-index="3" data-state="open"' in markup
    assert group_row(markup, "&lt;b&gt;-1", 3) == {"pending": 1, "running": 2, "done": 3, "failed": 4, "cancelled": 5}
    assert stream_row(markup, "squares-2") == {"produced": 5, "buffered": 3, "taken": 2}
    assert '<td class="function">squares</td>' in markup
    assert plot_totals(markup) == {"children-ended": 7, "items-produced": 5, "items-taken": 2}
    assert render_activity([], [], []) == ""


# -- on a scheduler with a dashboard ----------------------------------------------


def wait_for_event(name):
    return Event(name).wait(60)


@coroutine
def fib_then_wait(n, go):
    total = yield fib(n)
    released = yield dask.delayed(wait_for_event, pure=False)(go)
    return total, released


@coroutine
def grouped(go):
    """One child at a time: a plain one done, one failing, two waiting for
    ``go``, one cancelled while queued."""
    got = []
    with dask_coro.group(limit=1) as g:
        g.spawn(dask.delayed(plain_inc)(1))
        g.spawn(boom(0))
        g.spawn(dask.delayed(wait_for_event, pure=False)(go))
        g.spawn(dask.delayed(wait_for_event, pure=False)(go))
        g.spawn(sq(3)).cancel()
        while g:
            try:
                _, value = yield g.next()
            except ValueError as e:
                value = str(e)
            got.append(value)
    return got


@coroutine
def squares_of(n):
    for i in range(n):
        yield emit(i * i)
    return n


@coroutine
def streamed(n, go):
    """Takes the first of ``n`` items, then waits for ``go`` before the rest."""
    s = stream(squares_of(n), buffer=2)
    got = []
    for item in s:
        got.append(item)
        if len(got) == 1:
            yield dask.delayed(wait_for_event, pure=False)(go)
    return got, s.result


GROUPED = [2, "boom 0", True, True]
STREAMED = ([0, 1, 4, 9, 16], 5)


async def group_and_stream_blocked(c, s, go: str):
    """A group and a stream in the middle of their run: the group's one
    running child waits for ``go``, the stream's producer for room (its
    consumer took one item and waits for ``go``)."""
    fg, fs = c.compute(grouped(go)), c.compute(streamed(5, go))
    await async_poll_for(lambda: NAME in s.plugins and "dask-coro-streams" in s.plugins, timeout=30)
    books = s.plugins["dask-coro-streams"].books
    await async_poll_for(lambda: any(b.blocked == 2 and b.published == 2 for b in books.values()), timeout=30)
    groups = s.plugins[NAME].activity.groups
    # The worker's report, at most REPORT_INTERVAL behind.
    await async_poll_for(lambda: (fg.key, 0) in groups and groups[fg.key, 0].counts[1:4:2] == [1, 1], timeout=30)
    return fg, fs


def function_row(markup: str, name: str) -> tuple[int, int, int]:
    """(started, done, failed) of ``name``'s row of the first functions table."""
    m = re.search(
        rf'<tr data-function="{name}"><td class="function">{name}</td><td class="started">(\d+)</td>'
        r'<td class="done">(\d+)</td><td class="failed">(\d+)</td></tr>',
        markup,
    )
    assert m, f"no row for {name!r} in {markup}"
    return int(m[1]), int(m[2]), int(m[3])


def group_row(markup: str, parent: str, n: int = 0) -> dict[str, int]:
    """A group's children by state, as its row shows them."""
    m = re.search(rf'<tr data-group="{re.escape(parent)}" data-index="{n}"[^>]*>(.*?)</tr>', markup)
    assert m, f"no row for group {n} of {parent!r} in {markup}"
    return {name: int(v) for name, v in re.findall(r'<td class="(pending|running|done|failed|cancelled)">(\d+)</td>', m[1])}


def stream_row(markup: str, producer: str) -> dict[str, int]:
    """A stream's items produced, buffered and taken, as its row shows them."""
    m = re.search(rf'<tr data-stream="{re.escape(producer)}"[^>]*>(.*?)</tr>', markup)
    assert m, f"no row for stream {producer!r} in {markup}"
    return {name: int(v) for name, v in re.findall(r'<td class="(produced|buffered|taken)">(\d+)</td>', m[1])}


def plot_totals(markup: str) -> dict[str, int]:
    """The totals the plot's legend shows (a browser's DOM has the square
    itself where the markup has its entity)."""
    legend = r'<span class="([a-z-]+)"[^>]*>(?:&#9632;|\u25a0) [a-z ]+ <span class="total">(\d+)</span>'
    return {k: int(v) for k, v in re.findall(legend, markup)}


def root_state(markup: str, key: str) -> str:
    m = re.search(rf'data-key="{re.escape(key)}" data-state="([a-z-]+)"', markup)
    assert m, f"no root {key!r} in {markup}"
    return m[1]


async def blocked_workload(c, s, go: str):
    """fib(5) done, then waiting for ``go``: a root in the middle of its run."""
    f = c.compute(fib_then_wait(5, go))
    await async_poll_for(
        lambda: NAME in s.plugins
        and any(n.key.startswith("wait_for_event") and n.state == "processing" for n in s.plugins[NAME].book.nodes.values()),
        timeout=30,
    )
    return f


@gen_cluster(client=True, nthreads=[("", 1)], scheduler_kwargs=DASHBOARD)
async def test_page_lists_roots_and_their_functions_while_they_run(c, s, a):
    http = AsyncHTTPClient()
    base = f"http://127.0.0.1:{s.http_server.port}"
    f = await blocked_workload(c, s, "go-page")
    try:
        r = await http.fetch(f"{base}/coroutines", raise_error=False)
        assert r.code == 200 and r.headers["Content-Type"].startswith("text/html")
        body = r.body.decode()
        assert root_state(body, f.key) == "processing"
        assert function_row(body, "fib") == (FIB5_CALLS, FIB5_CALLS, 0)
        assert function_row(body, "wait_for_event") == (1, 0, 0)
        assert function_row(body, "fib_then_wait") == (1, 0, 0)
        assert '<a href="coroutines">Coroutines</a>' in body  # in the navigation bar
        assert 'id="dask-coro-live"' in body and "statics/css/base.css" in body

        status = await http.fetch(f"{base}/status")  # a Bokeh page lists it too
        assert '<a href="coroutines">Coroutines</a>' in status.body.decode()

        fragment = (await http.fetch(f"{base}/coroutines?fragment=1")).body.decode()
        assert "<html" not in fragment and root_state(fragment, f.key) == "processing"

        tree = (await http.fetch(f"{base}/coroutines?key={quote(f.key, safe='')}")).body.decode()
        assert tree.count("<tr data-key=") == 1 + FIB5_CALLS + 1
        child = next(k for k in s.plugins[NAME].book.nodes if k.startswith("fib-"))
        sub = (await http.fetch(f"{base}/coroutines?key={quote(child, safe='')}&fragment=1")).body.decode()
        assert "In the tree of" in sub and quote(f.key, safe="") in sub

        missing = await http.fetch(f"{base}/coroutines?key=no-such-key", raise_error=False)
        assert missing.code == 404
        assert "No coroutine tree on this scheduler holds the key &#x27;no-such-key&#x27;" in missing.body.decode()
    finally:
        await Event("go-page").set()
    assert await f == (5, True)
    body = (await http.fetch(f"{base}/coroutines?fragment=1")).body.decode()
    assert root_state(body, f.key) == "memory"
    assert function_row(body, "wait_for_event") == (1, 1, 0)
    assert function_row(body, "fib_then_wait") == (1, 1, 0)


@gen_cluster(client=True, nthreads=[("", 2)], scheduler_kwargs=DASHBOARD)
async def test_page_shows_groups_children_by_state_and_streams_items(c, s, a):
    fg, fs = await group_and_stream_blocked(c, s, "go-activity")
    try:
        act = s.plugins[NAME].activity
        [(producer, row)] = act.streams.items()
        book = s.plugins["dask-coro-streams"].books[producer]
        assert (row.produced, row.buffered, row.taken, row.buffer, row.state) == (2, 2, 0, 2, "running")
        assert (book.published, book.taken) == (2, 0)  # what the stream's own plugin knows
        group = act.groups[fg.key, 0]
        # A plain child done; one failed; one waiting for go, one queued
        # behind it (limit=1); one cancelled while queued.
        assert (group.counts, group.limit, group.state) == ([1, 1, 1, 1, 1], 1, "open")

        url = f"http://127.0.0.1:{s.http_server.port}/coroutines?fragment=1"
        body = (await AsyncHTTPClient().fetch(url)).body.decode()
        assert group_row(body, fg.key) == {"pending": 1, "running": 1, "done": 1, "failed": 1, "cancelled": 1}
        assert stream_row(body, producer) == {"produced": 2, "buffered": 2, "taken": 0}
        assert f'<td class="function">{key_split(producer)}</td>' in body
        assert plot_totals(body) == {"children-ended": 2, "items-produced": 2, "items-taken": 0}
    finally:
        await Event("go-activity").set()
    assert await fg == GROUPED and await fs == STREAMED
    # The group's last report came ahead of its parent's end; the producer
    # ended before its consumer gathered its value.
    assert (group.counts, group.state) == ([0, 0, 3, 1, 1], "closed")
    assert (row.produced, row.buffered, row.taken, row.state) == (5, 0, 5, "done")
    assert act.totals == [4, 5, 5]
    body = (await AsyncHTTPClient().fetch(url)).body.decode()
    assert group_row(body, fg.key) == {"pending": 0, "running": 0, "done": 3, "failed": 1, "cancelled": 1}
    assert stream_row(body, producer) == {"produced": 5, "buffered": 0, "taken": 5}
    # The user's functions only: no step of the group's or the stream's own
    # (a wait for the next child, an emit, a take) is counted as one.
    shown = set(re.findall(r'<tr data-function="([^"]+)">', body))
    assert shown == {"grouped", "streamed", "plain_inc", "boom", "wait_for_event", "squares_of"}, shown


@gen_cluster(client=True, nthreads=[("", 1)], scheduler_kwargs={**DASHBOARD, "http_prefix": "/dask"})
async def test_page_under_an_http_prefix(c, s, a):
    f = c.compute(fib(3))
    assert await f == 2
    url = f"http://127.0.0.1:{s.http_server.port}/dask/coroutines"
    r = await AsyncHTTPClient().fetch(url)
    assert r.code == 200 and function_row(r.body.decode(), "fib") == (5, 5, 0)

    # The book's counts of inline calls are added to the tasks' (5, 5, 0).
    plugin = s.plugins[NAME]
    answers = plugin.handle_progress

    def with_functions(keys):
        return [{**answer, "functions": {"fib": {"started": 9, "done": 8, "failed": 1}}} for answer in answers(keys)]

    plugin.handle_progress = with_functions
    r = await AsyncHTTPClient().fetch(url)
    assert function_row(r.body.decode(), "fib") == (14, 13, 1)

    await c.unregister_scheduler_plugin(NAME)
    r = await AsyncHTTPClient().fetch(url, raise_error=False)
    assert r.code == 404 and "&#x27;dask-coro-tree&#x27; that records coroutine trees is not installed" in r.body.decode()


@gen_cluster(client=True, nthreads=[("", 1)])  # gen_cluster's scheduler has no dashboard
async def test_a_scheduler_without_dashboard_runs_without_the_page(c, s, a):
    assert await c.compute(fib(3)) == 2
    assert NAME in s.plugins and s not in dashboard._serving
    r = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{s.http_server.port}/coroutines", raise_error=False)
    assert r.code == 404


# -- in a browser --------------------------------------------------------------------

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="needs a headless browser: Debian's chromium package (apt-get install chromium); CI installs it",
)


async def chromium(url: str, tmp_path, *args: str) -> str:
    """Run headless Chromium on ``url``; its stdout (the DOM, with
    ``--dump-dom``). Its clock is virtual: the page's timers fire as soon as
    nothing else is pending, up to the budget; its requests are real."""
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        # Without these Chromium reaches for its update and sync servers.
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    return out.decode()


@needs_chromium
@gen_cluster(client=True, nthreads=[("", 1)], scheduler_kwargs=DASHBOARD, timeout=100)
async def test_chromium_renders_the_page_while_the_workload_runs(c, s, a, tmp_path):
    url = f"http://127.0.0.1:{s.http_server.port}/coroutines"
    f = await blocked_workload(c, s, "go-browser")
    try:
        dom = await chromium(url, tmp_path, "--dump-dom")
        # The page's script fetched its content again and swapped it in.
        assert int(re.search(r'id="dask-coro-live" data-refreshes="(\d+)"', dom)[1]) >= 1
        assert "updated " in dom
        assert root_state(dom, f.key) == "processing"
        assert function_row(dom, "fib") == (FIB5_CALLS, FIB5_CALLS, 0)
        assert function_row(dom, "wait_for_event") == (1, 0, 0)
        running = int(re.search(r'<span class="done">(\d+)</span> done', dom)[1])
        await chromium(url, tmp_path, f"--screenshot={tmp_path / 'coroutines.png'}", "--window-size=1400,800")
        assert (tmp_path / "coroutines.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        await Event("go-browser").set()
    assert await f == (5, True)

    dom = await chromium(f"{url}?key={quote(f.key, safe='')}", tmp_path, "--dump-dom")
    assert root_state(dom, f.key) == "memory"
    done = int(re.search(r'<span class="done">(\d+)</span> done', dom)[1])
    assert done == FIB5_CALLS + 1 > running  # every child, the waiter's end included
    assert function_row(dom, "wait_for_event") == (1, 1, 0)
    assert dom.count('data-state="memory"') >= 1 + FIB5_CALLS + 1


@needs_chromium
@gen_cluster(client=True, nthreads=[("", 2)], scheduler_kwargs=DASHBOARD, timeout=100)
async def test_chromium_renders_groups_and_streams_while_they_run(c, s, a, tmp_path):
    url = f"http://127.0.0.1:{s.http_server.port}/coroutines"
    fg, fs = await group_and_stream_blocked(c, s, "go-browser-activity")
    try:
        dom = await chromium(url, tmp_path, "--dump-dom")
        assert int(re.search(r'id="dask-coro-live" data-refreshes="(\d+)"', dom)[1]) >= 1  # swapped in
        assert group_row(dom, fg.key) == {"pending": 1, "running": 1, "done": 1, "failed": 1, "cancelled": 1}
        [producer] = s.plugins[NAME].activity.streams
        assert stream_row(dom, producer) == {"produced": 2, "buffered": 2, "taken": 0}
        assert plot_totals(dom) == {"children-ended": 2, "items-produced": 2, "items-taken": 0}
        assert dom.count("<polyline") == 3
    finally:
        await Event("go-browser-activity").set()
    assert await fg == GROUPED and await fs == STREAMED

    dom = await chromium(url, tmp_path, "--dump-dom")
    assert group_row(dom, fg.key) == {"pending": 0, "running": 0, "done": 3, "failed": 1, "cancelled": 1}
    assert re.search(rf'data-group="{fg.key}" data-index="0" data-state="closed"', dom)
    assert stream_row(dom, producer) == {"produced": 5, "buffered": 0, "taken": 5}
    assert plot_totals(dom) == {"children-ended": 4, "items-produced": 5, "items-taken": 5}
