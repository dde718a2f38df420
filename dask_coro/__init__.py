"""dask_coro: coroutine tasks for Dask distributed."""

from __future__ import annotations

from ._api import CoroutineCall as CoroutineCall
from ._api import CoroutineFunction as CoroutineFunction
from ._api import coroutine as coroutine
from ._api import gather as gather
from ._context import current_key as current_key
from ._exceptions import BadYieldError as BadYieldError
from ._exceptions import CoroutineCancelledError as CoroutineCancelledError
from ._exceptions import DaskCoroError as DaskCoroError
from ._exceptions import NotInTaskError as NotInTaskError
from ._exceptions import PromiseError as PromiseError
from ._promise import Promise as Promise

__version__ = "0.1.0"

__all__ = [
    "BadYieldError",
    "CoroutineCall",
    "CoroutineCancelledError",
    "CoroutineFunction",
    "DaskCoroError",
    "NotInTaskError",
    "Promise",
    "PromiseError",
    "coroutine",
    "current_key",
    "gather",
]
