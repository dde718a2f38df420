"""``distributed.batched``: ``BatchedSend``, the stream that batches messages
between a worker or client and the scheduler.
"""

from __future__ import annotations

from typing import Any


def flush_stream(stream: Any) -> None:
    """Have a ``BatchedSend`` send what it holds on the event loop's next
    turn. ``BatchedSend._background_send`` sends a message at once only when
    the stream sent nothing in the last ``interval``; otherwise it waits for
    ``next_deadline``, the end of the interval that began with the last batch.
    Clearing the deadline and waking the sender sends now (one batch more);
    the order of messages is kept. Call on the stream's event loop."""
    if stream is None or stream.comm is None or not stream.buffer:
        return
    stream.next_deadline = None
    stream.waker.set()
