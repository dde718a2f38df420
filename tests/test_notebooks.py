"""Every notebook in notebooks/ runs top to bottom in a Jupyter kernel (nbclient),
as a user would run it, in a temporary working directory; and is stored
executed, with outputs a reader on the web can use (``python
tests/notebook_run.py`` refreshes them)."""

from __future__ import annotations

import json
import shutil

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError
from notebook_run import execute, notebooks, problems, scrub

NOTEBOOKS = notebooks()


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {
        "quickstart.ipynb",
        "promise_search.ipynb",
        "shared_memory.ipynb",
    }


def _kinds(nb) -> list[list[str]]:
    """Per code cell, the kinds of its outputs in order (a stream, by its name;
    data, by its MIME types), a run of the same kind counted once: a print
    may come in one stream output or several."""
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kinds: list[str] = []
        for o in cell.get("outputs", []):
            kind = o["name"] if o["output_type"] == "stream" else ",".join(sorted(o.get("data", {})))
            if not kinds or kinds[-1] != kind:
                kinds.append(kind)
        out.append(kinds)
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_executed(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), (
        f"{path.name} is not stored executed top to bottom: python tests/notebook_run.py"
    )
    assert sum(len(c.outputs) for c in code) >= len(code) // 2
    assert problems(nb) == []
    assert not any("execution" in c.metadata for c in code)  # no timestamps
    assert nb.metadata == {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    # stored as the refresh stores it: nothing scrub() would still change
    assert json.dumps(scrub(nbformat.from_dict(json.loads(json.dumps(nb)))), sort_keys=True) == json.dumps(nb, sort_keys=True)


# The notebooks are user docs: they run with the shipped default, coroutine
# calls inline (coro.inline.enabled true). The kernel inherits the environment
# variable the conftest fixture sets from this mark.
@pytest.mark.inline
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
    before = path.read_bytes()
    try:
        nb = execute(path, str(tmp_path))  # a copy: the stored file stays as it is
    except CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{str(e)[-4000:]}")
    assert path.read_bytes() == before
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    # The stored outputs are those of the notebook's code as it is now.
    stored = _kinds(nbformat.read(path, as_version=4))
    if shutil.which("dot") is None:  # the tree's picture needs Graphviz's dot
        stored = [[k for k in kinds if "image/svg+xml" not in k] for kinds in stored]
    assert _kinds(scrub(nb)) == stored, (
        f"{path.name}'s stored outputs are not those of its cells: python tests/notebook_run.py {path}"
    )


def test_scrub_and_problems():
    nb = nbformat.v4.new_notebook()
    log = (
        "2026-01-02 03:04:05,678 - distributed.worker - ERROR - Compute Failed\n"
        "Key:       careless-0123\nTraceback: '  File \"/somewhere/engine.py\", line 1'\n\n"
    )
    bar = "<code>4/4 tasks done, 0 failed, depth 2, roots 1/1, 2.3 s</code>"
    cell = nbformat.v4.new_code_cell("x", execution_count=1, outputs=[
        nbformat.v4.new_output("stream", name="stderr", text=log),
        nbformat.v4.new_output("display_data", data={"text/html": bar, "text/plain": "bar"}),
        nbformat.v4.new_output("stream", name="stderr", text="UserWarning: careful\n" + log),
    ])
    nb.cells = [cell, nbformat.v4.new_code_cell("y")]
    scrub(nb)
    assert [o["output_type"] for o in cell.outputs] == ["display_data", "stream"]
    assert cell.outputs[0]["data"]["text/html"] == "<code>4/4 tasks done, 0 failed, depth 2, roots 1/1</code>"
    assert cell.outputs[1]["text"] == "UserWarning: careful\n"
    assert problems(nb) == [
        "cell 0 wrote to stderr: 'UserWarning: careful\\n'",
        "cell 1 did not run",
    ]
