"""The pure core works without distributed; ``import dask_coro`` does not load it."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import textwrap

import dask_coro

PKG = pathlib.Path(dask_coro.__file__).parent


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True
    )


def test_pure_modules_work_with_distributed_blocked():
    r = run(
        """
        import sys
        sys.modules["distributed"] = None  # any import of it now fails

        import dask_coro.core.structure, dask_coro.core.driver, dask_coro.core.cache
        from dask_coro.core.driver import Driver, Yielded, Returned
        from dask_coro.core.structure import Structure
        from dask_coro.core.cache import ResultCache

        def body(x):
            a, b = yield [x, x + 1]
            return a + b

        d = Driver("body")
        step = d.start(body, (1,), {})
        assert step == Yielded([1, 2]), step
        s = Structure(step.value, lambda obj, path: True)
        assert s.paths == [(0,), (1,)]
        step = d.send(s.rebuild([10, 20]))
        assert step == Returned(30), step

        class L: pass
        c = ResultCache()
        layer = L()
        c.add([(layer, {"a": "b"})])
        del layer
        import gc; gc.collect()
        assert c.sweep() == ["b"]
        assert sys.modules["distributed"] is None
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_local_compute_with_distributed_blocked():
    r = run(
        """
        import sys
        sys.modules["distributed"] = None

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
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_local_compute_in_running_event_loop_with_distributed_blocked():
    # Regression: the worker-loop check must treat a blocked distributed
    # (sys.modules["distributed"] = None) as absent when an event loop runs in
    # the calling thread (Jupyter, asyncio.run).
    r = run(
        """
        import asyncio, sys
        sys.modules["distributed"] = None
        import dask_coro

        @dask_coro.coroutine
        def f(x):
            return (yield [x, x])

        async def main():
            return f(2).compute(scheduler="sync")

        assert asyncio.run(main()) == [2, 2]
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_import_dask_coro_does_not_import_distributed():
    r = run(
        """
        import sys
        import dask_coro
        print(sorted(m for m in sys.modules if m == "distributed" or m.startswith("distributed.")))
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_local_driver_does_not_import_distributed():
    # dask's own ``compute()`` imports distributed to look for a client, so run
    # the graph with dask's sync scheduler directly: the in-process driver
    # itself must not need distributed.
    r = run(
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
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def _imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
            else:
                out.add("." + (node.module or ""))
    return out


def test_pure_modules_import_neither_dask_nor_distributed():
    # _structure, _driver and _cache say "Pure: no dask, no distributed".
    for name in ("core/structure.py", "core/driver.py", "core/cache.py", "_exceptions.py", "lifetimes/ledger.py", "diagnostics/book.py"):
        mods = _imported_modules(PKG / name)
        assert "dask" not in mods, name
        assert "distributed" not in mods, name
        relative = {m for m in mods if m.startswith(".")}
        assert relative <= {".._exceptions", "._exceptions", ".structure"}, (name, relative)


def test_no_module_level_distributed_import_anywhere():
    # distributed is imported lazily (inside functions) only, except by the
    # adapters that only run inside distributed: the worker runner and the
    # plugins (imported on first use of a Promise or a tie).
    adapters = (
        "runtime/worker.py",
        "promise/scheduler.py",
        "lifetimes/scheduler.py",
        "lifetimes/worker.py",
        "diagnostics/scheduler.py",
        "runtime/scheduler.py",
        "_internals/distributed_private.py",
        "__main__.py",
    )
    for path in sorted(PKG.rglob("*.py")):
        if str(path.relative_to(PKG)) in adapters:
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
