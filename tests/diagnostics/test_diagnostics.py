"""``progress`` and ``tree``: the coroutine tree as the scheduler records it.

The bookkeeping (``TreeBook``) is tested without a cluster; the rest on real
clusters: a synchronous client on an in-process cluster (progress and tree
block), and gen_cluster where the scheduler's plugin is inspected."""

from __future__ import annotations

import asyncio
import io
import re
import shutil
import threading
import time
from functools import partial

import dask
import pytest
from bodies import leaf
from distributed import Client, Event, LocalCluster
from distributed.utils_test import async_poll_for, gen_cluster

import dask_coro
from dask_coro import DaskCoroError, coroutine
from dask_coro.core.keys import child_key, derive_key
from dask_coro.diagnostics.book import TreeBook
from dask_coro.diagnostics.client import Tree, TreeNode, _html, _TextBar
from dask_coro.diagnostics.scheduler import NAME
from dask_coro.examples import fib

# -- the book, without a cluster ------------------------------------------------


def test_book_counts_a_growing_tree():
    book = TreeBook()
    book.children("root", ["a", "b"], now=1.0)
    book.children("a", ["a1", "a2"], now=2.0)
    assert book.counts("root") == {"spawned": 4, "done": 0, "failed": 0, "depth": 2, "untracked": 0, "replayed": 0}
    book.state("a1", "memory", 3.0)
    book.state("a2", "erred", 3.5)
    book.state("a1", "memory", 4.0)  # a second transition to memory counts once
    assert book.counts("root")["done"] == 1 and book.counts("root")["failed"] == 1
    nodes = book.subtree("root")
    assert [n[0] for n in nodes] == ["root", "a", "b", "a1", "a2"]
    assert [n[0] for n in book.subtree("a")] == ["a", "a1", "a2"]
    assert book.root_of("a2") == "root"
    assert book.subtree("unknown") == [] and book.counts("a") is None


def test_book_resubmitted_children_count_once():
    book = TreeBook()
    book.children("root", ["a", "b"], 1.0)
    book.children("root", ["a", "b", "c"], 2.0)  # the parent ran again
    assert book.counts("root")["spawned"] == 3


def test_book_records_a_re_run_that_yields_something_else():
    slot = [derive_key("f", "root", 0, (i,)) for i in range(3)]
    first = [child_key(s, "first") for s in slot]
    book = TreeBook()
    assert book.children("root", first[:2], 1.0) == []
    # The re-run: the same call at slot 0, another at slot 1, a new slot 2.
    again = [first[0], child_key(slot[1], "other"), first[2]]
    assert book.children("root", again, 2.0) == [(first[1], again[1])]
    assert book.counts("root")["replayed"] == 1
    by_key = {n[0]: n for n in book.subtree("root")}
    assert by_key[again[1]][6] == first[1] and by_key[first[2]][6] is None
    # Another parent's child at the same slot string is not a replay of ours.
    assert book.children("other-root", [child_key(slot[0], "x")], 3.0) == []
    book.forget("root")
    assert not book.slots.get(slot[1])


def test_book_compute_times_and_forgotten_nodes():
    book = TreeBook()
    book.children("root", ["a", "b"], 1.0)
    book.state("a", "memory", 9.0, compute=(2.0, 2.5))
    book.forget("a")  # released after its parent resumed: keeps its record
    book.forget("b")  # forgotten before it ran (cancelled)
    by_key = {n[0]: n for n in book.subtree("root")}
    assert by_key["a"][3:6] == ("memory", 2.0, 2.5)
    assert by_key["b"][3] == "forgotten"
    book.forget("root")
    assert book.nodes == {} and book.roots == {}


def test_book_keeps_at_most_max_nodes():
    book = TreeBook(max_nodes=5)
    book.children("root", [f"k{i}" for i in range(20)], 1.0)
    counts = book.counts("root")
    assert counts["spawned"] == 20 and counts["untracked"] == 20 - 5
    assert len(book.subtree("root")) == 6  # the root and 5 children
    book.children("k19", ["deeper"], 2.0)  # an untracked node's children count too
    assert book.counts("root")["spawned"] == 21 and book.counts("root")["depth"] == 2
    assert list(book.roots) == ["root"]
    book.forget("root")
    assert not book.nodes and not book.hidden


def test_book_counts_untracked_tasks_to_their_end():
    # Past the cap a task is not listed, but its end counts as a recorded one's.
    book = TreeBook(max_nodes=5)
    keys = [f"k{i}" for i in range(20)]
    book.children("root", keys, 1.0)
    assert all(book.follows(k) for k in keys)
    for k in keys[:-1]:
        book.state(k, "processing", 2.0)
        book.state(k, "memory", 3.0)
        book.state(k, "memory", 3.5)  # a second transition to memory counts once
    book.state(keys[-1], "erred", 4.0)
    counts = book.counts("root")
    assert (counts["spawned"], counts["done"], counts["failed"]) == (20, 19, 1)
    # An untracked task's entry goes when the scheduler forgets it (bounded
    # memory); its counts stay.
    for k in keys:
        book.forget(k)
    assert not book.hidden and not book.roots["root"].hidden
    assert not book.follows(keys[-1]) and book.follows(keys[0])  # recorded: kept
    book.state(keys[-1], "memory", 5.0)  # forgotten: nothing to count
    assert book.counts("root") == counts
    book.forget("root")
    assert not book.nodes and not book.roots


# -- on clusters ---------------------------------------------------------------


@pytest.fixture
def client():
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        yield client


def fib_calls(n: int) -> int:
    return 1 if n < 2 else 1 + fib_calls(n - 1) + fib_calls(n - 2)


def test_tree_of_fib_is_the_call_tree(client):
    f = client.compute(fib(6))
    assert f.result(timeout=60) == 8
    t = dask_coro.tree(f)
    assert len(t) == fib_calls(6) == 25
    assert t.state == "memory" and t.key == f.key
    assert t.counts == {"spawned": 24, "done": 24, "failed": 0, "depth": 5, "untracked": 0, "replayed": 0}
    by_key = {n.key: n for n in t}
    # fib(i) for i >= 2 has two children, fib(0) and fib(1) none
    fanout = sorted(len(t.children(k)) for k in by_key)
    assert fanout.count(2) == 12 and fanout.count(0) == 13
    for parent, child in t.edges:
        assert by_key[child].depth == by_key[parent].depth + 1
    assert all(n.state == "memory" and n.duration is not None and n.duration >= 0 for n in t)


def test_progress_text_grows_and_returns_the_totals(client):
    out = io.StringIO()
    f = client.compute(fib(9))
    totals = dask_coro.progress(f, interval=0.02, file=out)
    assert f.result() == 34
    assert totals == {
        "roots": 1, "roots_done": 1, "spawned": fib_calls(9) - 1,
        "done": fib_calls(9) - 1, "failed": 0, "depth": 8, "functions": {},
    }
    lines = [line for line in out.getvalue().split("\r") if line]
    assert lines[-1].startswith("[" + "#" * 30 + "]") and lines[-1].endswith("s\n")
    assert f"{fib_calls(9) - 1}/{fib_calls(9) - 1} tasks done, 0 failed, depth 8" in lines[-1]
    spawned = [int(line.split("/")[1].split()[0]) for line in lines]
    assert spawned == sorted(spawned)  # the workload only grows


@coroutine
def fails_deep(n):
    if n == 0:
        raise ValueError("leaf failed")
    return (yield fails_deep(n - 1))


def test_failures_are_counted_and_coloured(client):
    f = client.compute(fails_deep(3))
    totals = dask_coro.progress(f, interval=0.02, file=io.StringIO())
    assert f.status == "error"
    assert totals["failed"] == 3 and totals["done"] == 0 and totals["depth"] == 3
    t = dask_coro.tree(f)
    assert [n.state for n in t] == ["erred"] * 4
    assert "#f4a582" in t.to_graphviz().source  # erred nodes are filled red


@coroutine
def waits(go):
    first = yield [dask.delayed(lambda: 1)(), dask.delayed(lambda: 2)()]
    blocked = yield dask.delayed(lambda ev: Event(ev).wait(30))(go)
    return sum(first), blocked


def test_tree_during_the_run(client):
    go = "tree-go"
    f = client.compute(waits(go))
    try:
        deadline_tree = None
        for _ in range(200):
            deadline_tree = dask_coro.tree(f)
            if len(deadline_tree) == 4 and any(n.state == "processing" for n in deadline_tree if n.key != f.key):
                break
            Event(go).wait(0.05)
        t = deadline_tree
        assert t.state == "processing"
        assert len(t) == 4 and t.counts["spawned"] == 3 and t.counts["done"] == 2
    finally:
        Event(go).set()
    assert f.result(timeout=30) == (3, True)


def test_visualize(client, tmp_path):
    f = client.compute(fib(4))
    f.result()
    t = dask_coro.tree(f)
    src = t.to_graphviz().source
    assert src.count("->") == len(t.edges) == fib_calls(4) - 1
    assert _labels(src) == ["fib"] * fib_calls(4)  # the function's name, no key cut short
    small = t.to_graphviz(max_nodes=3).source
    assert "more" in small and small.count("->") == 2
    if shutil.which("dot") is None:
        pytest.skip("rendering needs Graphviz's dot (CI installs it)")
    path = t.visualize(filename=str(tmp_path / "tree.png"))
    assert path.endswith("tree.png")
    assert (tmp_path / "tree.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _labels(dot_source: str) -> list[str]:
    """The node labels of a DOT text, without the durations after them."""
    return [m.split("\\n")[0] for m in re.findall(r'\blabel="?((?:[^"\\]|\\.)*?)"?[ \]]', dot_source)]


def test_tree_labels_are_function_names():
    # A child's key is <prefix>-<32 hex slot>-<16 hex content>: the label is the
    # prefix, whatever the hex digits are (all letters, too, which dask's
    # key_split would read as a word of the name) and whatever the name holds.
    root = "fib_tasks-" + "0123456789abcdef" * 2
    child = child_key(derive_key("fib_tasks", root, 0, ()), "fib_tasks(4)")
    lettered = "fib_tasks-" + "abcdef" * 5 + "ab-" + "c" * 16
    dashed = "my-step-" + "e" * 32 + "-" + "0" * 16
    nodes = [
        TreeNode(root, None, 0, "memory", 0.0, 1.0),
        TreeNode(child, root, 1, "memory", 0.0, 0.5),
        TreeNode(lettered, root, 1, "processing", 0.0, None),
        TreeNode(dashed, root, 1, "memory", 0.0, 0.25),
        TreeNode(("inc-" + "1" * 32, 3), root, 1, "memory", 0.0, None),  # a collection's key
    ]
    t = Tree(root, "memory", nodes, None)
    assert [n.name for n in t] == ["fib_tasks", "fib_tasks", "fib_tasks", "my-step", "inc"]
    assert _labels(t.to_graphviz().source) == [n.name for n in t]


def test_bad_input(client):
    with pytest.raises(TypeError, match="pass a Future"):
        dask_coro.progress(fib(3))  # lazy: nothing to follow
    with pytest.raises(TypeError, match="pass a Future"):
        dask_coro.tree(42)
    a, b = client.compute([fib(2), fib(3)])
    with pytest.raises(TypeError, match="one root"):
        dask_coro.tree([a, b])
    assert dask_coro.progress([a, b], file=io.StringIO())["roots"] == 2
    with pytest.raises(DaskCoroError, match="asynchronous Client"):
        asyncio.run(dask_coro.progress_async(a))


def test_text_and_html_bars():
    t = {"roots": 1, "roots_done": 0, "spawned": 10, "done": 4, "failed": 1, "depth": 3}
    out = io.StringIO()
    _TextBar(out, width=10).update(t, 1.25, finished=False)
    assert out.getvalue() == "\r[#####.....] 4/10 tasks done, 1 failed, depth 3, roots 0/1, 1.2 s"
    markup = _html(t, 1.25)
    assert "width:50.0%" in markup and "#d6604d" in markup and "4/10 tasks done" in markup


def test_notebook_bar_displays_and_updates(client, capsys):
    pytest.importorskip("IPython")
    f = client.compute(fib(5))
    totals = dask_coro.progress(f, interval=0.02, notebook=True)
    assert totals["done"] == fib_calls(5) - 1
    assert "HTML object" in capsys.readouterr().out  # IPython's display outside a kernel


# -- the scheduler side ----------------------------------------------------------


@gen_cluster(client=True, nthreads=[("", 1), ("", 1)])
async def test_root_forgotten_takes_its_tree(c, s, a, b):
    f = c.compute(fib(5))
    assert await f == 5
    plugin = s.plugins[NAME]
    assert plugin.book.counts(f.key)["spawned"] == fib_calls(5) - 1
    key = f.key
    del f
    await async_poll_for(lambda: key not in s.tasks, 10)
    assert plugin.book.nodes == {} and plugin.book.roots == {}


def book_is_empty(book) -> bool:
    return not (book.nodes or book.roots or book.hidden or book.slots)


@coroutine
def spread(i, fail=False):
    out = yield [leaf_task(i * 10 + j) for j in range(3)]
    if fail:
        raise ValueError(f"root {i} failed")
    return out


def plain_spread(i, fail=False):
    def finish(out):
        if fail:
            raise ValueError(f"root {i} failed")
        return out

    return dask.delayed(finish)([dask.delayed(lambda x: x)(i * 10 + j) for j in range(3)])


N_ROOTS = 20


@pytest.mark.parametrize("inline", [True, False])
@gen_cluster(client=True, nthreads=[("", 1), ("", 1)])
async def test_every_end_of_a_root_takes_its_tree(c, s, a, b, inline):
    # Success, error, cancel (right after each root started) and the client
    # closing: after each, with the scheduler's tasks gone, the book is empty.
    await c.register_plugin(dask_coro.TreePlugin())
    book = s.plugins[NAME].book
    with dask.config.set({"coro.inline.enabled": inline}):
        # success, as plain dask computes it
        fs = c.compute([spread(i) for i in range(N_ROOTS)])
        assert await c.gather(fs) == dask.compute(
            [plain_spread(i) for i in range(N_ROOTS)], scheduler="sync"
        )[0]
        assert len(book.roots) == N_ROOTS
        del fs
        await async_poll_for(lambda: not s.tasks, timeout=10)
        assert book_is_empty(book)

        # error, the same one plain dask raises
        fs = c.compute([spread(i, fail=True) for i in range(N_ROOTS)])
        for i, f in enumerate(fs):
            with pytest.raises(ValueError, match=f"root {i} failed"):
                await f
            with pytest.raises(ValueError, match=f"root {i} failed"):
                dask.compute(plain_spread(i, fail=True), scheduler="sync")
        for f in fs:  # the raised errors' tracebacks refer to the futures
            f.release()
        await async_poll_for(lambda: not s.tasks, timeout=10)
        assert book_is_empty(book)

        # cancelled right after it started: its children's submission from
        # the worker may reach the scheduler after it forgot the root
        def started(key):
            return key in s.tasks and s.tasks[key].state in ("processing", "memory")

        for i in range(N_ROOTS):
            f = c.compute(spread(i))
            await async_poll_for(partial(started, f.key), timeout=10)
            await f.cancel()
        del f
        await async_poll_for(lambda: not s.tasks, timeout=10)
        assert book_is_empty(book)

        # the client that computed them closes while they run
        async with Client(s.address, asynchronous=True) as other:
            fs = other.compute([spread(i) for i in range(N_ROOTS)])
            await async_poll_for(lambda: book.roots, timeout=10)
        await async_poll_for(lambda: not s.tasks, timeout=10)
        assert book_is_empty(book)


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_tree_can_be_turned_off(c, s, a):
    with dask.config.set({"coro.tree.enabled": False}):
        f = c.compute(fib(4))
        assert await f == 3
    assert NAME not in s.plugins  # nothing installed
    del f
    await async_poll_for(lambda: not s.tasks, timeout=10)
    # The parent annotation also serves durability (children held for their
    # parent); with that off too, nothing is annotated.
    with dask.config.set({"coro.tree.enabled": False, "coro.durability.hold-children": False}):
        f = c.compute(fib(4))
        assert await f == 3
        assert all("dask_coro_parent" not in (ts.annotations or {}) for ts in s.tasks.values())
    assert NAME not in s.plugins


async def _capped_progress(c, s, max_nodes, inline, call):
    """``call`` computed, calls inline or not, under a tree plugin that
    records ``max_nodes`` nodes: its book, the future and what ``progress``
    reported at the end."""
    await c.register_plugin(dask_coro.TreePlugin())
    book = s.plugins[NAME].book
    book.max_nodes = max_nodes
    with dask.config.set({"coro.inline.enabled": inline}):
        f = c.compute(call)
        totals = await dask_coro.progress(f, interval=0.02, file=io.StringIO())
    return book, f, totals


@pytest.mark.parametrize("inline", [True, False])
@gen_cluster(client=True, nthreads=[("", 1)])
async def test_max_nodes(c, s, a, inline):
    # Only the recorded nodes are capped: the counts past the cap are exact,
    # on both cluster paths (without a cluster there is no tree).
    book, f, totals = await _capped_progress(c, s, 10, inline, branches(3, 6))
    expected = [[i * 10 + j for j in range(6)] for i in range(3)]
    assert await f == expected == dask.compute(plain_branches(3, 6), scheduler="sync")[0]
    counts = book.counts(f.key)
    assert {k: totals[k] for k in ("spawned", "done", "failed", "depth")} == {
        k: counts[k] for k in ("spawned", "done", "failed", "depth")
    }
    # Each of the 3 branches is a task or an inline call (inline, the first
    # runs in the root's step, the others are promoted to tasks when it
    # waits); their 18 leaves are tasks.
    inline_calls = sum(c["done"] for c in totals["functions"].values())
    assert counts["spawned"] + inline_calls == 3 + 3 * 6
    assert (inline_calls > 0) == inline
    assert counts["untracked"] == counts["spawned"] - 10
    assert counts["done"] == counts["spawned"] and counts["failed"] == 0
    assert len(book.subtree(f.key)) == 10 + 1  # the root and 10 recorded
    del f
    await async_poll_for(lambda: not s.tasks, timeout=10)
    assert not book.nodes and not book.roots and not book.hidden


@pytest.mark.parametrize("inline", [True, False])
@gen_cluster(client=True, nthreads=[("", 1)])
async def test_max_nodes_counts_failures(c, s, a, inline):
    book, f, totals = await _capped_progress(c, s, 3, inline, fails_some(8))
    # As in plain dask: the failed children's errors, caught by the parent.
    assert await f == [i for i in range(8) if i % 3] == [v for v in plain_fails_some(8) if v is not None]
    assert totals["spawned"] == 8 and book.counts(f.key)["untracked"] == 8 - 3
    assert (totals["done"], totals["failed"]) == (8 - 3, 3)


@coroutine(inline=False)
def leaf_task(x):
    return x


@coroutine
def branch(i, n):
    return (yield [leaf_task(i * 10 + j) for j in range(n)])


@coroutine
def branches(m, n):
    return (yield [branch(i, n) for i in range(m)])


def plain_branches(m, n):
    return [[dask.delayed(lambda x: x)(i * 10 + j) for j in range(n)] for i in range(m)]


def fail_on_multiple_of_3(i):
    if i % 3 == 0:
        raise ValueError(i)
    return i


@coroutine(inline=False)
def fail_task(i):
    return fail_on_multiple_of_3(i)


@coroutine
def fails_some(n):
    out = []
    for i in range(n):
        try:
            out.append((yield fail_task(i)))
        except ValueError:
            pass
    return out


def plain_fails_some(n):
    out = []
    for i in range(n):
        try:
            out.append(dask.compute(dask.delayed(fail_on_multiple_of_3)(i), scheduler="sync")[0])
        except ValueError:
            out.append(None)
    return out


# -- spans ----------------------------------------------------------------------


@gen_cluster(client=True, nthreads=[("", 1), ("", 1)])
async def test_a_tree_lives_in_the_span_of_its_root(c, s, a, b):
    from distributed import span

    from dask_coro.examples import process_all

    with span("my search") as span_id:
        f = c.compute(process_all())
    await f
    spans = s.extensions["spans"]
    mine = spans.spans[span_id]
    assert mine.name == ("my search",)
    # the children (other functions, other task groups) were computed in it
    # too, at every depth, rather than in the cluster's "default" span
    groups = {tg.name for tg in mine.groups}
    assert {"process_all", "generate_data", "my_len"} <= groups
    default = {tg.name for sp in spans.spans_search_by_name[("default",)] for tg in sp.groups}
    assert not groups & default
    assert mine.cumulative_worker_metrics  # the tree's fine metrics are booked there


# -- inline calls ----------------------------------------------------------------

GO = threading.Event()


@coroutine
def wait_go():
    GO.wait(30)  # an inline call that blocks the run until the test says go
    return 0


@coroutine
def grows(n):
    values = yield [leaf(i) for i in range(n)]
    last = yield wait_go()
    return sum(values) + last


@pytest.mark.inline
def test_tree_counts_inline_calls_while_they_run(client):
    GO.clear()
    f = client.compute(grows(300))
    try:
        t = None
        for _ in range(600):  # the worker reports every 0.5 s
            t = dask_coro.tree(f)
            if "leaf" in t.functions:
                break
            time.sleep(0.02)
        assert not f.done()
        # Calls handed to the idle worker are tasks (nodes), the rest inline.
        tasks = sum(1 for n in t if n.key != f.key and str(n.key).startswith("leaf"))
        assert t.functions["leaf"] == {"started": 300 - tasks, "done": 300 - tasks, "failed": 0}
    finally:
        GO.set()
    assert f.result(timeout=30) == sum(range(300))
    t = dask_coro.tree(f)
    counted = {name: c["done"] for name, c in t.functions.items()}
    for node in t:
        if node.key != f.key:
            name = str(node.key).split("-")[0]
            counted[name] = counted.get(name, 0) + 1
    assert counted == {"leaf": 300, "wait_go": 1}
    assert all(c["started"] == c["done"] and c["failed"] == 0 for c in t.functions.values())
    assert f"{t.functions['leaf']['done'] + t.functions.get('wait_go', {}).get('done', 0)} " \
        "inline calls done (leaf" in repr(t)


@pytest.mark.inline
def test_progress_counts_inline_calls_and_tasks_add_up(client):
    n = 18
    out = io.StringIO()
    f = client.compute(fib(n))
    totals = dask_coro.progress(f, interval=0.05, file=out)
    assert f.result() == 2584
    calls = totals["functions"]["fib"]
    # Stolen calls become tasks: inline + tasks (+ the root) = every call.
    assert calls["started"] + totals["spawned"] + 1 == fib_calls(n)
    assert calls == {"started": calls["started"], "done": calls["started"], "failed": 0}
    assert totals["done"] == totals["spawned"]
    last = out.getvalue().split("\r")[-1]
    assert f"{calls['done']:,} inline calls done (fib {calls['done']:,})" in last
    done = [int(line.split(" inline calls done")[0].rsplit(", ", 1)[-1].replace(",", ""))
            for line in out.getvalue().split("\r") if "inline calls done" in line]
    assert done == sorted(done)  # the count only grows


@coroutine
def bad(i):
    if i == 3:
        raise ValueError("three")
    return i


@coroutine
def some_fail():
    out = []
    for i in range(5):
        try:
            out.append((yield bad(i)))
        except ValueError:
            out.append(None)
    return out


@pytest.mark.inline
def test_inline_failures_are_counted(client):
    f = client.compute(some_fail())
    totals = dask_coro.progress(f, interval=0.02, file=io.StringIO())
    assert f.result() == [0, 1, 2, None, 4]
    assert totals["functions"] == {"bad": {"started": 5, "done": 4, "failed": 1}}
    g = client.compute(fails_deep(3))
    totals = dask_coro.progress(g, interval=0.02, file=io.StringIO())
    assert g.status == "error"
    # fails_deep(0) raised, and each caller above it raised it on.
    assert totals["functions"] == {"fails_deep": {"started": 3, "done": 0, "failed": 3}}
    assert "0 inline calls done (fails_deep 0), 3 failed" in repr(dask_coro.tree(g))


@pytest.mark.inline
@gen_cluster(client=True, nthreads=[("", 1)])
async def test_progress_async_counts_inline_calls(c, s, a):
    f = c.compute(fib(10))
    totals = await dask_coro.progress(f, interval=0.02, file=io.StringIO())
    assert await f == 55
    assert totals["functions"]["fib"]["done"] + totals["spawned"] + 1 == fib_calls(10)
    again = await dask_coro.progress_async(f, file=io.StringIO())
    assert again == totals
    assert s.plugins[NAME].book.functions(f.key) == totals["functions"]
    with pytest.raises(TypeError, match="pass a Future"):
        await dask_coro.progress_async(42)


@pytest.mark.inline
@gen_cluster(client=True, nthreads=[("", 1)])
async def test_inline_calls_not_counted_with_the_tree_off(c, s, a):
    with dask.config.set({"coro.tree.enabled": False}):
        f = c.compute(fib(10))
        assert await f == 55
    assert NAME not in s.plugins  # nothing installed, so nothing was sent


def test_trampoline_counts_only_when_asked():
    from dask_coro.runtime.call import trampoline

    off = trampoline("fib", inline=True)
    off.start(fib.__wrapped__, (6,), {})
    assert off.calls is None and off.call_counts() == {}
    on = trampoline("fib", inline=True, count=True)
    on.start(fib.__wrapped__, (6,), {})
    assert on.call_counts() == {fib.__wrapped__: (fib_calls(6) - 1,) * 2 + (0,)}


# -- dask_coro's own steps are not the user's functions ----------------------------


@coroutine
def page(i):
    return [i * 3 + k for k in range(3)] if i < 4 else []


@coroutine
def numbers(n):
    for i in range(n):
        yield dask_coro.emit(i)
    return n


@coroutine
def crawl_and_read(n):
    seen = 0
    with dask_coro.group(limit=2) as g:
        g.spawn(page(1))
        for _, links in g:  # each wait for the next child is a step of the group's
            seen += 1
            for link in links:
                g.spawn(page(link))
    total = sum(x for x in dask_coro.stream(numbers(n)))  # each emit and take: steps too
    return seen, total


@pytest.mark.inline
def test_group_and_stream_steps_are_not_counted_as_functions(client):
    """A group's wait for its next child (``_more``) and a stream's emits and
    takes run in the body's stack as calls of the engine, but they are
    dask_coro's own steps: neither progress() nor the tree (nor the dashboard,
    which shows the same counts) lists them beside the user's functions."""
    f = client.compute(crawl_and_read(5))
    totals = dask_coro.progress(f, interval=0.05, file=io.StringIO())
    assert f.result(timeout=60) == (7, 10)
    user = {"page", "numbers", "crawl_and_read"}
    assert set(totals["functions"]) <= user, totals["functions"]
    assert set(dask_coro.tree(f).functions) <= user
