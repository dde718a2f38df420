"""README.md's Python blocks run as written, so the README cannot drift.

Each ```` ```python ```` block of README.md is a complete program, run as a
script file in a fresh process (``sys.executable``), as a reader who saved it
would run it. Two HTML comments, on the line right before a block, tie blocks
together:

* ``<!-- program: NAME -->`` names a program;
* ``<!-- continues: NAME -->`` marks a fragment: it runs appended to the
  program NAME, which must come before it.

A program passes when it exits with status 0 and prints, in order, each value
that a ``# prints VALUE`` comment in its source announces (a line of its
output equal to VALUE). The programs start their own small clusters
(``Client(n_workers=2, threads_per_worker=1)`` under
``if __name__ == "__main__":``), so each takes a few seconds.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent
README = ROOT / "README.md"

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*(program|continues):\s*([\w-]+)\s*-->$")
_PRINTS = re.compile(r"#\s*prints\s+(.+?)\s*$")


@dataclasses.dataclass
class Block:
    line: int  # 1-based line of the opening fence
    source: str
    mark: tuple[str, str] | None  # ("program" | "continues", NAME)


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text, each with the marker comment
    on the line right before its fence, if any."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        if j == len(lines):
            raise AssertionError(f"README.md:{start + 1}: a code block is never closed")
        if lang == "python":
            mark = _MARK.match(lines[start - 1].strip()) if start else None
            blocks.append(Block(start + 1, "\n".join(lines[start + 1 : j]) + "\n",
                                (mark.group(1), mark.group(2)) if mark else None))
        i = j + 1
    return blocks


def programs(text: str) -> dict[str, str]:
    """Every program to run, by a name for the test id: each block, with a
    fragment appended to the program it continues."""
    named: dict[str, str] = {}
    out: dict[str, str] = {}
    for b in python_blocks(text):
        if b.mark and b.mark[0] == "continues":
            base = b.mark[1]
            assert base in named, f"README.md:{b.line}: continues {base!r}, which no block before it names"
            out[f"line{b.line}-continues-{base}"] = named[base] + "\n" + b.source
            continue
        if b.mark:
            assert b.mark[1] not in named, f"README.md:{b.line}: a second program named {b.mark[1]!r}"
            named[b.mark[1]] = b.source
        out[f"line{b.line}" + (f"-{b.mark[1]}" if b.mark else "")] = b.source
    return out


PROGRAMS = programs(README.read_text())


def test_the_readme_has_programs_to_run():
    # fib, process_all, the promise, shared memory, progress: a README whose
    # blocks lost their fences would otherwise pass with nothing run.
    assert len(PROGRAMS) >= 5, sorted(PROGRAMS)
    assert all("# prints" in src for src in PROGRAMS.values()), sorted(PROGRAMS)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_readme_program_runs(name, tmp_path):
    source = PROGRAMS[name]
    script = tmp_path / f"readme_{name.replace('-', '_')}.py"
    script.write_text(source)
    # A fresh process in an empty folder, as a reader's saved file runs, with
    # dask's shipped settings: the suite's own (inline calls off, validation;
    # see conftest.py) reach subprocesses through DASK_* variables.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    # Progress bars redraw with \r; each piece is a line of output here.
    output = [piece.strip() for piece in re.split(r"[\r\n]", proc.stdout)]
    expected = [m.group(1) for line in source.splitlines() if (m := _PRINTS.search(line))]
    at = 0
    for value in expected:
        assert value in output[at:], f"{name}: expected a line {value!r} after {output[:at]!r}; output:\n{proc.stdout}"
        at = output.index(value, at) + 1


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
