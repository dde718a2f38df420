"""Every notebook in notebooks/ runs top to bottom (code cells in order, one
namespace, in a fresh interpreter, as a kernel would)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))

RUNNER = """
import json, sys
nb = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__"}
for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] == "code":
        src = "".join(cell["source"])
        print(f"--- cell {i}", flush=True)
        exec(compile(src, f"<cell {i}>", "exec"), ns)
"""


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, str(path)],
        capture_output=True, text=True, timeout=110, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
