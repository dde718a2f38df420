"""dask_coro's settings: the ``coro`` namespace of ``dask.config``.

The defaults (``coro.yaml``, next to this module) are added to dask's at
``import dask_coro``, as distributed does with ``distributed.yaml``; a user's
YAML files, ``DASK_CORO__...`` environment variables and ``dask.config.set``
take precedence. Settings are read where they are used, when they are used.
``coro-schema.yaml`` describes each of them, and ``check`` holds every value
to it, where a computation starts (the runners call it), so a bad value
fails the computation that would use it with a ``ValueError`` naming the
setting and the value, raised at the client, rather than being logged in a
background task.
"""

from __future__ import annotations

import copy
import difflib
import os
from typing import Any, overload

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS_FILE = os.path.join(HERE, "coro.yaml")
SCHEMA_FILE = os.path.join(HERE, "coro-schema.yaml")

with open(DEFAULTS_FILE) as f:
    defaults = yaml.safe_load(f)

with open(SCHEMA_FILE) as f:
    schema = yaml.safe_load(f)

dask.config.update_defaults(defaults)


def _leaves(entry: dict[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, sub in entry["properties"].items():
        if sub.get("type") == "object" and "properties" in sub:
            out.update(_leaves(sub, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = sub
    return out


#: Every setting, ``"coro.inline.interval"``, with its schema entry.
SETTINGS = _leaves(schema, "")


def defaults_of(key: str) -> Any:
    """The default of setting ``key`` (coro.yaml's)."""
    default: Any = defaults
    for part in key.split("."):
        default = default[part]  # KeyError: not one of ours
    return default


def get(key: str) -> Any:
    """``dask.config.get(key)`` for a ``coro.*`` key, with coro.yaml's default
    if the key is gone from dask's config.

    It can be: ``distributed.utils_test.gen_cluster`` resets dask's config to
    a copy taken when ``distributed.utils_test`` was imported, which lacks the
    ``coro`` defaults if that was before ``import dask_coro``.
    """
    return dask.config.get(key, default=defaults_of(key))


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
    return _seconds(key, value)


def _seconds(key: str, value: Any) -> float:
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


def get_size_or_fraction(key: str) -> int | float | None:
    """The setting ``key`` (``"coro.durability.hold-bytes"``): a size in
    bytes (an integer, or a string with a unit, ``"64MiB"``) as an int, a
    fraction of a worker's memory (a number above 0 and at most 1 with a
    point, ``0.05``) as a float, or None for null (no bound). Anything else
    raises a ValueError naming the key."""
    value = get(key)
    return None if value is None else _size_or_fraction(key, value)


def get_size(key: str) -> int | None:
    """The setting ``key`` (``"coro.durability.store-bytes"``): a size in
    bytes (an integer, or a string with a unit, ``"1GiB"``), or None for
    null (no bound). Anything else raises a ValueError naming the key."""
    value = get(key)
    return None if value is None else _size(key, value)


def _size(key: str, value: Any) -> int:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            size = _size_or_fraction(key, value)
        except ValueError:
            pass
        else:
            return int(size)
    raise ValueError(f"{key}: {value!r} is not a size in bytes (an integer, or a string such as '1GiB') or null (no bound)")


def _size_or_fraction(key: str, value: Any) -> int | float:
    error = ValueError(
        f"{key}: {value!r} is not a size in bytes (an integer, or a string such as '64MiB'), "
        "a fraction of a worker's memory (a number above 0 and at most 1) or null (no bound)"
    )
    if isinstance(value, bool):
        raise error
    if isinstance(value, int):
        if value < 0:
            raise error
        return value
    if isinstance(value, float):
        if not 0 < value <= 1:  # also NaN
            raise error
        return value
    if isinstance(value, str):
        try:
            size = parse_bytes(value)
        except Exception as e:  # ValueError (number), KeyError (unit)
            raise error from e
        if not size >= 0:
            raise error
        return int(size)
    raise error


def get_choice(key: str, choices: tuple[str, ...]) -> str:
    """The setting ``key``, one of ``choices``; anything else raises a
    ValueError naming the key and the choices."""
    value = get(key)
    if value not in choices:
        raise ValueError(f"{key}: {value!r} is not one of {', '.join(choices)}")
    return str(value)


#: JSON schema types, as Python types (a bool is no number here).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
    "object": (dict,),
    "array": (list, tuple),
}


def check_value(key: str, value: Any) -> None:
    """Raise a ValueError naming ``key`` and ``value`` unless the value is
    one ``coro-schema.yaml`` allows for the setting ``key``: its ``type``,
    ``enum`` and ``minimum``, ``format: time-interval`` (what
    ``get_timedelta`` reads), ``format: size-or-fraction`` (what
    ``get_size_or_fraction`` reads) and ``format: size`` (``get_size``)."""
    entry = SETTINGS[key]
    types = entry["type"] if isinstance(entry["type"], list) else [entry["type"]]
    if value is None and "null" in types:
        return
    if entry.get("format") == "time-interval":
        _seconds(key, value)
    elif entry.get("format") == "size-or-fraction":
        _size_or_fraction(key, value)
    elif entry.get("format") == "size":
        _size(key, value)
    elif "enum" in entry:
        if value not in entry["enum"]:
            raise ValueError(f"{key}: {value!r} is not one of {', '.join(map(str, entry['enum']))}")
    elif types == ["boolean"]:
        if not isinstance(value, bool):
            raise ValueError(
                f"{key}: {value!r} is not true or false (in an environment "
                "variable, write True or False)"
            )
    elif types == ["integer"]:
        low = entry.get("minimum", 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{key}: {value!r} is not a whole number of {low} or more")
    else:  # any other entry: its JSON types, and its minimum
        ok = any(
            isinstance(value, _JSON_TYPES[t]) and not (isinstance(value, bool) and t != "boolean")
            for t in types
        )
        low = entry.get("minimum")
        if ok and low is not None and isinstance(value, (int, float)) and not value >= low:
            ok = False
        if not ok:
            bound = f" of {low} or more" if low is not None else ""
            raise ValueError(f"{key}: {value!r} is not a {' or '.join(types)}{bound}")


def get_checked(key: str) -> Any:
    """The setting ``key``, held to the schema (``check_value``)."""
    value = get(key)
    check_value(key, value)
    return value


def _unknown(config: Any, prefix: str) -> list[str]:
    """Keys under ``config`` (the ``coro`` part of dask's) no setting has."""
    out = []
    for name, value in config.items():
        key = f"{prefix}{str(name).replace('_', '-')}"
        if key in SETTINGS:
            continue
        if isinstance(value, dict) and any(k.startswith(key + ".") for k in SETTINGS):
            out.extend(_unknown(value, key + "."))
        else:
            out.append(key)
    return out


#: The ``coro`` part of dask's configuration last found valid (a copy).
_valid: list[Any] = [None]


def check() -> None:
    """Check every ``coro.*`` setting in effect here against the schema.

    Raises a ValueError naming the first bad setting and its value, or a key
    under ``coro`` that is no setting (a misspelling would otherwise be
    ignored, and its default used). Cheap when nothing changed since the last
    check (one comparison of the ``coro`` dicts): the runners call it at the
    start of each coroutine task.
    """
    now = dask.config.config.get("coro")
    if now == _valid[0]:
        return
    if isinstance(now, dict):
        unknown = _unknown(now, "coro.")
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(key, SETTINGS, n=1, cutoff=0.85)
            hint = f"; did you mean {close[0]}?" if close else f"; the settings are {', '.join(SETTINGS)}"
            raise ValueError(f"{key} is not a dask_coro setting{hint}")
    for key in SETTINGS:
        check_value(key, get(key))
    _valid[0] = copy.deepcopy(now)
