"""The dashboard's "Coroutines" page: its markup without a cluster, its route
on a real scheduler's dashboard, and what headless Chromium renders of it
while a workload runs (skipped without Debian's ``chromium`` package; CI
installs it)."""

from __future__ import annotations

import asyncio
import re
import shutil
from urllib.parse import quote

import dask
import pytest
from distributed import Event
from distributed.utils_test import async_poll_for, gen_cluster
from tornado.httpclient import AsyncHTTPClient

from dask_coro import coroutine
from dask_coro.diagnostics import dashboard
from dask_coro.diagnostics.book import TreeBook
from dask_coro.diagnostics.page import function_counts, functions_of, page, render_roots
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


# -- on a scheduler with a dashboard ----------------------------------------------


def wait_for_event(name):
    return Event(name).wait(60)


@coroutine
def fib_then_wait(n, go):
    total = yield fib(n)
    released = yield dask.delayed(wait_for_event, pure=False)(go)
    return total, released


def function_row(markup: str, name: str) -> tuple[int, int, int]:
    """(started, done, failed) of ``name``'s row of the first functions table."""
    m = re.search(
        rf'<tr data-function="{name}"><td class="function">{name}</td><td class="started">(\d+)</td>'
        r'<td class="done">(\d+)</td><td class="failed">(\d+)</td></tr>',
        markup,
    )
    assert m, f"no row for {name!r} in {markup}"
    return int(m[1]), int(m[2]), int(m[3])


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
