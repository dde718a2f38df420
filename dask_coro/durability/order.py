"""The order a parent's groups delivered their children in (pure).

A group on a worker tells the scheduler, on its client's stream, the index
of each child it delivers, and its deadline when it opens
(``group/worker.py``); ``DurablePlugin`` keeps them here per parent key and
group number until the parent ends. A parent run again after its worker died
asks for them when it opens the same group (by number, in the order the body
opens them), and is given the same children in the same order before any
other, with the first run's deadline (Temporal made its ``wait`` and
``as_completed`` deterministic for this reason, sdk-python #429).
"""

from __future__ import annotations

from typing import Any


class DeliveryLog:
    """``parent -> group number -> {"deadline": float | None, "order": [index, ...]}``."""

    __slots__ = ("logs",)

    def __init__(self) -> None:
        self.logs: dict[Any, dict[int, dict[str, Any]]] = {}

    def record(self, parent: Any, group: int, index: int | None = None, deadline: float | None = None) -> None:
        """Group ``group`` of ``parent`` delivered child ``index``, or opened
        with ``deadline`` (kept once: the first run's)."""
        log = self.logs.setdefault(parent, {}).setdefault(group, {"deadline": None, "order": []})
        if deadline is not None and log["deadline"] is None:
            log["deadline"] = deadline
        if index is not None:
            log["order"].append(index)

    def get(self, parent: Any, group: int) -> dict[str, Any]:
        """What a run of ``parent`` opening group ``group`` replays."""
        log = self.logs.get(parent, {}).get(group)
        if log is None:
            return {"deadline": None, "order": []}
        return {"deadline": log["deadline"], "order": list(log["order"])}

    def end(self, parent: Any) -> None:
        """The parent ended (or was forgotten): nothing of it to replay."""
        self.logs.pop(parent, None)
