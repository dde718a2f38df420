"""The package as it is built and released: what pyproject.toml puts in the
wheel, where the version is written, the changelog's release sections. CI
builds the wheel and runs the demo and tests/smoke_installed.py from it in a
fresh environment (.ci/run); these checks say the same things sooner."""

from __future__ import annotations

import pathlib
import re

import pytest

import dask_coro

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; reads pyproject.toml
ROOT = pathlib.Path(__file__).parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_file_of_the_package_is_in_the_wheel():
    # setuptools puts the .py files of the packages found in the wheel, and of
    # the other files only those package-data lists: one left out would be
    # missing from an installed dask_coro (as coro.yaml's defaults would).
    data = PYPROJECT["tool"]["setuptools"]["package-data"]["dask_coro"]
    package = ROOT / "dask_coro"
    # The compiled engine's and the stream allocator's C sources are
    # setup.py's (extension modules, in the sdist), and a module built in
    # place is the build's, not a file.
    others = {
        str(p.relative_to(package)) for p in package.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc", ".so", ".pyd", ".c")
        and "__pycache__" not in p.parts
    }
    sources = {str(p.relative_to(ROOT)) for p in package.rglob("*.c")}
    assert sources == {"dask_coro/core/_cengine.c", "dask_coro/lifetimes/_npalloc.c"}
    assert all(f'"{src}"' in (ROOT / "setup.py").read_text() for src in sources)
    assert others, "dask_coro has no files but code: coro.yaml, coro-schema.yaml and py.typed are"
    assert others <= set(data), sorted(others - set(data))
    assert set(PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]) == {"dask_coro*"}


def test_the_version_is_written_once():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dask_coro.__version__"}
    # setuptools reads it without importing the package: a plain string literal
    source = (ROOT / "dask_coro" / "__init__.py").read_text()
    assert re.findall(r'^__version__ = "([^"]+)"$', source, re.M) == [dask_coro.__version__]
    written = [p.relative_to(ROOT) for p in [*ROOT.glob("*.toml"), *ROOT.glob("dask_coro/**/*.py"),
                                            ROOT / "docs" / "conf.py"]
               if re.search(rf'["\']{re.escape(dask_coro.__version__)}["\']', p.read_text())]
    assert written == [pathlib.Path("dask_coro/__init__.py")]


def test_the_changelog_has_the_release_and_an_unreleased_section():
    sections = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert sections[0] == "Unreleased", sections
    released = [s for s in sections[1:] if s.split()[0] == dask_coro.__version__]
    assert len(released) == 1, (dask_coro.__version__, sections)
    # a release section carries its date, not "(unreleased)"
    assert re.fullmatch(rf"{re.escape(dask_coro.__version__)} \(\d{{4}}-\d\d-\d\d\)", released[0]), released[0]


def test_extras_name_what_the_demo_says():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert extras["shm"] == ["numpy", "xxhash"] and extras["dashboard"] == ["bokeh>=3.1.0"]
    assert any(r.startswith("build") for r in extras["release"])  # CI builds with it


def _assigned(path: pathlib.Path, name: str):
    """The literal value a module assigns to ``name`` at its top level."""
    import ast

    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name and node.value is not None:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} assigns no {name}")


def test_every_benchmark_script_is_run_by_the_driver():
    """Each benchmarks/bench_*.py and profile_*.py is one of the scripts
    run_all.py runs (MODULES), or named in its NOT_RUN with the reason: a
    script outside the driver is not measured, and rots unseen."""
    driver = ROOT / "benchmarks" / "run_all.py"
    modules, not_run = _assigned(driver, "MODULES"), _assigned(driver, "NOT_RUN")
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem.startswith(("bench_", "profile_"))}
    assert scripts - set(modules) - set(not_run) == set()
    assert set(modules) | set(not_run) <= scripts  # nothing listed that is gone
    assert not set(modules) & set(not_run)
    assert len(modules) == len(set(modules))


def _setup_py():
    import runpy

    return runpy.run_path(str(ROOT / "setup.py"), run_name="setup_py")  # not __main__: no setup()


def test_the_compiled_engine_is_left_out_where_it_cannot_run(monkeypatch, capsys):
    left_out = _setup_py()["left_out"]
    assert left_out((3, 11), "cpython", 0) is None
    assert left_out((3, 13), "cpython", None) is None
    assert "free-threaded" in left_out((3, 13), "cpython", 1)
    assert "CPython 3.14" in left_out((3, 14), "cpython", 0)
    assert "CPython 3.9" in left_out((3, 9), "cpython", 0)
    assert "pypy" in left_out((3, 10), "pypy", 0)
    # where it is left out: the same notice as without a compiler, and an
    # error where it is required
    from setuptools import Distribution

    ns = _setup_py()
    build = ns["OptionalBuildExt"](Distribution())
    ns["OptionalBuildExt"].run.__globals__["left_out"] = lambda: "a free-threaded Python"
    monkeypatch.delenv("DASK_CORO_REQUIRE_COMPILED", raising=False)
    build.run()
    assert capsys.readouterr().err == (
        "dask_coro: the compiled engine was not built (a free-threaded Python); installing the pure engine\n")
    monkeypatch.setenv("DASK_CORO_REQUIRE_COMPILED", "1")
    with pytest.raises(RuntimeError, match="a free-threaded Python"):
        build.run()
def test_the_oldest_constraints_pin_the_lower_bounds():
    """CI's oldest job (.ci/run) installs with .ci/oldest-constraints.txt: it
    pins exactly the lower bound pyproject.toml states of each dependency of
    the project's own, so the job tests the oldest releases a user may get."""
    bounds = {}
    for requirement in PYPROJECT["project"]["dependencies"]:
        name, _, low = requirement.partition(">=")
        bounds[name.strip()] = low.strip()
    pins = {}
    for line in (ROOT / ".ci" / "oldest-constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip()] = version.strip()
    assert set(pins) == set(bounds) == {"dask", "distributed", "greenlet"}
    for name, low in bounds.items():
        # greenlet>=3.0 is pinned as 3.0.0
        assert pins[name] == low or pins[name] == f"{low}.0", (name, pins[name], low)
    assert bounds["dask"] == bounds["distributed"]  # distributed requires its own dask


def test_the_classifiers_name_every_supported_python():
    """requires-python's lower bound and the classifiers say the same Pythons,
    those CI's pythons job runs (.ci/run)."""
    low = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    classifiers = PYPROJECT["project"]["classifiers"]
    minors = sorted(
        int(c.rsplit(".", 1)[1]) for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert f"3.{minors[0]}" == low
    assert minors == list(range(minors[0], minors[-1] + 1))
    ci = (ROOT / ".ci" / "run").read_text()
    for minor in minors:
        assert f"3.{minor}" in ci or minor == 11  # 3.11: the newest job's python3
