"""``progress`` and ``tree``: what a coroutine workload has unfolded into,
read from the scheduler's TreePlugin (``_tree_scheduler``)."""

from __future__ import annotations

import html
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from dask.typing import Key

from .._exceptions import DaskCoroError
from ..core.keys import slot_of

_STATE_COLORS = {
    "memory": "#a6dba0",
    "erred": "#f4a582",
    "processing": "#fee08b",
    "waiting": "#e0e0e0",
    "no-worker": "#e0e0e0",
    "queued": "#e0e0e0",
    "released": "#c2a5cf",
    "forgotten": "#ffffff",
}


def _futures(x: Any, *, asynchronous_ok: bool = False) -> tuple[Any, list[Any]]:
    from distributed import Future, futures_of

    futures = [x] if isinstance(x, Future) else futures_of(x)
    if not futures:
        raise TypeError(
            f"progress() and tree() follow futures: pass a Future, a list of them or "
            f"a persisted collection (client.compute(x) or client.persist(x)), not "
            f"{type(x).__name__}"
        )
    client = futures[0].client
    if client.asynchronous and not asynchronous_ok:
        raise DaskCoroError(
            "progress() blocks; use it with a synchronous Client"
        )
    return client, futures


def _install(client: Any) -> None:
    from .scheduler import TreePlugin

    if not getattr(client, "_dask_coro_tree", False):
        client.register_plugin(TreePlugin())
        client._dask_coro_tree = True


# -- tree -----------------------------------------------------------------


@dataclass(frozen=True)
class TreeNode:
    key: Key
    parent: Key | None
    depth: int
    state: str
    start: float
    stop: float | None
    #: The first run's child at this place, when a re-run of the parent
    #: yielded something else here (a body that is not deterministic).
    replaces: Key | None = None

    @property
    def name(self) -> str:
        """What the node ran: its key's prefix, the function's name
        (``fib`` for ``fib-<slot>-<content>``)."""
        return _name(self.key)

    @property
    def duration(self) -> float | None:
        return None if self.stop is None else max(self.stop - self.start, 0.0)


class Tree:
    """The unfolded graph below one task: who submitted what, with states and
    durations. ``visualize()`` draws it with graphviz, as ``dask.visualize``
    draws a graph."""

    def __init__(
        self,
        key: Key,
        state: str,
        nodes: list[TreeNode],
        counts: dict[str, int] | None,
        functions: dict[str, dict[str, int]] | None = None,
    ):
        self.key = key
        self.state = state
        self.nodes = nodes
        self.counts = counts or {}
        #: Calls run inline under the root (no task, no node), per function
        #: name: ``{"started": int, "done": int, "failed": int}``.
        self.functions = functions or {}

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[TreeNode]:
        return iter(self.nodes)

    def __repr__(self) -> str:
        replayed = len(self.replayed)
        differ = f", {replayed} differ from a first run" if replayed else ""
        inline = f", {_inline_text(self.functions)}" if self.functions else ""
        return f"<dask_coro.Tree {self.key!r}: {len(self.nodes)} nodes, {self.state}{inline}{differ}>"

    @property
    def replayed(self) -> list[tuple[Key, Key]]:
        """``(first run's child, child that replaced it)`` for each place where
        a parent that re-ran yielded something else than its first run."""
        return [(n.replaces, n.key) for n in self.nodes if n.replaces is not None]

    @property
    def edges(self) -> list[tuple[Key, Key]]:
        return [(n.parent, n.key) for n in self.nodes if n.parent is not None and n.key != self.key]

    def children(self, key: Key) -> list[Key]:
        return [n.key for n in self.nodes if n.parent == key]

    def to_graphviz(self, max_nodes: int = 500, rankdir: str = "TB") -> Any:
        """A ``graphviz.Digraph`` of the first ``max_nodes`` nodes."""
        try:
            import graphviz
        except ImportError:
            raise ImportError(
                "Tree.visualize needs the graphviz Python package and Graphviz's "
                "'dot': pip install \".[diagnostics]\" in a clone of dask_coro (and Graphviz, e.g. "
                "apt install graphviz)"
            ) from None
        g = graphviz.Digraph(graph_attr={"rankdir": rankdir}, node_attr={"shape": "box", "style": "filled"})
        shown = self.nodes[:max_nodes]
        names = {n.key: f"n{i}" for i, n in enumerate(shown)}
        for n in shown:
            label = n.name
            if n.duration is not None:
                label += f"\\n{n.duration * 1000:.1f} ms"
            g.node(names[n.key], label=label, fillcolor=_STATE_COLORS.get(n.state, "#ffffff"), tooltip=f"{n.key!r}: {n.state}")
        for parent, child in self.edges:
            if parent in names and child in names:
                g.edge(names[parent], names[child])
        if len(self.nodes) > max_nodes:
            g.node("more", label=f"... {len(self.nodes) - max_nodes} more", shape="plaintext", style="")
        return g

    def visualize(self, filename: str | None = None, format: str | None = None, max_nodes: int = 500) -> Any:
        """Draw the tree. With ``filename``, write the picture (``format`` from
        its extension, or png) and return the path; without, return the
        ``graphviz.Digraph`` (Jupyter shows it)."""
        g = self.to_graphviz(max_nodes=max_nodes)
        if filename is None:
            return g
        _, dot, ext = filename.rpartition(".")
        fmt = format or (ext if dot else "png")
        return g.render(outfile=filename if dot else f"{filename}.{fmt}", format=fmt, cleanup=True)


def _name(key: Key) -> str:
    """The prefix of a key: a child's key is ``<prefix>-<32 hex>-<16 hex>``
    (``core.keys``), whatever letters its hex digits are; for others (a
    root's, a collection's tuple key), ``dask.utils.key_split``'s reading."""
    if isinstance(key, str) and slot_of(key) is not None:
        return key[:-50]
    from dask.utils import key_split

    return key_split(key)


def tree(x: Any) -> Any:
    """The coroutine tree below a future (during or after the run): every
    task its coroutine submitted, at any depth, with states and durations.
    With an asynchronous client, ``await tree(future)``.

    The scheduler keeps a root's tree until the root is forgotten (at most
    ``coro.tree.max-nodes`` nodes)."""
    client, futures = _futures(x, asynchronous_ok=True)
    if len(futures) != 1:
        raise TypeError(f"tree() draws one root; got {len(futures)} futures")
    if client.asynchronous:
        return _tree_async(client, futures[0].key)
    _install(client)
    return _as_tree(futures[0].key, client.sync(client.scheduler.dask_coro_tree, key=futures[0].key))


async def _tree_async(client: Any, key: Key) -> Tree:
    from .scheduler import TreePlugin

    if not getattr(client, "_dask_coro_tree", False):
        await client.register_plugin(TreePlugin())
        client._dask_coro_tree = True
    return _as_tree(key, await client.scheduler.dask_coro_tree(key=key))


def _as_tree(key: Key, answer: dict[str, Any]) -> Tree:
    nodes = [TreeNode(*n) for n in answer["nodes"]]
    return Tree(key, answer["state"], nodes, answer["counts"], answer.get("functions"))


def _inline_text(functions: dict[str, dict[str, int]], top: int = 3) -> str:
    """``12,345 inline calls done (fib 12,300, inc 45), 2 failed``."""
    done = sum(max(c["done"], 0) for c in functions.values())
    failed = sum(c["failed"] for c in functions.values())
    ranked = sorted(functions.items(), key=lambda kv: -kv[1]["started"])
    each = ", ".join(f"{name} {max(c['done'], 0):,}" for name, c in ranked[:top])
    if len(ranked) > top:
        each += ", ..."
    text = f"{done:,} inline calls done ({each})"
    if failed:
        text += f", {failed:,} failed"
    return text


# -- progress -------------------------------------------------------------


def progress(x: Any, *, interval: float = 0.2, notebook: bool | None = None, file: TextIO | None = None) -> Any:
    """Show live progress of coroutine roots until they are done, and return
    the final counts: tasks spawned (growing as the work unfolds), done,
    failed, the deepest level reached, and the calls run inline (no task) per
    function name (``"functions"``: ``{name: {"started", "done", "failed"}}``).

    ``x``: a Future, a list of them, or a persisted collection. In Jupyter
    (or with ``notebook=True``) an HTML bar updates in place; elsewhere a text
    line on ``file`` (default ``sys.stdout``). With an asynchronous client,
    ``await progress(x)`` (or ``await progress_async(x)``).

    Inline calls are counted by the workers and reported every half second
    and when their task ends (``coro.tree.enabled``).
    """
    client, futures = _futures(x, asynchronous_ok=True)
    if client.asynchronous:
        return progress_async(x, interval=interval, notebook=notebook, file=file)
    _install(client)
    keys = [f.key for f in futures]
    show = _shower(notebook, file)
    start = time.monotonic()
    while True:
        finished = all(f.done() for f in futures)  # before the counts: they are final then
        answers = client.sync(client.scheduler.dask_coro_progress, keys=keys)
        totals = _total(answers, sum(f.done() for f in futures))
        show.update(totals, time.monotonic() - start, finished)
        if finished:
            return totals
        time.sleep(interval)


async def progress_async(
    x: Any, *, interval: float = 0.2, notebook: bool | None = None, file: TextIO | None = None
) -> dict[str, Any]:
    """``progress`` with an asynchronous client: ``await progress_async(x)``."""
    import asyncio

    from .scheduler import TreePlugin

    client, futures = _futures(x, asynchronous_ok=True)
    if not client.asynchronous:
        raise DaskCoroError("progress_async() needs an asynchronous Client; use progress()")
    if not getattr(client, "_dask_coro_tree", False):
        await client.register_plugin(TreePlugin())
        client._dask_coro_tree = True
    keys = [f.key for f in futures]
    show = _shower(notebook, file)
    start = time.monotonic()
    while True:
        finished = all(f.done() for f in futures)
        answers = await client.scheduler.dask_coro_progress(keys=keys)
        totals = _total(answers, sum(f.done() for f in futures))
        show.update(totals, time.monotonic() - start, finished)
        if finished:
            return totals
        await asyncio.sleep(interval)


def _shower(notebook: bool | None, file: TextIO | None) -> Any:
    if notebook is None:
        notebook = _in_notebook()
    return _NotebookBar() if notebook else _TextBar(file or sys.stdout)


def _total(answers: list[dict[str, Any]], roots_done: int) -> dict[str, Any]:
    total: dict[str, Any] = {
        "roots": len(answers), "roots_done": roots_done, "spawned": 0, "done": 0, "failed": 0,
        "depth": 0, "functions": {},
    }
    functions: dict[str, dict[str, int]] = total["functions"]
    for a in answers:
        c = a["counts"] or {}
        for k in ("spawned", "done", "failed"):
            total[k] += c.get(k, 0)
        total["depth"] = max(total["depth"], c.get("depth", 0))
        for name, fc in (a.get("functions") or {}).items():
            mine = functions.setdefault(name, {"started": 0, "done": 0, "failed": 0})
            for k in mine:
                mine[k] += fc.get(k, 0)
    return total


def _in_notebook() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def _line(t: dict[str, Any], elapsed: float, width: int = 30) -> tuple[str, float]:
    frac = (t["done"] + t["failed"]) / t["spawned"] if t["spawned"] else 0.0
    if not t["spawned"] and t.get("functions"):
        # Only inline calls so far: the bar follows the roots.
        frac = t["roots_done"] / t["roots"] if t["roots"] else 0.0
    inline = f", {_inline_text(t['functions'])}" if t.get("functions") else ""
    text = (
        f"{t['done']}/{t['spawned']} tasks done, {t['failed']} failed, depth {t['depth']}"
        f"{inline}, roots {t['roots_done']}/{t['roots']}, {elapsed:.1f} s"
    )
    return text, frac


class _TextBar:
    def __init__(self, file: TextIO, width: int = 30) -> None:
        self.file = file
        self.width = width

    def update(self, t: dict[str, Any], elapsed: float, finished: bool) -> None:
        text, frac = _line(t, elapsed)
        filled = round(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        self.file.write(f"\r[{bar}] {text}")
        if finished:
            self.file.write("\n")
        self.file.flush()


def _html(t: dict[str, Any], elapsed: float) -> str:
    text, frac = _line(t, elapsed)
    color = "#d6604d" if t["failed"] else "#4393c3"
    return (
        f'<div style="width:320px;border:1px solid #999;height:12px">'
        f'<div style="width:{frac * 100:.1f}%;background:{color};height:12px"></div></div>'
        f"<code>{html.escape(text)}</code>"
    )


class _NotebookBar:
    def __init__(self) -> None:
        self.handle: Any = None

    def update(self, t: dict[str, Any], elapsed: float, finished: bool) -> None:
        from IPython.display import HTML, display

        body = HTML(_html(t, elapsed))
        if self.handle is None:
            self.handle = display(body, display_id=True)
        else:
            self.handle.update(body)
