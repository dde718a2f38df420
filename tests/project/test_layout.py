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


def _features() -> set[str]:
    """The feature folders, read from the table of extensions: the folder of
    each registered extension's class but the runtime's own (work stealing)."""
    from dask_coro.runtime import extensions

    return {type(e).__module__.split(".")[1] for e in extensions.registered()} - {"runtime"}


#: Folders below the features: the runtime, the core and the seam.
BELOW = {"runtime", "core", "_internals"}


def test_every_feature_folder_is_registered():
    """Each folder of the package above the runtime registers an extension:
    the table is the one list of features (a folder that does not would be
    invisible to the checks below)."""
    folders = {p.parent.name for p in PKG.glob("*/__init__.py")} - BELOW
    assert folders == _features()


def test_the_runtime_and_the_core_name_no_feature():
    """Features plug into the runtime (``runtime/extensions.py``); the
    runtime and the core import none of them, so a new feature is added
    without editing either."""
    features = _features()
    offenders = {
        name: sorted(d for d in deps if d.split(".")[1:2] in ([f] for f in features))
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
    assert registrations == {f"dask_coro.{f}.extension" for f in _features()}
    for name, deps in graph.items():
        if name.endswith(".extension"):
            assert "dask_coro.runtime.worker" not in deps, name


def _is_run_type(ann: ast.expr | None) -> bool:
    return (isinstance(ann, ast.Name) and ann.id == "Run") or (isinstance(ann, ast.Constant) and ann.value == "Run")


def _run_uses(tree: ast.Module) -> set[tuple[str, int]]:
    """What a module reads of a run: ``x.name`` (and ``getattr(x, "name")``)
    for ``x`` a parameter named ``run`` or typed ``Run``, an attribute of
    ``self`` set from one (``self.run = run``), or a trampoline's host
    (``tramp.host``)."""
    kept: set[str] = set()  # attributes of self holding a run, in the class at hand
    uses = set()

    def is_run(node: ast.expr, params: set[str]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in params
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return (node.value.id == "self" and node.attr in kept) or (node.value.id == "tramp" and node.attr == "host")
        return False

    def visit_function(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        params = {a.arg for a in args if a.arg == "run" or _is_run_type(a.annotation)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and is_run(node.value, params):
                uses.add((node.attr, node.lineno))
            elif (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and is_run(node.args[0], params) and isinstance(node.args[1], ast.Constant)
            ):
                uses.add((node.args[1].value, node.lineno))

    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            kept.clear()
            methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for m in methods:
                args = [*m.args.args, *m.args.kwonlyargs]
                params = {a.arg for a in args if a.arg == "run" or _is_run_type(a.annotation)}
                for a in ast.walk(m):
                    if isinstance(a, ast.Assign) and isinstance(a.value, ast.Name) and a.value.id in params:
                        kept.update(t.attr for t in a.targets if isinstance(t, ast.Attribute))
            for m in methods:
                visit_function(m)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kept.clear()
            visit_function(node)
    return uses


def test_a_run_declares_all_that_features_use_of_it():
    """Every attribute the feature folders read of a run (in their hooks, and
    as the trampoline's host in a body: groups, streams) is declared, typed
    and documented, in ``extensions.Run``: the interface between the runtime
    and the features cannot drift."""
    from dask_coro.runtime.extensions import Run

    declared = {n for n in vars(Run) if not n.startswith("_")} | set(Run.__annotations__)
    used: dict[str, list[str]] = {}
    for feature in sorted(_features()):
        for path in sorted((PKG / feature).rglob("*.py")):
            for attr, line in _run_uses(ast.parse(path.read_text())):
                used.setdefault(attr, []).append(f"{path.relative_to(PKG)}:{line}")
    assert {"key", "worker", "start_children", "notes", "beside"} <= set(used)  # the scan finds them
    assert {a: where for a, where in used.items() if a not in declared} == {}


def test_the_runs_provide_what_run_declares():
    """A run and a body run beside one (``runtime/beside.py``) have every
    member of ``Run``, and nothing else passes a run's attributes through
    (mypy checks the types; this, that no member is left to ``__getattr__``)."""
    from dask_coro.runtime.beside import Beside
    from dask_coro.runtime.extensions import Run
    from dask_coro.runtime.worker import _Run

    declared = {n for n in vars(Run) if not n.startswith("_")} | set(Run.__annotations__)
    for cls in (Beside, _Run):
        assert "__getattr__" not in vars(cls), cls
    missing = {n for n in declared if not hasattr(Beside, n) and n not in ("notes", "urgent")}
    assert missing == set()
    assert {n for n in declared if not hasattr(_Run, n)} <= {"notes", "urgent", "worker", "key", "loop", "options"}
