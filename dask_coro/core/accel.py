"""Which engine runs: the compiled one (``_cengine``, C) where it was built,
else the pure one; ``DASK_CORO_PURE=1`` in the environment forces the pure
one (read once, when dask_coro is first imported).

The pure engine is the reference: ``engine.Trampoline._steps`` and
``runtime.call.CoroutineFunction.__call__`` are complete in Python. The
compiled engine holds no state and no data layout of its own. It runs the
common case of both (an inline call of plain arguments, a generator body
that yields a list or tuple of such calls, or returns) on the very objects of
the pure code (``engine.Frame``, ``CoroutineCall``: it reads and writes their
slots), and hands everything else to the pure code between two steps.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

#: The environment variable that forces the pure engine.
PURE_ENV = "DASK_CORO_PURE"


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(PURE_ENV, "").strip() not in ("", "0"):
        return None, f"{PURE_ENV} is set"
    try:
        from . import _cengine
    except ImportError as e:  # not built: no C compiler where it was installed
        return None, f"the compiled engine is not built ({e})"
    return _cengine, "built"


cengine: ModuleType | None
cengine, why = _load()
#: "compiled" or "pure": the engine in use (``dask_coro.engine``).
ENGINE = "pure" if cengine is None else "compiled"
#: The call type the compiled loop runs (``setup_calls``), or None.
call_type: Any = None


def describe() -> str:
    """One line: which engine runs, and why (``python -m dask_coro`` prints it)."""
    if cengine is None:
        return f"engine: pure ({why})"
    return f"engine: compiled ({cengine.__file__})"
