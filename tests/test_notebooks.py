"""Every notebook in notebooks/ runs top to bottom in a Jupyter kernel (nbclient),
as a user would run it, in a temporary working directory."""

from __future__ import annotations

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {
        "quickstart.ipynb",
        "promise_search.ipynb",
        "shared_memory.ipynb",
    }


# The notebooks are user docs: they run with the shipped default, coroutine
# calls inline (coro.inline.enabled true). The kernel inherits the environment
# variable the conftest fixture sets from this mark.
@pytest.mark.inline
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        "notebooks are stored without outputs"
    )
    # "python3" is ipykernel's own kernel: this interpreter (sys.executable)
    client = NotebookClient(
        nb,
        timeout=100,  # per cell
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{str(e)[-4000:]}")
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
