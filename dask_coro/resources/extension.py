"""Resources' hooks into the runtime (``runtime/extensions.py``).

Around each wait of a run whose task was given worker resources, they are
lent to the worker and taken back before its body goes on
(``worker.lent``), unless its function says ``keep_resources=True`` (an
option of ``@coroutine`` this extension declares, read from
``run.options``). No plugin is installed ahead: the first run that lends
installs ``ResourceLender`` on its worker and ``ResourcePlugin`` on the
scheduler (``worker.ResourceLender.install``).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from ..runtime.extensions import Extension, Run, register

T = TypeVar("T")

#: The ``@coroutine`` option: keep the task's resources while it waits.
KEEP = "keep_resources"


class ResourceExtension(Extension):
    name = "resources"
    what = "counts the resources waiting coroutines lent as free"
    options = (KEEP,)

    def check_option(self, name: str, value: Any) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"@coroutine({name}=...) expects True or False, got {value!r}")

    async def around_wait(self, run: Run, wait: Awaitable[T]) -> T:
        if run.options.get(KEEP):
            return await wait
        from .worker import lent

        return await lent(run.worker, run.key, wait, run.until)


RESOURCES = register(ResourceExtension())
