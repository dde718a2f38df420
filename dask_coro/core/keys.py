"""Keys of the tasks a coroutine submits (pure: no dask, no distributed).

A child's key has two parts, ``<prefix>-<slot>-<content>``:

slot
    32 hex digits (``slot_of``) derived from the parent's key, the yield's index and the
    leaf's position (for tasks below a leaf, their depth-first position
    under it). A parent that re-runs after its worker died submits the same
    slots again: deterministic replay, as Temporal and Durable Functions do.
content
    16 hex digits of a token of the task itself (its function, its
    arguments and, through their keys, everything below it). A re-run that
    yields the same calls finds the first run's children by key; one that
    yields other calls at a slot gets other keys, so the first run's results
    are never mixed with the second's, and the slot tells that the body is
    not deterministic (``slot_of``).

The prefix (``fib`` in ``fib-1f0c...``) is the original key's, so the
dashboard groups tasks as before (``dask.utils.key_split`` stops at the
first word with a digit or of 8 hex letters).

Only keys dask made are renamed so; a key the user chose is kept
(``named_by_user``): ``dask_key_name="my-inc"``, ``Delayed("my-inc", graph)``,
``dask.delayed(obj, name=...)``. dask names what it makes ``<name>-<token>``:
``tokenize`` gives 32 hex digits (an md5), an impure ``dask.delayed`` call a
``uuid4`` (``dask.delayed.tokenize(pure=False)``, 36 characters with dashes),
a coroutine call ``<prefix>-<token or uuid4 hex>``, a collection's key
``(name, i, ...)`` with such a name. A key ending so, or one of ours
(``child_key``), is taken as dask's; any other (another ending, a number, a
tuple whose first item is not such a string) as the user's. The one false
reading: a name the user chose that itself ends in ``-`` and 32 hex digits
(``"data-" + tokenize(x)``, as dask's docs suggest for ``delayed(obj,
name=...)``) is taken as dask's and renamed, which changes its name only.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the type checker only: this module does not import dask
    from dask.typing import Key

_CHILD = re.compile(r"-[0-9a-f]{32}-[0-9a-f]{16}\Z")
_TOKEN = re.compile(
    r"-(?:[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\Z"
)


def derive_key(prefix: str, *parts: Any) -> str:
    """A short deterministic key ``prefix-<hex>`` from ``parts`` (reprs of
    strings, numbers and tuples of them are stable across processes)."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()
    return f"{prefix}-{h}"


def child_key(slot: str, content: str) -> str:
    """The key of a child at ``slot`` (a ``derive_key``) whose task has the
    token ``content``."""
    return f"{slot}-{hashlib.blake2b(content.encode(), digest_size=8).hexdigest()}"


def slot_of(key: Key) -> str | None:
    """The slot of a child's key (``child_key``): its 32 hex digits of place,
    whatever its prefix (a re-run may call another function there); None
    for any other key."""
    if isinstance(key, str) and _CHILD.search(key):
        return key[-49:-17]
    return None


def named_by_user(key: Key) -> bool:
    """Whether ``key`` is one the user chose, to keep as it is, rather than
    one dask made (a name ending in a token), which a coroutine's child gets
    renamed from (see the module's docstring)."""
    name = key[0] if type(key) is tuple and key else key
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    if not isinstance(name, str):
        return True
    return not (_TOKEN.search(name) or _CHILD.search(name))
