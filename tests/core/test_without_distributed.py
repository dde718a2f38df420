"""The pure core works without distributed; ``import dask_coro`` does not load it."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import textwrap

import dask_coro

PKG = pathlib.Path(dask_coro.__file__).parent


def printed(code: str) -> str:
    """What ``code`` (indented as a test writes it) prints, run by a fresh
    interpreter that must exit cleanly."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def printed_with_distributed_blocked(code: str) -> str:
    """``printed(code)`` in an interpreter where any import of distributed fails."""
    return printed('import sys\nsys.modules["distributed"] = None  # any import of it now fails\n'
                   + textwrap.dedent(code))


CORE = sorted(p.stem for p in (PKG / "core").glob("*.py") if p.stem != "__init__")


def test_core_folder_is_known():
    # A new core module joins the purity checks below by being in core/.
    assert {"cache", "classify", "engine", "keys", "plan", "scope", "structure"} <= set(CORE)


def test_every_core_module_imports_with_distributed_blocked_and_starts_nothing():
    assert printed_with_distributed_blocked(
        f"""
        import asyncio, importlib, threading
        before = threading.active_count()
        for name in {CORE!r}:
            importlib.import_module("dask_coro.core." + name)
        assert threading.active_count() == before, threading.enumerate()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise AssertionError("an event loop runs")
        assert asyncio.get_event_loop_policy()._local._loop is None, "an event loop was made"
        assert sys.modules["distributed"] is None
        assert not [m for m in sys.modules if m.startswith("distributed.")]
        # greenlet is the engine's own switching primitive (core/engine.py
        # parks a body that waits in dask_coro.result); tornado is the runtime's.
        assert not [m for m in sys.modules if m.startswith("tornado")]
        print("ok")
        """
    ) == "ok"


def test_pure_core_runs_a_coroutine_with_distributed_blocked():
    assert printed_with_distributed_blocked(
        """
        from dask_coro.core.cache import ResultCache
        from dask_coro.core.engine import Done, Returned, Trampoline
        from dask_coro.core.structure import Structure

        def body(x):
            a, b = yield [x, x + 1]
            return a + b

        t = Trampoline("body", call_type=None, classify=lambda name, i: lambda obj, path: True)
        out = t.start(body, (1,), {})
        assert [out.frame.leaves[p] for p in out.frame.remote] == [1, 2]
        out = t.resume([10, 20])
        assert type(out) is Done and type(out.step) is Returned and out.step.value == 30

        s = Structure({"a": [1, 2]}, lambda obj, path: True)
        assert s.paths == [("a", 0), ("a", 1)] and s.rebuild([3, 4]) == {"a": [3, 4]}

        class L: pass
        c = ResultCache()
        layer = L()
        c.add([(layer, {"a": "b"})])
        del layer
        import gc; gc.collect()
        assert c.sweep() == ["b"]
        print("ok")
        """
    ) == "ok"


def test_local_compute_with_distributed_blocked():
    assert printed_with_distributed_blocked(
        """
        import dask_coro

        @dask_coro.coroutine
        def fib(i):
            if i < 2:
                return i
            a, b = yield [fib(i - 1), fib(i - 2)]
            return a + b

        @dask_coro.coroutine
        def key():
            return dask_coro.current_key()

        assert fib(7).compute() == 13
        k = key()
        assert k.compute() == k.key
        try:
            dask_coro.current_key()
        except dask_coro.NotInTaskError:
            pass
        else:
            raise AssertionError("no NotInTaskError")
        print("ok")
        """
    ) == "ok"


def test_local_compute_in_running_event_loop_with_distributed_blocked():
    # Regression: the worker-loop check must treat a blocked distributed
    # (sys.modules["distributed"] = None) as absent when an event loop runs in
    # the calling thread (Jupyter, asyncio.run).
    assert printed_with_distributed_blocked(
        """
        import asyncio
        import dask_coro

        @dask_coro.coroutine
        def f(x):
            return (yield [x, x])

        async def main():
            return f(2).compute(scheduler="sync")

        assert asyncio.run(main()) == [2, 2]
        print("ok")
        """
    ) == "ok"


def test_import_dask_coro_does_not_import_distributed():
    assert printed(
        """
        import sys
        import dask_coro
        print(sorted(m for m in sys.modules if m == "distributed" or m.startswith("distributed.")))
        """
    ) == "[]"


def test_local_driver_does_not_import_distributed():
    # dask's own ``compute()`` imports distributed to look for a client, so run
    # the graph with dask's sync scheduler directly: the in-process driver
    # itself must not need distributed.
    assert printed(
        """
        import sys
        from dask.local import get_sync
        import dask_coro

        @dask_coro.coroutine
        def g(x):
            return x * 2

        @dask_coro.coroutine
        def f(x):
            a, b = yield [g(x), x]
            return a + b

        call = f(1)
        assert get_sync(dict(call.__dask_graph__()), call.key) == 3
        print("distributed" in sys.modules)
        """
    ) == "False"


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Every module a file imports when it runs, anywhere in it: absolute ones
    by their full name, relative ones with their leading dots. Imports under
    ``if TYPE_CHECKING:`` are for the type checker and never run: not counted."""
    tree = ast.parse(path.read_text())
    out = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
        stack.extend(ast.iter_child_nodes(node))
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def test_type_checking_imports_are_not_counted(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import distributed\nelse:\n    import json\n"
        "def g():\n    import dask\n"
    )
    assert _imported_modules(f) == {"typing", "json", "dask"}


def _top(mods: set[str]) -> set[str]:
    return {m.split(".")[0] for m in mods if not m.startswith(".")}


def test_core_imports_no_distributed_and_nothing_outside_core_but_the_seams():
    allowed = {".._exceptions", ".._internals.dask_private"}
    for name in CORE:
        mods = _imported_modules(PKG / "core" / f"{name}.py")
        assert "distributed" not in _top(mods), name
        outside = {m for m in mods if m.startswith("..")}
        assert outside <= allowed, (name, outside)
        # dask's private modules only through the seam
        assert not {m for m in mods if m.startswith("dask._")}, name


def test_pure_modules_import_neither_dask_nor_distributed():
    # Pure of dask as well: structure, cache, scope, the ledger, the tree book.
    for name in ("core/structure.py", "core/cache.py", "core/keys.py", "core/scope.py", "_exceptions.py", "lifetimes/ledger.py", "diagnostics/book.py", "durability/book.py", "durability/budget.py", "release/book.py", "resources/book.py"):
        mods = _imported_modules(PKG / name)
        assert not _top(mods) & {"dask", "distributed"}, name
        relative = {m for m in mods if m.startswith(".")}
        # ... and they import only pure modules of ours.
        assert relative <= {".._exceptions", ".cache", ".structure", "..core.keys"}, (name, relative)


def test_no_module_level_distributed_import_anywhere():
    # distributed is imported lazily (inside functions) only, except by the
    # adapters that only run inside distributed: the worker runner and the
    # plugins (imported on first use of a Promise or a tie), and the seam that
    # wraps distributed's private API (_internals/distributed/).
    adapters = (
        "runtime/worker.py",
        "promise/scheduler.py",
        "lifetimes/scheduler.py",
        "lifetimes/worker.py",
        "lifetimes/tie.py",
        "lifetimes/registry.py",
        "diagnostics/scheduler.py",
        "durability/scheduler.py",
        "durable/worker.py",
        "release/scheduler.py",
        "release/worker.py",
        "resources/scheduler.py",
        "resources/worker.py",
        "runtime/scheduler.py",
        "stream/scheduler.py",
        "__main__.py",
    )
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(PKG))
        if rel in adapters or rel.startswith("_internals/distributed/"):
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            assert not any(
                n == "distributed" or n.startswith("distributed.") for n in names
            ), (path.name, names)
