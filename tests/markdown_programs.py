"""The Python blocks of a Markdown page as programs, run as a reader who saved
them would run them (tests/project/test_readme.py for README.md,
tests/project/test_docs_programs.py for docs/*.md).

Every ```` ```python ```` block is a complete program unless an HTML comment
on the line right before it says otherwise:

* ``<!-- program: NAME -->`` names a program;
* ``<!-- continues: NAME -->`` marks a fragment that runs appended to the
  program NAME, which must come before it on the same page;
* ``<!-- fragment -->`` marks an excerpt that is not run (it uses names the
  text around it describes: a database client of the reader's, a helper of
  another page); it must still compile.

A program passes when it exits with status 0 and prints, in order, each value
that a ``# prints VALUE`` comment in its source announces (a line of its
output equal to VALUE).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
import re
import subprocess
import sys

_FENCE = re.compile(r"^```\s*([^\s`]*).*$")  # its info string: python, bash, {eval-rst} ...
_MARK = re.compile(r"^<!--\s*(?:(program|continues):\s*([\w-]+)|(fragment))\s*-->$")
_PRINTS = re.compile(r"#\s*prints\s+(.+?)\s*$")


@dataclasses.dataclass
class Block:
    line: int  # 1-based line of the opening fence
    source: str
    mark: tuple[str, str] | None  # ("program" | "continues", NAME), ("fragment", "")


def python_blocks(text: str, page: str = "README.md") -> list[Block]:
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
            raise AssertionError(f"{page}:{start + 1}: a code block is never closed")
        if lang == "python":
            mark = _MARK.match(lines[start - 1].strip()) if start else None
            kind = None
            if mark:
                kind = ("fragment", "") if mark.group(3) else (mark.group(1), mark.group(2))
            blocks.append(Block(start + 1, "\n".join(lines[start + 1 : j]) + "\n", kind))
        i = j + 1
    return blocks


def programs(text: str, page: str = "README.md") -> dict[str, str]:
    """Every program to run, by a name for the test id: each block not marked
    a fragment, with a block that continues a program appended to it."""
    named: dict[str, str] = {}
    out: dict[str, str] = {}
    for b in python_blocks(text, page):
        if b.mark and b.mark[0] == "fragment":
            continue
        if b.mark and b.mark[0] == "continues":
            base = b.mark[1]
            assert base in named, f"{page}:{b.line}: continues {base!r}, which no block before it names"
            out[f"line{b.line}-continues-{base}"] = named[base] + "\n" + b.source
            continue
        if b.mark:
            assert b.mark[1] not in named, f"{page}:{b.line}: a second program named {b.mark[1]!r}"
            named[b.mark[1]] = b.source
        out[f"line{b.line}" + (f"-{b.mark[1]}" if b.mark else "")] = b.source
    return out


def fragments(text: str, page: str = "README.md") -> dict[str, str]:
    """The blocks marked ``<!-- fragment -->``, by a name for the test id."""
    return {f"line{b.line}": b.source for b in python_blocks(text, page)
            if b.mark and b.mark[0] == "fragment"}


class Ahead:
    """Programs run ahead of their tests, ``width`` at a time (each as
    ``run_program`` runs it: its own process, its own folder), in the order
    given; a test waits for its own with ``check``, which raises what
    ``run_program`` raised. A program spends much of its time waiting (its
    cluster's worker processes starting and closing), so a few at once take
    less time than one after the other, and none shares anything with another."""

    def __init__(self, programs: dict[str, str], folder: pathlib.Path, width: int = 3,
                 prefix: str = "") -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(width, thread_name_prefix="program")
        self._runs = {}
        for name, source in programs.items():
            (folder / _slug(name)).mkdir()
            self._runs[name] = self._pool.submit(run_program, prefix + name, source,
                                                 folder / _slug(name))

    def check(self, name: str) -> None:
        self._runs[name].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _slug(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z]", "_", name)


def selected(request, test: str) -> list[str]:
    """The ``name`` parameters of this module's test function ``test`` that
    the session runs (after -k, -m, deselection), in the session's order."""
    return [item.callspec.params["name"] for item in request.session.items
            if getattr(item, "module", None) is request.module
            and getattr(item, "originalname", None) == test]


def run_program(name: str, source: str, folder: pathlib.Path, timeout: float = 90) -> None:
    """Run ``source`` as a script file in ``folder``, in a fresh process, and
    check its exit status and its ``# prints`` comments (AssertionError)."""
    script = folder / f"{_slug(name)}.py"
    script.write_text(source)
    # A fresh process in an empty folder, as a reader's saved file runs, with
    # dask's shipped settings: the suite's own (inline calls off, validation;
    # see conftest.py) reach subprocesses through DASK_* variables.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    # Progress bars redraw with \r; each piece is a line of output here.
    output = [piece.strip() for piece in re.split(r"[\r\n]", proc.stdout)]
    expected = [m.group(1) for line in source.splitlines() if (m := _PRINTS.search(line))]
    at = 0
    for value in expected:
        assert value in output[at:], f"{name}: expected a line {value!r} after {output[:at]!r}; output:\n{proc.stdout}"
        at = output.index(value, at) + 1
