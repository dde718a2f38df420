"""The unfolding coroutine tree of each root, as the scheduler sees it. Pure:
events in (children submitted, states, forgotten keys), counts and nodes out.

A root is a task whose children were submitted by a coroutine and which has no
recorded parent itself (the coroutine a client computed). Every task a
coroutine submits, at any depth, joins its root's tree. The tree of a root is
kept until the root is forgotten, with at most ``max_nodes`` nodes recorded;
beyond that a task is *untracked*: it is counted (spawned, then done or failed,
exactly as a recorded one) but not listed. An untracked task is remembered
(its root, depth and whether it finished, so that its own children and its end
are counted) only while the scheduler holds it: its entry goes when it is
forgotten, so the book's memory is at most ``max_nodes`` nodes per root plus
one small entry per task the scheduler holds. (An untracked task forgotten and
later submitted again, by a parent that re-ran after its result was lost,
counts again: the book no longer knows it.)

Inline calls. Calls a coroutine ran inline (no task, no key) are counted per
function name under the root of the task that ran them: ``calls`` adds what
a worker counted since its last report (started, done, failed).

Replays. A parent that re-runs (its worker died) submits its children again;
the same calls have the same keys. A child whose key has the slot of an
earlier child of the same parent but another content token (``core.keys``)
means that the body yielded something else the second time: it is recorded
as replacing that child (``Node.replaces``), counted (``replayed``) and
handed back to the caller to report.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..core.keys import slot_of

if TYPE_CHECKING:  # for the type checker only: this module does not import dask
    from dask.typing import Key

DONE = "memory"
FAILED = "erred"
#: Worker stream op: ``{"key": task, "calls": {func_name: [started, done, failed]}}``,
#: the inline calls a run counted since its last report.
CALLS_OP = "dask_coro_calls"


class Node:
    __slots__ = ("depth", "done", "key", "parent", "replaces", "root", "start", "state", "stop")

    def __init__(self, key: Key, parent: Key | None, root: Key, depth: int, now: float) -> None:
        self.key = key
        self.parent = parent
        self.root = root
        self.depth = depth
        self.state = "waiting"
        self.start = now  # submitted; replaced by the compute start when known
        self.stop: float | None = None
        self.done = False  # reached memory (or erred) once
        self.replaces: Key | None = None  # the first run's child at its slot, if other

    def as_tuple(self) -> tuple[Any, ...]:
        return (self.key, self.parent, self.depth, self.state, self.start, self.stop, self.replaces)


class Untracked:
    """A task beyond ``max_nodes``: counted, not listed."""

    __slots__ = ("depth", "done", "root")

    def __init__(self, root: Key, depth: int) -> None:
        self.root = root
        self.depth = depth
        self.done = False  # reached memory (or erred) once: counted


class Root:
    __slots__ = (
        "depth", "done", "failed", "functions", "hidden", "keys", "replayed", "spawned", "untracked"
    )

    def __init__(self) -> None:
        self.spawned = 0  # tasks submitted under this root, at any depth
        self.done = 0
        self.failed = 0
        self.depth = 0  # deepest level reached
        self.untracked = 0  # spawned beyond max_nodes: counted, not recorded
        self.replayed = 0  # children that differ from the first run's at their slot
        self.keys: list[Key] = []
        self.hidden: set[Key] = set()  # the untracked ones the scheduler still holds
        #: Inline calls under this root: function name -> [started, done, failed].
        self.functions: dict[str, list[int]] = {}

    def counts(self) -> dict[str, int]:
        return {
            "spawned": self.spawned,
            "done": self.done,
            "failed": self.failed,
            "depth": self.depth,
            "untracked": self.untracked,
            "replayed": self.replayed,
        }

    def function_counts(self) -> dict[str, dict[str, int]]:
        """``{func_name: {"started", "done", "failed"}}`` of the inline calls."""
        return {
            name: {"started": c[0], "done": c[1], "failed": c[2]}
            for name, c in self.functions.items()
        }


class TreeBook:
    def __init__(self, max_nodes: int = 100_000) -> None:
        self.max_nodes = max_nodes
        self.nodes: dict[Key, Node] = {}
        self.roots: dict[Key, Root] = {}
        self.hidden: dict[Key, Untracked] = {}  # held untracked key -> its root, depth
        self.slots: dict[str, Key] = {}  # slot -> the recorded child last seen there

    def children(self, parent: Key, keys: Iterable[Key], now: float) -> list[tuple[Key, Key]]:
        """``parent`` (a running coroutine) submitted ``keys``. Returns
        ``(first run's child, new child)`` for each key that takes the slot of
        another child of ``parent``: the parent re-ran and yielded something
        else there."""
        replays: list[tuple[Key, Key]] = []
        pnode = self.nodes.get(parent)
        if pnode is not None:
            root_key, depth = pnode.root, pnode.depth + 1
        elif parent in self.hidden:
            hidden = self.hidden[parent]
            root_key, depth = hidden.root, hidden.depth + 1
        else:  # a root: its own task was not submitted by a coroutine
            pnode = self.nodes[parent] = Node(parent, None, parent, 0, now)
            pnode.state = "processing"
            self.roots[parent] = Root()
            self.roots[parent].keys.append(parent)
            root_key, depth = parent, 1
        root = self.roots[root_key]
        for key in keys:
            if key in self.nodes or key in self.hidden or key == parent:
                continue  # resubmitted (a parent rerun after a worker died)
            root.spawned += 1
            root.depth = max(root.depth, depth)
            if len(root.keys) > self.max_nodes:
                root.untracked += 1
                root.hidden.add(key)
                self.hidden[key] = Untracked(root_key, depth)
                continue
            node = self.nodes[key] = Node(key, parent, root_key, depth, now)
            root.keys.append(key)
            slot = slot_of(key)
            if slot is not None:
                old = self.slots.get(slot)
                if old is not None and old in self.nodes and self.nodes[old].parent == parent:
                    node.replaces = old
                    root.replayed += 1
                    replays.append((old, key))
                self.slots[slot] = key
        return replays

    def calls(self, key: Key, delta: dict[str, list[int]], now: float) -> None:
        """The task ``key`` ran calls inline: ``delta`` is, per function name,
        ``[started, done, failed]`` since its last report. A key not in any
        tree is a root (all its calls ran inline so far)."""
        node = self.nodes.get(key)
        if node is not None:
            root_key = node.root
        elif key in self.hidden:
            root_key = self.hidden[key].root
        else:
            node = self.nodes[key] = Node(key, None, key, 0, now)
            node.state = "processing"
            self.roots[key] = Root()
            self.roots[key].keys.append(key)
            root_key = key
        functions = self.roots[root_key].functions
        for name, (started, done, failed) in delta.items():
            c = functions.get(name)
            if c is None:
                c = functions[name] = [0, 0, 0]
            c[0] += started
            c[1] += done
            c[2] += failed

    def functions(self, key: Key) -> dict[str, dict[str, int]] | None:
        """The inline calls under root ``key`` (see ``Root.function_counts``)."""
        root = self.roots.get(key)
        return None if root is None else root.function_counts()

    def follows(self, key: Key) -> bool:
        """Whether ``key`` is in a tree (recorded or untracked): its
        transitions matter."""
        return key in self.nodes or key in self.hidden

    def state(self, key: Key, state: str, now: float, compute: tuple[float, float] | None = None) -> None:
        node = self.nodes.get(key)
        if node is None:
            hidden = self.hidden.get(key)
            if hidden is not None and state in (DONE, FAILED) and not hidden.done:
                hidden.done = True  # counted as a recorded node is, once
                root = self.roots[hidden.root]
                if state == DONE:
                    root.done += 1
                else:
                    root.failed += 1
            return
        if node.done and state in ("released", "forgotten"):
            return  # its outcome stays what the tree shows
        node.state = state
        if compute is not None:
            node.start, node.stop = compute
        if state in (DONE, FAILED) and not node.done:
            node.done = True
            if node.stop is None:
                node.stop = now
            if node.parent is not None:  # the root's own end is its state
                root = self.roots[node.root]
                if state == DONE:
                    root.done += 1
                else:
                    root.failed += 1

    def forget(self, key: Key) -> None:
        """``key`` was forgotten: a root takes its tree with it; another node
        keeps its last state (the tree shows what ran); an untracked task's
        entry goes (its counts stay)."""
        node = self.nodes.get(key)
        if node is None:
            hidden = self.hidden.pop(key, None)
            if hidden is not None:
                self.roots[hidden.root].hidden.discard(key)
            return
        if node.parent is None:
            root = self.roots.pop(key)
            for k in root.keys:
                self.nodes.pop(k, None)
                slot = slot_of(k)
                if slot is not None and self.slots.get(slot) == k:
                    del self.slots[slot]
            for k in root.hidden:
                self.hidden.pop(k, None)
        elif not node.done:
            node.state = "forgotten"  # cancelled or released before it ran
            node.stop = node.stop or node.start

    def root_of(self, key: Key) -> Key | None:
        node = self.nodes.get(key)
        return None if node is None else node.root

    def counts(self, key: Key) -> dict[str, int] | None:
        root = self.roots.get(key)
        return None if root is None else root.counts()

    def subtree(self, key: Key) -> list[tuple[Any, ...]]:
        """Nodes of the tree below ``key`` (itself first), parents before children."""
        node = self.nodes.get(key)
        if node is None:
            return []
        root = self.roots[node.root]
        if node.parent is None:
            return [self.nodes[k].as_tuple() for k in root.keys if k in self.nodes]
        inside = {key}
        out = [node.as_tuple()]
        for k in root.keys:  # in submission order: a parent comes before its children
            n = self.nodes.get(k)
            if n is not None and n.parent in inside and k not in inside:
                inside.add(k)
                out.append(n.as_tuple())
        return out
