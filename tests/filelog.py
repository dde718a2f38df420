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


async def ticks_after_cancel(s, workers, folder) -> int:
    """After a cancellation: wait until nothing is left on the scheduler or
    the workers, then check that no task records a line in ``ticks`` any
    more (not a timing assertion: nothing may happen in the 0.5 s). Returns
    how many ticks were recorded."""
    import asyncio

    from distributed.utils_test import async_poll_for

    await async_poll_for(
        lambda: not s.tasks,
        timeout=20,
        fail_func=lambda: print({k: v.state for k, v in s.tasks.items()}),
    )
    await async_poll_for(lambda: not any(w.state.tasks for w in workers), timeout=20)
    n = len(lines(folder, "ticks"))
    await asyncio.sleep(0.5)
    assert len(lines(folder, "ticks")) == n
    return n
