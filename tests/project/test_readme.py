"""README.md's Python blocks run as written, so the README cannot drift.

Each ```` ```python ```` block of README.md is a complete program, run as a
script file in a fresh process (``sys.executable``), as a reader who saved it
would run it; ``<!-- program: NAME -->`` and ``<!-- continues: NAME -->``
tie a fragment to the program it continues (tests/markdown_programs.py says
how). The programs start their own small clusters
(``Client(n_workers=2, threads_per_worker=1)`` under
``if __name__ == "__main__":``), so each takes a few seconds.
"""

from __future__ import annotations

import pathlib
import re

import pytest
from markdown_programs import Ahead, fragments, programs, selected

ROOT = pathlib.Path(__file__).parents[2]
README = ROOT / "README.md"

PROGRAMS = programs(README.read_text())


def test_the_readme_has_programs_to_run():
    # fib, process_all, the promise, shared memory, progress: a README whose
    # blocks lost their fences would otherwise pass with nothing run.
    assert len(PROGRAMS) >= 5, sorted(PROGRAMS)
    assert all("# prints" in src for src in PROGRAMS.values()), sorted(PROGRAMS)
    # the README promises that every block is a program (or continues one)
    assert fragments(README.read_text()) == {}


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """The programs this session runs, started a few at a time, ahead of their tests."""
    names = selected(request, "test_readme_program_runs")
    runs = Ahead({n: PROGRAMS[n] for n in names}, tmp_path_factory.mktemp("readme"),
                 prefix="readme_")
    yield runs
    runs.close()


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_readme_program_runs(name, ahead):
    ahead.check(name)


def test_markers_are_read():
    text = (
        "<!-- program: a -->\n```python\nx = 1  # prints 1\n```\n"
        "text\n\n```python\ny = 2\n```\n"
        "<!-- continues: a -->\n```python\nprint(x)\n```\n"
    )
    progs = programs(text)
    assert progs == {
        "line2-a": "x = 1  # prints 1\n",
        "line7": "y = 2\n",
        "line11-continues-a": "x = 1  # prints 1\n\nprint(x)\n",
    }
    with pytest.raises(AssertionError, match="continues 'b', which no block before it names"):
        programs("<!-- continues: b -->\n```python\npass\n```\n")


def test_readme_links_to_files_that_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "README.md links to no file of the repository"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == []
