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
from notebook_run import comparable, execute, notebooks, problems, scrub

NOTEBOOKS = notebooks()


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {
        "quickstart.ipynb",
        "promise_search.ipynb",
        "shared_memory.ipynb",
        "dynamic_programs.ipynb",
    }


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
    # What a reader running it sees: no log record of an error (a task that
    # fails on purpose is shown through its future, not a worker's traceback).
    stderr = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.get("name") == "stderr")
    assert " - ERROR - " not in stderr, stderr[-3000:]
    # The stored outputs are those of the notebook's code as it is now, text
    # included, apart from values that vary by design (notebook_run.comparable).
    missing = frozenset(p for p in ("dot",) if shutil.which(p) is None)
    stored = comparable(nbformat.read(path, as_version=4), missing)
    fresh = comparable(scrub(nb), missing)
    assert len(fresh) == len(stored)
    for i, (got, want) in enumerate(zip(fresh, stored)):
        assert got == want, (
            f"{path.name}, code cell {i}: a fresh run shows other outputs than the stored "
            f"ones (python tests/notebook_run.py {path} stores them)\nfresh:  {got!r}\nstored: {want!r}"
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


def test_comparable_masks_what_varies_by_design():
    def cell(outputs, **metadata):
        c = nbformat.v4.new_code_cell("x", execution_count=1, outputs=outputs)
        c.metadata.update(metadata)
        return c

    def stream(text):
        return nbformat.v4.new_output("stream", name="stdout", text=text)

    def notebook(pid, key, picture, printed):
        nb = nbformat.v4.new_notebook()
        nb.cells = [
            cell([stream(f"pid {pid}, "), stream(f"key fib-{key}\n")], varies=[r"(?<=pid )\d+"]),
            cell([nbformat.v4.new_output("execute_result", execution_count=1, data={
                "text/plain": f"<Digraph at 0x{key[:12]}>", "image/svg+xml": picture})]),
            cell([stream(printed)], needs=["dot"]),
        ]
        return nb

    one = notebook(123, "e03f0638b06f4075a95dc3e610c7e357", "<svg>1.2 s</svg>", "wrote it")
    two = notebook(4567, "0df23a84349adb58aaaa0638b06f4075", "<svg>0.9 s</svg>", "no dot")
    assert comparable(one) == [
        [("stdout", "pid …, key fib-…\n")],
        [("image/svg+xml", ""), ("text/plain", "<Digraph at …>")],
        [("stdout", "wrote it")],
    ]
    assert comparable(one) != comparable(two)  # the last cell differs ...
    assert comparable(one, frozenset({"dot"})) == comparable(two, frozenset({"dot"}))  # ... without dot
    other = notebook(123, "e03f0638b06f4075a95dc3e610c7e357", "<svg/>", "wrote it")
    other.cells[0].outputs[0]["text"] = "pid 1, depth 3, "  # a value that must not vary
    assert comparable(other) != comparable(one)
