"""The pure part of a group (``dask_coro.groups.book``): limit, completion
order, replay, cancellation; no cluster."""

from __future__ import annotations

import pytest

from dask_coro.groups.book import CANCELLED, DELIVERED, DONE, QUEUED, STARTED, GroupBook


def test_limit_queues_and_starts_in_spawn_order():
    b = GroupBook(limit=2)
    started = [b.spawn(None, i) for i in range(5)]
    assert [s for _, s in started] == [True, True, False, False, False]
    c = [ch for ch, _ in started]
    assert [x.state for x in c] == [STARTED, STARTED, QUEUED, QUEUED, QUEUED]
    assert b.started == 2 and len(b) == 5
    # One finishes: the oldest queued starts in its place, holding nothing before.
    assert b.finished(c[1], True, "v1") == [c[2]]
    assert c[2].state == STARTED and b.started == 2
    assert c[1].obj is None and c[1].outcome == (True, "v1")


def test_take_is_completion_order():
    b = GroupBook()
    c = [b.spawn(None, i)[0] for i in range(3)]
    assert b.take() is None
    b.finished(c[2], True, 2)
    b.finished(c[0], False, ValueError("x"))
    assert b.take() is c[2]
    assert c[2].state == DELIVERED
    assert b.take() is c[0]
    assert b.take() is None
    assert len(b) == 1 and b.delivered == [2, 0]


def test_replay_delivers_the_recorded_order_first():
    b = GroupBook(replay=[2, 0])
    c = [b.spawn(None, i)[0] for i in range(4)]
    b.finished(c[0], True, 0)
    b.finished(c[3], True, 3)
    assert b.take() is None  # the replay waits for child 2, whatever finished
    assert b.replaying() is c[2]
    b.finished(c[2], True, 2)
    assert b.take() is c[2]
    assert b.take() is c[0]
    # Past the replay: completion order (3 finished before 1).
    b.finished(c[1], True, 1)
    assert b.take() is c[3]
    assert b.take() is c[1]


def test_replay_waits_for_a_child_not_spawned_yet():
    b = GroupBook(replay=[1])
    c0 = b.spawn(None, 0)[0]
    b.finished(c0, True, 0)
    assert b.take() is None
    c1 = b.spawn(None, 1)[0]
    b.finished(c1, True, 1)
    assert b.take() is c1 and b.take() is c0


def test_cancel_all_reports_started_children_only():
    b = GroupBook(limit=1)
    c = [b.spawn(None, i)[0] for i in range(3)]
    b.finished(c[0], True, 0)  # c[1] starts
    out = b.cancel_all()
    assert out == [c[1]]
    assert [x.state for x in c] == [CANCELLED, CANCELLED, CANCELLED]
    assert len(b) == 0 and not b.queued
    # A result arriving after the cancel is dropped.
    assert b.finished(c[1], True, 1) == []
    assert b.take() is None
    with pytest.raises(RuntimeError, match="closed"):
        b.spawn(None, 9)


def test_cancel_one_frees_room():
    b = GroupBook(limit=1)
    c = [b.spawn(None, i)[0] for i in range(2)]
    assert b.cancel(c[0]) is True
    assert b.fill() == [c[1]]
    assert b.cancel(c[0]) is False  # once
    b.finished(c[1], True, 1)
    assert c[1].state == DONE
    assert b.first_started() is None


def test_bad_limit():
    # A wrong type is a TypeError, a wrong value a ValueError, as for timeout=.
    for bad in (1.5, "8", True):
        with pytest.raises(TypeError, match="limit= must be a positive int or None"):
            GroupBook(limit=bad)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="limit= must be >= 1"):
            GroupBook(limit=bad)


def test_a_handle_pickles_without_its_group():
    import pickle
    import threading

    class G:
        name = "group 0 of 'p'"
        lock = threading.Lock()  # what a live group holds: not picklable

    b = GroupBook()
    c, _ = b.spawn(G(), 1)
    err = ValueError("x")
    err.dask_coro_child = c
    back = pickle.loads(pickle.dumps(err))
    assert back.dask_coro_child.index == 0
    assert repr(back.dask_coro_child) == "<child 0 of group 0 of 'p' (started)>"


def test_a_stream_child_is_delivered_per_item_and_its_end_is_not():
    b = GroupBook(limit=1)
    s, _ = b.spawn(None, "stream", True)
    p, started = b.spawn(None, "plain")
    assert not started  # the stream holds the one place while its producer runs
    b.emitted(s, "a")
    b.emitted(s, "b")
    assert b.take() is s and s.outcome == (True, "a") and s.state == STARTED
    assert b.take() is s and s.outcome == (True, "b")
    assert b.take() is None and len(b) == 2
    # Its end (a value) is nothing to deliver: delivered at once, the place freed.
    assert b.finished(s, True, "returned") == [p]
    assert s.state == DELIVERED and len(b) == 1
    b.finished(p, True, 1)
    assert b.take() is p and len(b) == 0
    assert b.delivered == [0, 0, 1]


def test_a_stream_childs_error_comes_after_its_items_and_ended_items_stay():
    b = GroupBook()
    s, _ = b.spawn(None, "stream", True)
    b.emitted(s, 1)
    b.finished(s, False, ValueError("late"))
    b.emitted(s, 2)  # after its end: dropped
    assert b.take() is s and s.outcome == (True, 1) and s.state == DONE
    assert b.take() is s and s.outcome[0] is False and s.state == DELIVERED
    assert b.take() is None and len(b) == 0
    # Ended with items not yet taken: delivered, then done.
    t, _ = b.spawn(None, "stream", True)
    b.emitted(t, 3)
    b.finished(t, True, None)
    assert len(b) == 1 and b.take() is t and t.state == DELIVERED and len(b) == 0


def test_a_replay_names_a_stream_child_once_per_item():
    b = GroupBook(replay=[1, 0, 0])
    s, _ = b.spawn(None, "stream", True)
    p, _ = b.spawn(None, "plain")
    b.emitted(s, "x")  # the replay wants p first
    assert b.take() is None
    b.finished(p, True, "p")
    assert b.take() is p
    assert b.take() is s and s.outcome == (True, "x")
    b.emitted(s, "y")
    b.finished(s, True, None)
    assert b.take() is s and s.outcome == (True, "y") and b.delivered == [1, 0, 0]


def test_cancelling_a_stream_child_drops_its_items():
    b = GroupBook()
    s, _ = b.spawn(None, "stream", True)
    b.emitted(s, 1)
    b.emitted(s, 2)
    assert b.cancel(s) is True  # its producer runs: to stop
    assert s.state == CANCELLED and not s.items and b.take() is None and len(b) == 0


def test_counts_by_state_count_each_child_once():
    # What the dashboard shows of a group: queued, started, done, failed,
    # cancelled before it ended; one ended before it was cancelled keeps its end.
    b = GroupBook(limit=2)
    c = [b.spawn(None, i)[0] for i in range(6)]
    b.spawn(None, "stream", stream=True)
    assert b.counts() == [5, 2, 0, 0, 0]
    b.finished(c[0], True, 0)
    b.finished(c[1], False, ValueError("x"))
    assert b.counts() == [3, 2, 1, 1, 0]
    assert b.cancel(c[5]) is False  # queued
    b.finished(c[2], True, 2)  # ended, never delivered
    assert b.counts() == [1, 2, 2, 1, 1]
    assert b.cancel_all() == [c[3], c[4]]  # started: cancelled; c[2] counts as done
    assert b.counts() == [0, 0, 2, 1, 4]
    assert sum(b.counts()) == len(b.children)
