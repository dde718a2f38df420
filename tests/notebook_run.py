"""Running the notebooks of notebooks/ as a user would (a Jupyter kernel,
nbclient), for tests/project/test_notebooks.py and to store them executed.

Re-execute every notebook and store it with its outputs (run from the
repository's root, after changing a notebook or what it shows)::

    python tests/notebook_run.py                 # all of notebooks/*.ipynb
    python tests/notebook_run.py notebooks/quickstart.ipynb

A notebook is stored only if it ran without an error and its outputs are
what a reader on the web can use: no traceback, nothing on stderr, no path
of the machine that ran it, no output bigger than ``MAX_OUTPUT`` characters.
Execution timestamps are not kept (``record_timing=False``) and the
notebook's metadata stays as written, so a refresh changes only outputs.
The log records distributed's processes write to stderr (a worker's
"Compute Failed" for a task that fails on purpose) are left out: a reader
running the notebook sees them, but their timestamps and tracebacks are the
machine's. So is the elapsed time at the end of ``dask_coro.progress``'s bar:
the time a shared, loaded machine took is no claim about speed (benchmarks/
measures that).

A fresh run must show what the stored notebook shows (``comparable``): the
same outputs, the same text, apart from values that differ between runs by
design. Those are masked: object addresses and hex tokens (task keys,
segment names) everywhere, and what a cell's metadata lists under
``"varies"`` (regular expressions: a pid, how many calls work stealing took
from a worker). A cell whose metadata says ``"needs": ["dot"]`` shows
something else without that program (it says so), and is compared only
where the program is installed. Pictures are compared by kind only (a tree's
picture is labelled with compute times).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import pathlib
import re
import sys
import tempfile
from typing import Any

import nbformat
from nbclient import NotebookClient

NOTEBOOKS_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
MAX_OUTPUT = 20_000  # characters of one output (a tree's SVG is about 10,000)
PER_CELL_TIMEOUT = 100  # seconds

def _machine_paths() -> list[str]:
    """Directories of the machine running the notebooks that an output could
    name (a warning's file, a temporary directory, the checkout): a reader
    elsewhere has no use for them."""
    dirs = {sys.prefix, sys.base_prefix, os.path.expanduser("~"), tempfile.gettempdir(),
            str(NOTEBOOKS_DIR.parent), os.getcwd()}
    return sorted(d for d in dirs if len(d) > 1)  # not "/"


def notebooks() -> list[pathlib.Path]:
    return sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def execute(path: pathlib.Path, workdir: str) -> Any:
    """The notebook at ``path`` run top to bottom in a new kernel ("python3":
    ipykernel's kernel, this interpreter) with ``workdir`` as its working
    directory; the file itself is not touched. Raises nbclient's
    CellExecutionError if a cell fails."""
    nb = nbformat.read(path, as_version=4)
    metadata = copy.deepcopy(nb.metadata)
    client = NotebookClient(
        nb,
        timeout=PER_CELL_TIMEOUT,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": workdir}},
    )
    client.execute()
    nb.metadata = metadata  # not the kernel's language_info (its version, its paths)
    return nb


# A log record of distributed's (its default format): the record and the lines
# that continue it, up to the next record.
_LOG_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - distributed\.[\w.]+ - [A-Z]+ - .*?(?=^\d{4}-\d\d-\d\d |\Z)",
    re.M | re.S,
)


# The end of the bar's text (diagnostics.client._html): "..., roots 1/1, 2.2 s</code>"
_BAR_ELAPSED = re.compile(r"(roots \d+/\d+), [0-9.]+ s(</code>)")


def scrub(nb: Any) -> Any:
    """``nb`` without distributed's log records on stderr and without the
    elapsed time of progress bars (in place)."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                out["text"] = _LOG_RECORD.sub("", out.get("text", ""))
                if not out["text"].strip():
                    continue
            html = out.get("data", {}).get("text/html")
            if isinstance(html, str):
                out["data"]["text/html"] = _BAR_ELAPSED.sub(r"\1\2", html)
            kept.append(out)
        cell["outputs"] = kept
    return nb


# Values that differ between runs in every notebook: object addresses in a
# repr, and the hex tokens of task keys and shared-memory segment names.
_VARIES = [re.compile(r"0x[0-9a-f]+"), re.compile(r"\b[0-9a-f]{16,}\b")]
_TEXT = ("text/plain", "text/html", "text/markdown", "application/json")


def _masked(text: Any, masks: list[re.Pattern[str]]) -> str:
    text = text if isinstance(text, str) else json.dumps(text, sort_keys=True)
    for pattern in masks:
        text = pattern.sub("…", text)
    return text


def comparable(nb: Any, missing: frozenset[str] = frozenset()) -> list[Any]:
    """Per code cell, its outputs as (kind, text) pairs with the values that
    vary by design masked (see the module's docstring); None for a cell that
    needs a program in ``missing``. Consecutive pieces of one stream are
    joined: a print may come in one stream output or several."""
    out: list[Any] = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if set(cell.metadata.get("needs", [])) & missing:
            out.append(None)
            continue
        masks = [*(re.compile(p) for p in cell.metadata.get("varies", [])), *_VARIES]
        mask = functools.partial(_masked, masks=masks)
        items: list[tuple[str, str]] = []
        for o in cell.get("outputs", []):
            kind = o.get("output_type")
            if kind == "stream":
                if items and items[-1][0] == o["name"]:
                    items[-1] = (o["name"], items[-1][1] + mask(o["text"]))
                else:
                    items.append((o["name"], mask(o["text"])))
            elif kind == "error":
                items.append(("error", f"{o.get('ename')}: {mask(o.get('evalue', ''))}"))
            else:
                for mime, value in sorted(o.get("data", {}).items()):
                    items.append((mime, mask(value) if mime in _TEXT else ""))
        out.append(items)
    return out


def problems(nb: Any) -> list[str]:
    """Why the executed notebook ``nb`` should not be stored (empty if it may)."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("execution_count") is None:
            found.append(f"cell {i} did not run")
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "error":
                found.append(f"cell {i}: {out.get('ename')}: {out.get('evalue')}")
            if kind == "stream" and out.get("name") == "stderr":
                found.append(f"cell {i} wrote to stderr: {out.get('text', '')[:300]!r}")
            text = json.dumps(out)
            if len(text) > MAX_OUTPUT:
                found.append(f"cell {i}: an output of {len(text)} characters (at most {MAX_OUTPUT})")
            for d in _machine_paths():
                if (at := text.find(d)) >= 0:
                    found.append(f"cell {i}: a path of this machine: {text[max(at - 40, 0):at + len(d) + 40]!r}")
    return found


def store(path: pathlib.Path) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        nb = scrub(execute(path, workdir))
    bad = problems(nb)
    if bad:
        raise SystemExit(f"{path.name} not stored:\n  " + "\n  ".join(bad))
    nbformat.validate(nb)
    with open(path, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    print(f"stored {path.name}")


if __name__ == "__main__":
    # The notebooks document the shipped default: coroutine calls run inline.
    os.environ["DASK_CORO__INLINE__ENABLED"] = "True"
    for arg in sys.argv[1:] or [str(p) for p in notebooks()]:
        store(pathlib.Path(arg))
