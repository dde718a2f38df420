"""The documentation in docs/: the API reference covers the public names, and
the pages speak of this project only. CI builds the site with warnings as
errors (.ci/run), which checks every link and the table of contents."""

from __future__ import annotations

import pathlib
import re

import dask_coro

ROOT = pathlib.Path(__file__).parents[2]
DOCS = ROOT / "docs"


def test_api_reference_documents_every_public_name():
    api = (DOCS / "api.md").read_text()
    documented = set(re.findall(r"^\.\. auto(?:function|class|exception|data):: dask_coro\.(\w+)$", api, re.M))
    assert documented == set(dask_coro.__all__)


def test_every_page_is_in_the_table_of_contents():
    index = (DOCS / "index.md").read_text()
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index"}
    listed = set(re.findall(r"^([\w-]+)$", index, re.M))
    assert pages <= listed, pages - listed


def test_pages_name_public_sources_only():
    # Words a reader cannot follow: which issue, which seed? Public sources
    # are cited by name, e.g. dask/distributed #1663.
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)!r}"
        for p in pages
        for m in re.finditer(r"\bthe (issue|seed)('s)?\b", p.read_text(), re.I)
    ]
    assert found == []


def test_architecture_names_only_files_and_folders_that_exist():
    """Every file or folder ARCHITECTURE.md names (in backticks, or in its
    layout of the package) is there: relative to the repository, the package,
    or a folder of it. distributed's own folders it compares with are not ours."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`([\w./-]+)`", text))
    named |= set(re.findall(r"(?<![\w./-])([\w./-]+(?:/|\.py|\.c|\.md|\.yaml))(?![\w/])", text))
    package = ROOT / "dask_coro"
    bases = [ROOT, package, *(p for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    paths = {n.rstrip(".,;:") for n in named if "/" in n or re.search(r"\.(py|c|md|yaml)$", n)}
    missing = sorted(p for p in paths if not any((b / p).exists() for b in bases))
    assert missing == ["shuffle/"]  # distributed's, which the layout is modelled on
