"""``distributed.core``: the handlers of a ``Server`` (scheduler or worker),
for RPCs and batched-stream messages, and how a wrapper stands in for one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from distributed.utils import iscoroutinefunction


def add_handlers(
    server: Any,
    rpc: dict[str, Callable[..., Any]] | None = None,
    stream: dict[str, Callable[..., Any]] | None = None,
) -> None:
    """Answer RPCs (``Server.handlers``) and batched-stream messages
    (``Server.stream_handlers``) of these names."""
    server.handlers.update(rpc or {})
    if stream:
        server.stream_handlers.update(stream)


def keeping_contract(original: Callable[..., Any], wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper``, which stands in for ``original`` (a handler or a method
    of distributed), made to look like it to distributed: the same signature
    (``inspect.signature`` follows ``__wrapped__``), name and docstring.

    distributed decides how to call a handler by inspecting it:
    ``Server.handle_comm`` passes the comm if its first parameter is named
    ``comm`` (``distributed.core._expects_comm``) and passes the asking side's
    ``serializers`` back in only if it has that keyword
    (``distributed.utils.has_keyword``); ``Server.handle_stream`` awaits a
    stream handler only if it is a coroutine function
    (``distributed.utils.iscoroutinefunction``). A wrapper taking
    ``**kwargs`` would hide ``serializers``, and a client that refuses pickle
    would get its results pickled. So the signature is the original's, and a
    wrapper that is not async where the original is (or the reverse) is
    refused. ``updated=()``: the original's attributes (another wrapper's
    mark) are not copied onto this one."""
    if _is_async(wrapper) != _is_async(original):
        raise TypeError(
            f"{wrapper!r} stands in for {original!r}: both must be coroutine functions, or neither"
        )
    return functools.update_wrapper(wrapper, original, updated=())


def _is_async(f: Callable[..., Any]) -> bool:
    return bool(iscoroutinefunction(f))


def _wrap_handler(table: dict[str, Any], op: str, wrap: Callable[[Any], Any], mark: str) -> None:
    """Replace ``table[op]`` by ``wrap(table[op])``, once (``mark`` names the
    attribute that says it is wrapped already), keeping the handler's
    contract (``keeping_contract``)."""
    handler = table.get(op)
    if handler is None or getattr(handler, mark, False):
        return
    wrapped = keeping_contract(handler, wrap(handler))
    setattr(wrapped, mark, True)
    table[op] = wrapped


def wrap_stream_handler(server: Any, op: str, wrap: Callable[[Any], Any], mark: str) -> None:
    """Replace the stream handler of ``op`` (``Server.stream_handlers``) by
    ``wrap(handler)``, once."""
    _wrap_handler(server.stream_handlers, op, wrap, mark)


def wrap_rpc_handler(server: Any, op: str, wrap: Callable[[Any], Any], mark: str) -> None:
    """Replace the RPC handler of ``op`` (``Server.handlers``) by
    ``wrap(handler)``, once."""
    _wrap_handler(server.handlers, op, wrap, mark)
