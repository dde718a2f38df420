"""Lines in files under a test's tmp_path: how tasks in worker processes tell
the test what they did (importable by workers: the tests folder is on their
path, see conftest.py)."""

from __future__ import annotations

from pathlib import Path


def append(folder: str, name: str, line: str) -> None:
    with open(Path(folder, name), "a") as f:
        f.write(line + "\n")


def lines(folder, name: str) -> list[str]:
    p = Path(folder, name)
    return p.read_text().splitlines() if p.exists() else []
