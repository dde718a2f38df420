"""Every Python program in docs/*.md runs as written, as the README's do
(tests/project/test_readme.py): a script in a fresh process, its ``# prints``
comments checked. A block that is only an excerpt is marked
``<!-- fragment -->`` on the line above it and must still compile
(tests/markdown_programs.py says how blocks are marked)."""

from __future__ import annotations

import pathlib

import pytest
from markdown_programs import Ahead, fragments, programs, selected

DOCS = pathlib.Path(__file__).parents[2] / "docs"
PAGES = sorted(DOCS.glob("*.md"))

PROGRAMS = {f"{page.stem}-{name}": src for page in PAGES
            for name, src in programs(page.read_text(), f"docs/{page.name}").items()}
FRAGMENTS = {f"{page.stem}-{name}": src for page in PAGES
             for name, src in fragments(page.read_text(), f"docs/{page.name}").items()}


def test_the_docs_have_programs_to_run():
    # fib and #1663's fib (coroutines), the promise, shared memory (lifetimes):
    # pages whose blocks lost their fences would otherwise pass with nothing run.
    assert {name.split("-")[0] for name in PROGRAMS} >= {"coroutines", "promise", "lifetimes"}, sorted(PROGRAMS)
    # a program says what it prints, so that running it checks something
    assert [name for name, src in PROGRAMS.items() if "# prints" not in src] == []


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """The programs this session runs, started a few at a time, ahead of their tests."""
    names = selected(request, "test_docs_program_runs")
    runs = Ahead({n: PROGRAMS[n] for n in names}, tmp_path_factory.mktemp("docs"))
    yield runs
    runs.close()


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_docs_program_runs(name, ahead):
    ahead.check(name)


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
def test_docs_fragment_compiles(name):
    compile(FRAGMENTS[name], name, "exec")


def test_fragment_marker_is_read():
    text = (
        "<!-- fragment -->\n```python\nundefined_name()\n```\n"
        "<!-- program: a -->\n```python\nx = 1  # prints 1\n```\n"
        "<!-- continues: a -->\n```python\nprint(x)\n```\n"
    )
    assert programs(text) == {"line6-a": "x = 1  # prints 1\n",
                              "line10-continues-a": "x = 1  # prints 1\n\nprint(x)\n"}
    assert fragments(text) == {"line2": "undefined_name()\n"}
