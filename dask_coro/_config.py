"""dask_coro's settings: the ``coro`` namespace of ``dask.config``.

The defaults (``coro.yaml``, next to this module) are added to dask's at
``import dask_coro``, as distributed does with ``distributed.yaml``; a user's
YAML files, ``DASK_CORO__...`` environment variables and ``dask.config.set``
take precedence. Settings are read where they are used, when they are used.
``coro-schema.yaml`` describes each of them.
"""

from __future__ import annotations

import os
from typing import Any, overload

import dask.config
import yaml
from dask.utils import parse_timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS_FILE = os.path.join(HERE, "coro.yaml")
SCHEMA_FILE = os.path.join(HERE, "coro-schema.yaml")

with open(DEFAULTS_FILE) as f:
    defaults = yaml.safe_load(f)

dask.config.update_defaults(defaults)


def get(key: str) -> Any:
    """``dask.config.get(key)`` for a ``coro.*`` key, with coro.yaml's default
    if the key is gone from dask's config.

    It can be: ``distributed.utils_test.gen_cluster`` resets dask's config to
    a copy taken when ``distributed.utils_test`` was imported, which lacks the
    ``coro`` defaults if that was before ``import dask_coro``.
    """
    default: Any = defaults
    for part in key.split("."):
        default = default[part]  # KeyError: not one of ours
    return dask.config.get(key, default=default)


@overload
def get_timedelta(key: str) -> float: ...
@overload
def get_timedelta(key: str, *, allow_none: bool) -> float | None: ...
def get_timedelta(key: str, *, allow_none: bool = False) -> float | None:
    """The setting ``key`` (``"coro.lifetimes.retry-delay"``) in seconds.

    A string takes a unit (``"500ms"``, ``"10s"``), a bare number is seconds.
    With ``allow_none``, null gives None. Anything else that is not a time
    interval of zero or more raises a ValueError naming the key.
    """
    value = get(key)
    if value is None and allow_none:
        return None
    error = ValueError(f"{key}: {value!r} is not a time interval")
    if value is None or isinstance(value, bool):
        raise error
    try:
        seconds = parse_timedelta(value, default="seconds")
    except Exception as e:  # ValueError, KeyError (unit), AttributeError (type)
        raise error from e
    if not isinstance(seconds, (int, float)) or not seconds >= 0:  # also NaN
        raise error
    return float(seconds)


def get_choice(key: str, choices: tuple[str, ...]) -> str:
    """The setting ``key``, one of ``choices``; anything else raises a
    ValueError naming the key and the choices."""
    value = get(key)
    if value not in choices:
        raise ValueError(f"{key}: {value!r} is not one of {', '.join(choices)}")
    return str(value)
