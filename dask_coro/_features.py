"""The extensions ``import dask_coro`` registers: the one place that names
the features, above the runtime (``runtime/extensions.py``).

Each import registers one extension. The order is the order the preload
installs their plugins in (``dask_setup``) and a worker's first coroutine
installs those it waits for.

To add a feature: give it a folder with an ``extension.py`` that registers
its ``Extension`` (docs/development.md, "How to add a feature"), and import
that module here.
"""

from __future__ import annotations

# isort: off
# The order is the order of installs.
from .promise import extension as promise
from .lifetimes import extension as lifetimes
from .diagnostics import extension as diagnostics
from .durability import extension as durability
from .runtime import stealing
from .release import extension as release
from .stream import extension as stream
from .resources import extension as resources
from .groups import extension as groups
from .durable import extension as durable

# isort: on

__all__ = ["diagnostics", "durability", "durable", "groups", "lifetimes", "promise", "release", "resources", "stealing", "stream"]
