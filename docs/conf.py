"""Sphinx configuration of dask_coro's documentation.

Build from the repository's root (``pip install ".[docs]"`` first):

    sphinx-build -W --keep-going -c docs . docs/_build

The source folder is the repository itself, so that the Markdown files beside
the code (README.md, ARCHITECTURE.md, benchmarks/RESULTS.md, CHANGELOG.md) are
pages of the site and every relative link between them and docs/ works the
same on the site and in a repository browser. ``include_patterns`` keeps
everything else (tests, notebooks, a virtual environment in the clone) out.
"""

from __future__ import annotations

import dask_coro

project = "dask_coro"
release = version = dask_coro.__version__

extensions = [
    "myst_parser",  # Markdown pages, as the README is
    "sphinx.ext.autodoc",  # the API reference from the docstrings
    "sphinx.ext.napoleon",  # which are numpy-style
]

root_doc = "docs/index"
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
include_patterns = [
    "docs/**",
    "README.md",
    "ARCHITECTURE.md",
    "CHANGELOG.md",
    "benchmarks/RESULTS.md",
]
exclude_patterns = ["docs/_build/**"]

# GitHub's anchors (#inline-calls-and-work-stealing) for headings down to ###.
myst_heading_anchors = 3

napoleon_google_docstring = False
napoleon_numpy_docstring = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"

html_title = f"dask_coro {release}"
html_theme = "alabaster"
# Wide enough for the tables of configuration and misuse.
html_theme_options = {"page_width": "1100px", "sidebar_width": "240px"}


# The site's start page is docs/index.html (the pages keep their folders, see
# above); the build's root gets an index.html that sends a browser there, so
# the folder sphinx-build wrote opens at its root as any site does.
_START = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>dask_coro</title>
<meta http-equiv="refresh" content="0; url=docs/index.html"></head>
<body><p><a href="docs/index.html">dask_coro's documentation</a></p></body></html>
"""


def _write_start_page(app, exception):
    import os

    if exception is None and app.builder.format == "html":
        with open(os.path.join(app.outdir, "index.html"), "w", encoding="utf-8") as f:
            f.write(_START)


def setup(app):
    app.connect("build-finished", _write_start_page)
