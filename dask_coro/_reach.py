"""Reaching the scheduler the command line is given (``python -m dask_coro
--address``): every way an address can be wrong ends in one sentence naming
what answers there, within a time limit.

``distributed.Client`` retries a refused connection until its timeout, but
does not bound the handshake that follows (``distributed.comm.core.connect``
writes its own and waits for the server's with no limit), so an HTTP server,
which waits for a request line, holds it forever; and it reads the first
eight bytes a server sends as the length of a message, which from a server
sending text is exabytes (a ``MemoryError``). So before the client is made,
``reach`` asks the address for its identity under ``asyncio.wait_for``, and
when that fails, looks at the raw bytes the server sends (``_sniff``) to say
what it is.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from typing import Any


class Unreachable(Exception):
    """The address is not a scheduler this process can use; the message is
    one line saying which address and what was found there."""


async def reach(address: str, security: Any, timeout: float) -> None:
    """Return if a Dask scheduler answers at ``address`` with ``security``
    (a ``distributed.Security``) within about ``timeout`` seconds; else raise
    ``Unreachable``."""
    import distributed.comm
    from distributed.comm import CommClosedError, get_address_host_port, parse_address
    from distributed.comm.core import FatalCommClosedError
    from distributed.comm.registry import get_backend

    cannot = f"cannot reach a scheduler at {address}"
    try:
        scheme, loc = parse_address(address)
        get_backend(scheme)
        if scheme in ("tcp", "tls", "ws", "wss"):
            get_address_host_port(address)  # a port is required
    except ValueError as e:
        raise Unreachable(f"{address!r} is not a scheduler address: {e}") from None
    args = security.get_connection_args("client")
    if scheme in ("tls", "wss") and args.get("ssl_context") is None:
        raise Unreachable(
            f"{address} is a TLS address, and no TLS credentials are given: pass "
            "--tls-ca-file, --tls-cert and --tls-key, or set distributed.comm.tls "
            "in the Dask configuration"
        )
    if scheme not in ("tls", "wss") and args.get("require_encryption"):
        raise Unreachable(
            f"{address} is not a TLS address, and encryption is required (TLS "
            "credentials are given, or distributed.comm.require-encryption is set): "
            "use tls://"
        )

    # The sniff, if needed, gets the last fifth (at most a second); distributed's
    # own connect gives up a little before the whole probe does, so that a
    # timeout of the probe means a connection that was made and then got no
    # handshake, and an OSError from connect one that was never made.
    sniff_budget = min(1.0, timeout / 5)
    probe_budget = timeout - sniff_budget
    comm = None

    async def identity() -> Any:
        nonlocal comm
        loop = asyncio.get_running_loop()
        start = loop.time()
        connect_budget = probe_budget * 0.9
        try:
            # One try of the scheme's connector first: distributed's connect
            # retries a refused connection until its timeout, but here a
            # refusal is the answer (nothing listens), known at once. A first
            # try's share of the time is the one distributed gives it
            # (distributed.comm.core.connect: a fifth).
            comm = await asyncio.wait_for(
                get_backend(scheme).get_connector().connect(loc, deserialize=True, **args),
                connect_budget / 5,
            )
        except FatalCommClosedError:
            raise
        except (OSError, asyncio.TimeoutError) as e:
            if _cause(e, ConnectionRefusedError) is not None:
                raise _Refused from e
            # anything else may pass (a name not resolved yet, a slow accept):
            # distributed's connect, with its retries, for the time left
            comm = await distributed.comm.connect(
                address, timeout=connect_budget - (loop.time() - start), **args
            )
        else:
            await _handshake(comm)
        await comm.write({"op": "identity", "reply": True})
        return await comm.read()

    try:
        try:
            info = await asyncio.wait_for(identity(), probe_budget)
        finally:
            if comm is not None:
                comm.abort()
    except _Refused:
        raise Unreachable(f"{cannot}: nothing listens there (connection refused)") from None
    except FatalCommClosedError as e:
        tls = _cause(e, ssl.SSLError)
        if isinstance(tls, ssl.SSLCertVerificationError):
            raise Unreachable(
                f"{cannot}: the TLS handshake failed: {tls.verify_message} (is "
                "--tls-ca-file the CA that signed the scheduler's certificate?)"
            ) from None
        detail = f": {tls.reason or tls}" if tls is not None else ""
        found = await _sniff(address, scheme, sniff_budget)
        raise Unreachable(f"{cannot}: the TLS handshake failed{detail}; {found}") from None
    except CommClosedError:
        found = await _sniff(address, scheme, sniff_budget)
        raise Unreachable(f"{cannot}: the server closed the connection at Dask's handshake; {found}") from None
    except (TimeoutError, asyncio.TimeoutError):  # asyncio's is the builtin from 3.11
        found = await _sniff(address, scheme, sniff_budget)
        raise Unreachable(
            f"{cannot}: a server accepted the connection but sent no Dask handshake "
            f"in {probe_budget:.1f} s; {found}"
        ) from None
    except OSError as e:  # distributed's connect gave up: the connection was never made
        # distributed retries a refused connection until its timeout; on a
        # loaded machine its last try may end in a timeout instead, so ask once
        # more, plainly, whether the port refuses.
        if _cause(e, ConnectionRefusedError) is not None or await _refuses(address, sniff_budget):
            raise Unreachable(f"{cannot}: nothing listens there (connection refused)") from None
        if (gai := _cause(e, socket.gaierror)) is not None:
            raise Unreachable(f"{cannot}: its host name does not resolve ({gai})") from None
        cause = e.__cause__ or e
        detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        raise Unreachable(f"{cannot}: no connection in {probe_budget:.1f} s ({detail})") from None
    except Exception:  # what the server sent is not a Dask message (MemoryError, ValueError ...)
        found = await _sniff(address, scheme, sniff_budget)
        raise Unreachable(f"{cannot}: the server answers in another protocol; {found}") from None
    kind = info.get("type") if isinstance(info, dict) else None
    if kind != "Scheduler":
        what = f"a Dask {kind}" if isinstance(kind, str) else "a Dask server"
        raise Unreachable(f"{cannot}: {what} answers there, not a scheduler")


class _Refused(Exception):
    """The first try to connect was refused."""


async def _handshake(comm: Any) -> None:
    """Dask's handshake on a connection a connector made, as
    ``distributed.comm.core.connect`` does after its connector's try: each
    side writes its handshake info and reads the other's, which sets the
    options (compression, pickle protocol) later messages are written with."""
    local_info = comm.handshake_info()
    await comm.write(local_info)
    handshake = await comm.read()
    comm.remote_info = {**handshake, "address": comm.peer_address}
    comm.local_info = {**local_info, "address": comm.local_address}
    comm.handshake_options = comm.handshake_configuration(local_info, handshake)


def _cause(e: BaseException, kind: type) -> Any:
    """The first exception of type ``kind`` in ``e``'s chain of causes."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, kind):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


async def _sniff(address: str, scheme: str, budget: float) -> str:
    """What the server at ``address`` is, from what it does on plain TCP
    connections in ``budget`` seconds: a Dask server speaks first (its
    handshake, eight bytes of length first); to a silent one, send an HTTP
    request, and if no HTTP reply comes, try a TLS handshake."""
    from distributed.comm import get_address_host_port

    try:
        host, port = get_address_host_port(address)
    except ValueError:
        return "it is not a TCP address"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget

    def left(share: float = 1.0) -> float:
        return max((deadline - loop.time()) * share, 0.01)

    async def read(reader: asyncio.StreamReader, timeout: float) -> bytes | None:
        try:
            return await asyncio.wait_for(reader.read(64), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            return None  # silent
        except OSError:
            return b""  # reset: closed

    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), left())
    except (OSError, asyncio.TimeoutError):
        return "it accepts no second connection"
    try:
        first = await read(reader, left(1 / 4))
        if first:
            return _what(first, scheme)
        if first is not None:
            return "it closes a connection without a byte"
        writer.write(f"GET / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        reply = await read(reader, left(1 / 2))
    finally:
        writer.close()
    if reply:  # an HTTP reply, a TLS alert, or what a slow server sends first
        return _what(reply, scheme)
    if scheme not in ("tls", "wss") and await _speaks_tls(host, port, left()):
        return "it is a TLS server: use a tls:// address, with TLS credentials"
    return "it sends nothing, and answers no HTTP request"


async def _refuses(address: str, budget: float) -> bool:
    """Whether a plain TCP connection to ``address`` is refused within ``budget`` s."""
    from distributed.comm import get_address_host_port

    try:
        host, port = get_address_host_port(address)
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), budget)
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError, asyncio.TimeoutError):
        return False
    writer.close()
    return False


def _what(data: bytes, scheme: str) -> str:
    """What a server is that sent ``data`` first (or in reply to an HTTP request)."""
    if data.startswith(b"HTTP/"):
        status = data.split(b"\r\n", 1)[0].decode("latin-1")
        return (
            f"it is an HTTP server (it answers {status[:60]}): a dashboard's port? The "
            "scheduler's address is the one its log shows as 'Scheduler at'"
        )
    if data[:2] == b"\x15\x03":  # a TLS alert record
        return "it is a TLS server: use a tls:// address, with TLS credentials"
    if len(data) >= 8 and 0 < struct.unpack("<Q", data[:8])[0] < 2**20:  # Dask's framing
        if scheme in ("tls", "wss"):
            return "it speaks Dask's protocol without TLS: use a tcp:// address"
        return "it speaks what looks like Dask's protocol, but not as a scheduler does"
    return f"it sends {data[:16]!r}"


async def _speaks_tls(host: str, port: int, timeout: float) -> bool:
    """Whether a TLS handshake with no certificates checked gets a TLS answer:
    the handshake completes, or the server refuses it with a TLS alert."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx), timeout)
    except ssl.SSLError as e:
        return "ALERT" in (e.reason or "")
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True
