"""What a group's ``next()``, ``all()`` and ``aclose()`` return."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.engine import InPlace

#: The group (``api.Group``; not imported: it imports this module).
_Group = Any


class Request(InPlace):
    """What ``next()``, ``all()`` and ``aclose()`` return: in a body, the
    engine runs ``fn(group)`` here (``InPlace``); from plain code on a
    client, ``dask_coro.result`` calls ``__dask_coro_result__``."""

    __slots__ = ("outside",)

    def __init__(self, fn: Callable[..., Any], group: _Group, outside: Callable[[], Any] | None = None):
        super().__init__(fn, group)
        self.outside = outside

    def __dask_coro_result__(self) -> Any:
        if self.outside is None:
            raise RuntimeError(
                "a group opened in a coroutine body is waited for inside it: yield or "
                "await g.next(), or call dask_coro.result(g.next()) in that body"
            )
        return self.outside()

    def __repr__(self) -> str:
        return f"<group request {getattr(self.__dask_coro_args__[0], 'name', '')}>"
