"""The pure part of a stream (``dask_coro/stream/book.py``)."""

from __future__ import annotations

import pytest

from dask_coro.stream.book import Replay, StreamBook, item_key


def test_item_keys_derive_from_the_producers_key():
    assert item_key("squares-abc", 3) == ("squares-abc-item", 3)
    assert item_key(("run", "stream", 0), 0) == ("('run', 'stream', 0)-item", 0)
    assert item_key("p", 1) != item_key("q", 1)


def test_room_holds_the_producer_at_buffer_items_not_taken():
    b = StreamBook("p")
    for i in range(3):
        assert b.room(i, 3)
        assert b.publish(i, f"t{i}")
    assert not b.room(3, 3)  # items 0..2 not taken
    assert b.room(3, None)  # no buffer: never held
    assert b.take(1) == [item_key("p", 0)]  # item 0 taken and let go of
    assert b.room(3, 3) and not b.room(4, 3)
    assert b.ready(1) == [item_key("p", 1), item_key("p", 2)]


def test_a_rerun_skips_what_it_published_and_refuses_a_different_item():
    b = StreamBook("p")
    assert b.publish(0, "a") and b.publish(1, "b")
    assert not b.publish(0, "a")  # the re-run's first item: published already
    with pytest.raises(Replay, match="index 1"):
        b.publish(1, "other")
    assert b.publish(2, "c")
    with pytest.raises(ValueError, match="before item 3"):
        b.publish(5, "f")
    assert sorted(b.let_go()) == [item_key("p", i) for i in range(3)]
