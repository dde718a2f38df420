"""The package's structure: no import circles, the runner injected into the
call object, and distributed's and dask's private API used only in the seam."""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import dask_coro

PKG = pathlib.Path(dask_coro.__file__).parent


def _module(path: pathlib.Path) -> str:
    parts = ["dask_coro", *path.relative_to(PKG).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
    """The package modules ``path`` imports, at module level or in functions."""
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            out.update(n for n in [target, *names] if n.startswith("dask_coro"))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("dask_coro"))
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        # ``from .x import y`` names module x (and y, if y is a module).
        graph[name] = {m for m in _imports(path) if m in files and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_no_import_circles_between_modules():
    graph = _graph()
    # A package's __init__ is its composition root: it may import its own
    # modules, which import each other, not it.
    for name in graph:
        graph[name] = {m for m in graph[name] if not (graph.get(m) is not None and name.startswith(m + "."))}
    assert _cycles(graph) == []


def test_no_import_circles_between_feature_folders():
    graph = _graph()

    def folder(m: str) -> str:
        parts = m.split(".")
        # dask_coro.core.x -> core; a folder's __init__ (dask_coro.core) is in it
        return parts[1] if len(parts) > 2 or (PKG / parts[-1]).is_dir() else m

    folders: dict[str, set[str]] = {}
    for name, deps in graph.items():
        if name == "dask_coro":  # the composition root imports everything
            continue
        folders.setdefault(folder(name), set()).update(
            folder(d) for d in deps if folder(d) != folder(name) and d != "dask_coro"
        )
    for name in list(folders):
        folders[name] &= set(folders)
    assert _cycles(folders) == []


def test_the_call_object_imports_no_runner():
    deps = _graph()["dask_coro.runtime.call"]
    assert not deps & {"dask_coro.runtime.worker", "dask_coro.runtime.local"}, deps


PRIVATE = re.compile(
    r"dask\._task_spec|dask\._expr|dask\.base\._annotations"
    r"|\.state\.tasks|\.plugins\b|handle_stimulus|SecedeEvent|thread_state"
    r"|_send_to_scheduler|scheduler_comm|\.stream_handlers|\.handlers\[|worker_plugins"
    r"|WORKER_SATURATION|idle_task_count|_worker_cvar|batched_stream|\.run_spec\s*="
    r"|add_dependency|\.waiters|\.waiting_on"
)


def test_private_api_only_in_the_seam():
    seam = PKG / "_internals"
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        if seam in path.parents:
            continue
        code: dict[int, list[str]] = {}  # line -> its code, strings and comments left out
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type not in (tokenize.STRING, tokenize.COMMENT):
                code.setdefault(tok.start[0], []).append(tok.string)
        for n, toks in sorted(code.items()):
            if PRIVATE.search(" ".join(toks).replace(" . ", ".").replace(" .", ".").replace(". ", ".")):
                offenders.append(f"{path.relative_to(PKG)}:{n}: {' '.join(toks)}")
    assert offenders == []


#: The features with plugins of their own, each registered by its extension.py.
REGISTERED = ("diagnostics", "durability", "lifetimes", "promise", "release", "stream")
#: Every feature above the runtime: groups need no plugin (they use the engine's
#: InPlace request and the run's methods for children of a feature's own).
#: (resources/ is a service of the runner's waits, below it: the runner imports it.)
FEATURES = (*REGISTERED, "groups")


def test_the_runtime_and_the_core_name_no_feature():
    """Features plug into the runtime (``runtime/extensions.py``); the
    runtime and the core import none of them, so a new feature is added
    without editing either."""
    offenders = {
        name: sorted(d for d in deps if d.split(".")[1:2] in ([f] for f in FEATURES))
        for name, deps in _graph().items()
        if name.split(".")[1:2] in (["runtime"], ["core"])
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_features_register_only_from_the_top():
    """One module names the features, above the runtime: ``_features``,
    imported by the package's ``__init__``; each feature's registration is
    its ``extension`` module."""
    graph = _graph()
    importers = {name for name, deps in graph.items() if "dask_coro._features" in deps}
    assert importers == {"dask_coro"}
    registrations = {d for d in graph["dask_coro._features"] if d.endswith(".extension")}
    assert registrations == {f"dask_coro.{f}.extension" for f in REGISTERED}
    for name, deps in graph.items():
        if name.endswith(".extension"):
            assert "dask_coro.runtime.worker" not in deps, name
