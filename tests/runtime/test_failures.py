"""Failure modes on a cluster: child errors, siblings of a failed child,
cancellation (root future cancelled, client closed), a worker dying under a
waiting parent, and bad yields.

No timing assertions: every wait polls a condition with a generous timeout.
Anything that blocks a worker thread is released in a ``finally`` so that
gen_cluster's thread-leak check and worker shutdown never hang.

Nanny workers are separate processes, and a coroutine defined in a test
function travels by value (each task gets its own copy of what it uses):
children record what they did in files under ``tmp_path`` or in
``distributed.Event`` objects, never in module state.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import threading
import traceback
import uuid
from pathlib import Path

import pytest
from distributed import Client, Event, Future, LocalCluster, Nanny, get_client
from distributed.client import FutureCancelledError
from distributed.utils_test import async_poll_for, captured_logger, poll_for
from filelog import append as _append
from filelog import lines as _lines
from filelog import ticks_after_cancel
from helpers import cluster, key_at, places, recorder
from workloads import boom, does_not_catch, inc

import dask_coro
from dask_coro import BadYieldError, CoroutineCancelledError, DaskCoroError, coroutine
from dask_coro.core.plan import derive_key

# --------------------------------------------------------------------------
# helpers (run on the workers; gen_cluster workers share this process, Nanny
# workers do not, so they only touch files and distributed primitives)


def _touch(folder: str, name: str, text: str = "") -> None:
    Path(folder, name).write_text(text)


def _keys_with_prefix(s, prefix: str) -> list:
    return [k for k in s.tasks if str(k).startswith(prefix + "-")]


def _line_of(func, needle: str) -> int:
    """The line number of the first source line of ``func`` containing ``needle``."""
    lines, start = inspect.getsourcelines(func)
    for i, line in enumerate(lines):
        if needle in line:
            return start + i
    raise AssertionError(f"{needle!r} not in {func}")


class MyError(Exception):
    """A user exception type: must come back as itself, not a wrapper."""


# --------------------------------------------------------------------------
# child errors


@coroutine
def catches_and_continues():
    try:
        yield [inc(1), boom(7)]
    except ValueError as e:
        tb = "".join(traceback.format_exception(e))
        caught = (type(e), str(e), tb)
    else:  # pragma: no cover - the test fails on this
        caught = None
    after = yield [inc(10), inc(20)]
    return caught, after


@coroutine
async def async_catches_and_continues():
    try:
        await dask_coro.gather([inc(1), boom(7)])
    except ValueError as e:
        caught = (type(e), str(e), "".join(traceback.format_exception(e)))
    else:  # pragma: no cover - the test fails on this
        caught = None
    after = await dask_coro.gather([inc(10), inc(20)])
    return caught, after


@pytest.mark.parametrize("body", ["generator", "async"])
@cluster(nthreads=[("", 1)])
async def test_child_error_raised_at_yield_with_remote_traceback(c, s, a, body):
    root = catches_and_continues() if body == "generator" else async_catches_and_continues()
    (etype, msg, tb), after = await c.compute(root)
    assert etype is ValueError
    assert msg == "boom 7"
    # The child's own frame is in the traceback, at the line that raised.
    line = _line_of(boom.__wrapped__, "BOOM-LINE")
    assert f"line {line}, in boom" in tb, tb
    # ... and the parent resumed normally after handling it.
    assert after == [11, 21]


@coroutine
def raises_custom(x):
    raise MyError("custom", x)


@coroutine
def middle(x):
    value = yield raises_custom(x)  # not handled here
    return value


@coroutine
def top_catches():
    try:
        yield middle(3)
    except MyError as e:
        return type(e), e.args, "".join(traceback.format_exception(e))
    return None


@cluster(nthreads=[("", 1)])
async def test_error_crosses_two_levels_with_its_type_and_args(c, s, a):
    etype, args, tb = await c.compute(top_catches())
    assert etype is MyError
    assert args == ("custom", 3)
    # Both the grandchild that raised and the coroutine it passed through.
    assert "in raises_custom" in tb, tb
    assert "in middle" in tb, tb


@cluster(nthreads=[("", 1)])
async def test_unhandled_child_error_fails_the_task_with_original_type(c, s, a):
    fut = c.compute(does_not_catch())
    with pytest.raises(ValueError, match=r"^boom 8$") as info:
        await fut.result()
    assert type(info.value) is ValueError
    assert fut.status == "error"
    exc = await fut.exception()
    assert type(exc) is ValueError and str(exc) == "boom 8"
    line = _line_of(boom.__wrapped__, "BOOM-LINE")
    tb = "".join(traceback.format_exception(info.value))
    assert f"line {line}, in boom" in tb, tb

    # Once the erred root is released nothing of the tree is left behind.
    fut.release()
    await async_poll_for(
        lambda: not s.tasks,
        timeout=20,
        fail_func=lambda: print({k: v.state for k, v in s.tasks.items()}),
    )


# --------------------------------------------------------------------------
# siblings of a failed child


@coroutine
def blocked(started: str, never: str):
    """Runs "forever": announces it started, then waits on an Event nobody sets
    (the test sets it at the very end, only to give the thread back)."""
    Event(started).set()
    Event(never).wait()
    return "sibling finished"


@coroutine
def fails_after(started: str):
    Event(started).wait()  # fail only once the sibling is surely running
    raise ValueError("child failed")


@coroutine
def sibling_parent(started: str, never: str, handle: bool):
    try:
        yield [fails_after(started), blocked(started, never)]
    except ValueError:
        if handle:
            return "handled"
        raise
    return "unreachable"


@pytest.mark.parametrize("handle", [True, False])
@cluster(nthreads=[("", 2)])
async def test_running_sibling_cancelled_when_parent_finishes(c, s, a, handle):
    started, never = f"started-{uuid.uuid4().hex}", f"never-{uuid.uuid4().hex}"
    root = sibling_parent(started, never, handle, dask_key_name=f"root-{handle}")
    sibling = derive_key("blocked", root.key, 0, (1,))
    try:
        fut = c.compute(root)
        if handle:
            assert await fut == "handled"
        else:
            with pytest.raises(ValueError, match="child failed"):
                await fut
        del fut
        # The scheduler forgets the sibling: nobody else wanted it.
        await async_poll_for(lambda: not _keys_with_prefix(s, "blocked"), timeout=20)
        # On the worker it is cancelled (its thread cannot be interrupted) or gone.
        await async_poll_for(
            lambda: getattr(a.state.tasks.get(key_at(a.state.tasks, sibling)), "state", "gone")
            in ("cancelled", "gone"),
            timeout=20,
        )
    finally:
        await Event(never, client=c).set()
    # Given its thread back, the sibling is dropped, not stored or rescheduled.
    await async_poll_for(lambda: sibling not in places(a.state.tasks), timeout=20)
    assert sibling not in places(a.data)
    assert not _keys_with_prefix(s, "blocked")


@coroutine
def closes_with_marker(started: str, never: str, folder: str):
    """A coroutine sibling waiting (seceded) on a child that runs "forever";
    its ``finally`` records that its runner closed it."""
    try:
        value = yield blocked(started, never)
        return value
    finally:
        _touch(folder, "sibling-closed", "ran")


@coroutine
def handles_then_keeps_running(started: str, never: str, second: str, folder: str):
    try:
        # The long-running sibling comes last in the yield.
        yield [fails_after(started), closes_with_marker(started, never, folder)]
    except ValueError as e:
        kept = e  # kept alive, traceback (and the frames in it) included
        _touch(folder, "handled")
    # Still running, waiting on something else entirely.
    value = yield slow_value(second)
    return value, str(kept)


# Three threads: two stay blocked on Events (the never-ending grandchild, whose
# thread cannot be interrupted, and the parent's second child) and coroutine
# bodies step on the same thread pool: the cancelled sibling needs a free
# thread to run its ``finally``.
@cluster(nthreads=[("", 3)])
async def test_sibling_released_while_parent_still_runs(c, s, a, tmp_path):
    """"Its siblings are released as soon as the coroutine has handled the
    error": not only when the coroutine ends."""
    started, never, second = (
        f"{name}-{uuid.uuid4().hex}" for name in ("started", "never", "second")
    )
    root = handles_then_keeps_running(
        started, never, second, str(tmp_path), dask_key_name="root"
    )
    sibling = derive_key("closes_with_marker", "root", 0, (1,))
    try:
        fut = c.compute(root)
        await async_poll_for(lambda: (tmp_path / "handled").exists(), timeout=20)
        await async_poll_for(
            lambda: derive_key("slow_value", "root", 1, ()) in places(s.tasks), timeout=20
        )
        await async_poll_for(
            lambda: sibling not in places(s.tasks) and not _keys_with_prefix(s, "blocked"),
            timeout=20,
            fail_func=lambda: print({k: v.state for k, v in s.tasks.items()}),
        )
        # The sibling's runner saw its key released and closed its body.
        await async_poll_for(lambda: (tmp_path / "sibling-closed").exists(), timeout=20)
        assert not fut.done()
        assert s.tasks["root"].state == "processing"
    finally:
        await Event(never, client=c).set()
        await Event(second, client=c).set()
    assert await fut == (5, "child failed")


@coroutine
def slow_value(go: str):
    Event(go).wait()
    return 5


@coroutine
def keeps_its_sibling(go: str, folder: str):
    slow = slow_value(go)  # still used after the error: must not be cancelled
    try:
        yield [boom(2), slow]
    except ValueError:
        _touch(folder, "handled")
    value = yield slow
    return value


@cluster(nthreads=[("", 2)])
async def test_sibling_still_used_by_the_parent_is_kept_and_reused(c, s, a, tmp_path):
    r = recorder(s)
    go = f"go-{uuid.uuid4().hex}"
    root = keeps_its_sibling(go, str(tmp_path), dask_key_name="keeper")
    sibling = derive_key("slow_value", "keeper", 0, (1,))
    try:
        fut = c.compute(root)
        await async_poll_for(lambda: (tmp_path / "handled").exists(), timeout=20)
        # Held across the error, never released and recomputed.
        sibling = key_at(s.tasks, sibling)
        assert sibling in s.tasks
        assert s.tasks[sibling].state == "processing"
        # Still running (a body blocked in Event.wait secedes, as the worker's
        # client does around every blocking call in a body).
        assert a.state.tasks[sibling].state in ("executing", "long-running")
    finally:
        await Event(go, client=c).set()
    assert await fut == 5
    assert r.memory.count(sibling) == 1
    # The second yield referred to the same key instead of a new task.
    assert not [k for k in r.seen if str(k).startswith("slow_value-") and k != sibling]


@coroutine
def future_sibling(key: str, started: str):
    # By key: a Future passed as an argument would make the task depend on it.
    fut = Future(key, get_client())
    try:
        yield [fails_after(started), fut]
    except ValueError:
        return "handled"
    return "unreachable"


@cluster(nthreads=[("", 2)])
async def test_sibling_held_by_the_client_is_not_cancelled(c, s, a):
    started, never = f"started-{uuid.uuid4().hex}", f"never-{uuid.uuid4().hex}"
    # Submitted by the test's client, so the coroutine does not own it.
    other = c.compute(blocked(started, never, dask_key_name="held-by-client"))
    try:
        assert await c.compute(future_sibling(other.key, started)) == "handled"
        assert other.status == "pending"
        assert s.tasks["held-by-client"].state == "processing"
        assert a.state.tasks["held-by-client"].state in ("executing", "long-running")
    finally:
        await Event(never, client=c).set()
    assert await other == "sibling finished"


# --------------------------------------------------------------------------
# cancellation: root future cancelled, client closed


@coroutine
def tick(folder: str, i: int):
    _append(folder, "ticks", str(i))
    return i


@coroutine
def forever(folder: str, name: str = "forever"):
    i = 0
    try:
        while True:
            yield tick(folder, i)
            i += 1
    finally:
        _touch(folder, f"{name}-finally", "ran")


@coroutine
async def async_root(folder: str):
    try:
        await forever(folder, "middle")
    finally:
        _touch(folder, "root-finally", "ran")


async def _assert_tree_stopped(s, workers, folder: Path, finally_markers: list[str]):
    """After a cancellation: the ``finally`` blocks ran, nothing is left on the
    scheduler or the workers, and no child starts any more."""
    await async_poll_for(
        lambda: all((folder / m).exists() for m in finally_markers), timeout=20
    )
    await ticks_after_cancel(s, workers, folder)
    assert not s.tasks
    for m in finally_markers:
        assert (folder / m).read_text() == "ran"


@pytest.mark.parametrize("nested", [False, True])
@cluster(nthreads=[("", 1)])
async def test_cancel_root_stops_the_whole_tree(c, s, a, tmp_path, nested):
    root = async_root(str(tmp_path)) if nested else forever(str(tmp_path))
    fut = c.compute(root)
    await async_poll_for(lambda: len(_lines(tmp_path, "ticks")) >= 3, timeout=20)
    assert not fut.done()
    assert a._client is not None and a._client is not c
    await c.cancel(fut)
    assert fut.cancelled()
    markers = ["middle-finally", "root-finally"] if nested else ["forever-finally"]
    await _assert_tree_stopped(s, [a], tmp_path, markers)


@coroutine
def waits_on_a_stuck_child(started: str, never: str, folder: str):
    try:
        value = yield blocked(started, never)
        return value
    finally:
        _touch(folder, "waiter-finally", "ran")


# Two threads: the stuck child holds one for good (a thread cannot be
# interrupted); the parent's body needs the other to run its ``finally``.
@cluster(nthreads=[("", 2)])
async def test_cancel_root_waiting_on_a_child_that_never_finishes(c, s, a, tmp_path):
    """No further yield to notice the cancellation at: the runner has to be
    woken while it waits."""
    started, never = f"started-{uuid.uuid4().hex}", f"never-{uuid.uuid4().hex}"
    try:
        fut = c.compute(waits_on_a_stuck_child(started, never, str(tmp_path)))
        await Event(started, client=c).wait(timeout=20)
        await c.cancel(fut)
        await async_poll_for(lambda: (tmp_path / "waiter-finally").exists(), timeout=20)
        await async_poll_for(
            lambda: not s.tasks,
            timeout=20,
            fail_func=lambda: print({k: v.state for k, v in s.tasks.items()}),
        )
        assert (tmp_path / "waiter-finally").read_text() == "ran"
    finally:
        await Event(never, client=c).set()
    await async_poll_for(lambda: not a.state.tasks, timeout=20)
    assert not a.data


#: Gates of ``holds_a_thread`` (in-process workers share them): a thread
#: blocked on a threading.Event runs code no cancel interrupts, where a
#: distributed primitive's wait in a body gives its seat back.
GATES: dict = {}


@coroutine
def holds_a_thread(started: str, never: str) -> int:
    """A plain child that blocks its thread until ``never`` is set."""
    GATES.setdefault(started, threading.Event()).set()
    GATES.setdefault(never, threading.Event()).wait(60)
    return 1


@coroutine
def under_a_stuck_pair(tag: str, folder: str):
    try:
        return (yield holds_a_thread(f"{tag}-b-started", f"{tag}-never"))
    finally:
        _touch(folder, "inner-finally", "ran")


@coroutine
def stuck_pair(tag: str, folder: str):
    try:
        a, b = yield [holds_a_thread(f"{tag}-a-started", f"{tag}-never"), under_a_stuck_pair(tag, folder)]
        return a + b
    finally:
        _touch(folder, "outer-finally", "ran")


# Two threads, both held by children no cancel interrupts (a LocalCluster as
# a user starts one): closing a body needs a thread, so the runs let go of
# their children first.
def test_cancel_clears_the_tree_while_every_thread_is_held(tmp_path):
    """Cancelling the root takes the whole tree off the scheduler at once,
    as cancelling a plain Future of a running task does, though both
    threads still run children's code and no body could be closed yet."""
    tag = uuid.uuid4().hex
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as lc, \
            Client(lc) as c:
        s, a = lc.scheduler, lc.workers[0]
        try:
            fut = c.compute(stuck_pair(tag, str(tmp_path)))
            for name in ("a-started", "b-started"):
                assert GATES.setdefault(f"{tag}-{name}", threading.Event()).wait(20)
            fut.cancel()
            poll_for(lambda: not s.tasks, timeout=20)
            # Their code still runs on both threads (the worker keeps them
            # executing, cancelled), so no body could be closed yet.
            held = [ts.state for ts in a.state.tasks.values() if "holds_a_thread" in str(ts.key)]
            assert held == ["cancelled", "cancelled"]
            assert not (tmp_path / "outer-finally").exists()
        finally:
            GATES.setdefault(f"{tag}-never", threading.Event()).set()
        # Once a thread is free, every body is closed (its finally ran).
        poll_for(lambda: (tmp_path / "outer-finally").exists(), timeout=20)
        poll_for(lambda: (tmp_path / "inner-finally").exists(), timeout=20)
        poll_for(lambda: not a.state.tasks, timeout=20)


@coroutine
def swallows_exceptions(folder: str):
    """Catches ``Exception`` at every yield and goes on, as a retry loop would."""
    i = 0
    try:
        while True:
            try:
                yield tick(folder, i)
            except Exception as e:
                _append(folder, "swallowed", type(e).__name__)
            i += 1
    except BaseException as e:
        _touch(folder, "seen", type(e).__name__)
        raise


def test_cancellation_is_not_an_exception():
    """The decision, as asyncio and trio take it: cancellation derives from
    BaseException only, so ``except Exception`` does not catch it."""
    assert issubclass(CoroutineCancelledError, asyncio.CancelledError)
    assert not issubclass(CoroutineCancelledError, Exception)
    assert not issubclass(CoroutineCancelledError, DaskCoroError)
    with pytest.raises(CoroutineCancelledError):
        try:
            raise CoroutineCancelledError("k")
        except Exception:  # pragma: no cover - the test fails on this
            pytest.fail("except Exception caught a cancellation")


@cluster(nthreads=[("", 1)])
async def test_cancel_is_not_swallowed_by_except_exception(c, s, a, tmp_path):
    """A body that catches ``Exception`` around its yield still stops when its
    task is cancelled: it sees GeneratorExit at the yield, the runner ends the
    task with CoroutineCancelledError, and no child starts after."""
    fut = c.compute(swallows_exceptions(str(tmp_path)))
    await async_poll_for(lambda: len(_lines(tmp_path, "ticks")) >= 3, timeout=20)
    await c.cancel(fut)
    seen = tmp_path / "seen"
    await async_poll_for(lambda: seen.exists() and seen.read_text(), timeout=20)
    await ticks_after_cancel(s, [a], tmp_path)
    assert (tmp_path / "seen").read_text() == "GeneratorExit"
    assert not (tmp_path / "swallowed").exists()


@coroutine
def blocks_between_yields(folder: str, go: str):
    try:
        yield tick(folder, 0)
        _touch(folder, "in-body")
        Event(go).wait()  # CPU work between yields, as far as the runner knows
        yield tick(folder, 1)  # must not be submitted: the task is cancelled by now
        _touch(folder, "after")
    finally:
        _touch(folder, "body-finally", "ran")


@cluster(nthreads=[("", 1)])
async def test_cancel_while_body_runs_between_yields(c, s, a, tmp_path):
    go = f"go-{uuid.uuid4().hex}"
    r = recorder(s)
    try:
        fut = c.compute(blocks_between_yields(str(tmp_path), go, dask_key_name="busy"))
        await async_poll_for(lambda: (tmp_path / "in-body").exists(), timeout=20)
        await c.cancel(fut)
        await async_poll_for(lambda: "busy" not in s.tasks, timeout=20)
    finally:
        await Event(go, client=c).set()
    await _assert_tree_stopped(s, [a], tmp_path, ["body-finally"])
    assert _lines(tmp_path, "ticks") == ["0"]
    assert not (tmp_path / "after").exists()
    assert derive_key("tick", "busy", 1, ()) not in places(r.seen)


@pytest.mark.parametrize("nested", [False, True])
@cluster(nthreads=[("", 1)])
async def test_closing_the_client_stops_the_whole_tree(c, s, a, tmp_path, nested):
    c2 = await Client(s.address, asynchronous=True, set_as_default=False)
    try:
        root = async_root(str(tmp_path)) if nested else forever(str(tmp_path))
        fut = c2.compute(root)
        await async_poll_for(lambda: len(_lines(tmp_path, "ticks")) >= 3, timeout=20)
        assert not fut.done()
        # The children go through the worker's own client, which stays open.
        assert a._client is not None and a._client not in (c, c2)
    finally:
        await c2.close()
    markers = ["middle-finally", "root-finally"] if nested else ["forever-finally"]
    await _assert_tree_stopped(s, [a], tmp_path, markers)
    # The first client is unaffected and the worker still serves coroutines.
    assert await c.compute(inc(1)) == 2


@coroutine
def gated_sum(n: int, folder: str, go: str):
    total = 0
    try:
        for i in range(n):
            total += yield tick(folder, i)
        total += yield slow_value(go)
        return total
    finally:
        _touch(folder, "gated-finally", "ran")


# Two threads: slow_value holds one; the root's body steps on the other.
@cluster(nthreads=[("", 2)])
async def test_closing_one_of_two_clients_keeps_a_shared_root(c, s, a, tmp_path):
    """Closing a client releases what *it* wanted: a root another client still
    wants keeps running to its result."""
    go = f"go-{uuid.uuid4().hex}"
    c2 = await Client(s.address, asynchronous=True, set_as_default=False)
    try:
        fut = c.compute(gated_sum(5, str(tmp_path), go, dask_key_name="shared"))
        fut2 = c2.compute(gated_sum(5, str(tmp_path), go, dask_key_name="shared"))
        await async_poll_for(
            lambda: derive_key("slow_value", "shared", 5, ()) in places(s.tasks), timeout=20
        )
        await c2.close()
        del fut2
        await async_poll_for(
            lambda: c2.id not in s.clients, timeout=20
        )
        assert s.tasks["shared"].state == "processing"
        assert not (tmp_path / "gated-finally").exists()
    finally:
        await Event(go, client=c).set()
        await c2.close()
    assert await fut == sum(range(5)) + 5
    # One run: the root was never closed and restarted.
    assert _lines(tmp_path, "ticks") == [str(i) for i in range(5)]


@coroutine
def count_to(n: int, folder: str, hold: str):
    total = 0
    try:
        for i in range(n):
            total += yield tick(folder, i)
    finally:
        _append(folder, "closing", "x")
        Event(hold).wait()  # the first run's close is held until the test says
    return total


# Two threads: the first run's ``finally`` holds one while the key is asked for
# again.
@cluster(nthreads=[("", 2)])
async def test_cancel_then_ask_again_for_the_same_key(c, s, a, tmp_path):
    """Cancelled, and asked for again under the same key while the worker is
    still closing the first run: however that run ends, the key is computed
    again from the start and gives the right answer."""
    n = 20
    hold = f"hold-{uuid.uuid4().hex}"
    async with Client(s.address, asynchronous=True, set_as_default=False) as c2:
        try:
            fut = c.compute(count_to(n, str(tmp_path), hold, dask_key_name="again"))
            await async_poll_for(lambda: len(_lines(tmp_path, "ticks")) >= 2, timeout=20)
            await c.cancel(fut)
            await async_poll_for(lambda: _lines(tmp_path, "closing"), timeout=20)
            assert a.state.tasks["again"].state == "cancelled"
            # The scheduler reports a cancellation to every client: a future
            # for the same key that c2 made before the report arrived would be
            # cancelled by it (distributed's behaviour, not dask_coro's). A
            # result c2 asks for afterwards comes over the same stream, after it.
            assert await c2.submit(lambda x: x + 1, 1, pure=False) == 2
            fut2 = c2.compute(count_to(n, str(tmp_path), hold, dask_key_name="again"))
            await async_poll_for(
                lambda: getattr(a.state.tasks.get("again"), "state", None) != "cancelled",
                timeout=20,
            )
        finally:
            await Event(hold, client=c).set()
        assert await fut2 == sum(range(n))
        # Closed once when cancelled, ended once normally.
        assert _lines(tmp_path, "closing") == ["x", "x"]
        del fut, fut2
    await async_poll_for(lambda: not s.tasks, timeout=20)


@coroutine
def finally_raises(folder: str):
    try:
        while True:
            yield tick(folder, 0)
    finally:
        _touch(folder, "finally-raises", "ran")
        raise RuntimeError("cleanup failed")


@cluster(nthreads=[("", 1)])
async def test_cancel_when_finally_raises(c, s, a, tmp_path):
    with captured_logger("dask_coro", level=logging.WARNING) as log:
        fut = c.compute(finally_raises(str(tmp_path)))
        await async_poll_for(lambda: len(_lines(tmp_path, "ticks")) >= 2, timeout=20)
        await c.cancel(fut)
        await _assert_tree_stopped(s, [a], tmp_path, ["finally-raises"])
    assert "cleanup failed" in log.getvalue()


@coroutine
def child_cancelled_elsewhere(started: str, never: str):
    try:
        yield blocked(started, never)
    except FutureCancelledError as e:
        return type(e).__name__
    return "unreachable"


@cluster(nthreads=[("", 2)])
async def test_child_cancelled_by_someone_else_raises_at_the_yield(c, s, a):
    started, never = f"started-{uuid.uuid4().hex}", f"never-{uuid.uuid4().hex}"
    try:
        fut = c.compute(child_cancelled_elsewhere(started, never, dask_key_name="victim"))
        await Event(started, client=c).wait(timeout=20)
        child = Future(key_at(s.tasks, derive_key("blocked", "victim", 0, ())), c)
        await c.cancel(child, force=True)
        assert await fut == "FutureCancelledError"
    finally:
        await Event(never, client=c).set()


# --------------------------------------------------------------------------
# a cancel of what a body waits on, or of a body that never waits


def _waited_on(never: str) -> int:
    Event(never).wait()
    return 41


def _cancel_from_worker(key) -> None:
    """Cancel ``key`` through this worker's client, the one the body
    submitted it with (its only wanter, as in plain Dask's own tests)."""
    client = get_client()
    client.cancel([Future(key, client)])


@coroutine
def waits_on_own_future(folder: str, never: str, how: str):
    _append(folder, "starts", how)
    f = get_client().submit(_waited_on, never, key=f"waited-{never}")
    try:
        if how == "yield":
            x = yield f
        elif how == "use":
            x = yield inc(f)
        else:
            x = dask_coro.result(f)
    except FutureCancelledError as e:
        return type(e).__name__
    return x


@coroutine
async def awaits_own_future(folder: str, never: str):
    _append(folder, "starts", "gather")
    f = get_client().submit(_waited_on, never, key=f"waited-{never}")
    try:
        return await dask_coro.gather(f)
    except FutureCancelledError as e:
        return type(e).__name__


def worker_client_waits_on_own_future(folder: str, never: str):
    """The same program as a plain ``worker_client`` task."""
    from distributed import worker_client

    _append(folder, "starts", "worker_client")
    with worker_client() as client:
        f = client.submit(_waited_on, never, key=f"waited-{never}")
        try:
            return f.result()
        except FutureCancelledError as e:
            return type(e).__name__


@pytest.mark.parametrize("how", ["yield", "use", "gather", "result", "worker_client"])
@cluster(nthreads=[("", 2)])
async def test_cancel_of_a_future_a_body_waits_on_raises_at_the_yield(c, s, a, tmp_path, how):
    """``client.cancel(f)`` of the Future a body waits on raises
    ``FutureCancelledError`` there with the default hold, as it does in a
    ``worker_client`` task: the hold keeps the yield's child of f (``yield
    f`` waits through a task that depends on f), and distributed cancels a
    dependent only for its one wanter (``Scheduler.stimulus_cancel``); the
    hold lets go of it first (``DurablePlugin._cancelling``)."""
    assert dask_coro._config.get("coro.durability.hold-children")
    never = f"never-{uuid.uuid4().hex}"
    folder = str(tmp_path)
    waited = f"waited-{never}"
    if how == "worker_client":
        fut = c.submit(worker_client_waits_on_own_future, folder, never, key="root", pure=False)
    elif how == "gather":
        fut = c.compute(awaits_own_future(folder, never, dask_key_name="root"))
    else:
        fut = c.compute(waits_on_own_future(folder, never, how, dask_key_name="root"))

    def waiting():
        ts, f = s.tasks.get("root"), s.tasks.get(waited)
        return (
            ts is not None and f is not None and ts.processing_on is not None
            and ts in ts.processing_on.long_running
            and (how == "worker_client" or bool(f.dependents))
        )

    try:
        await async_poll_for(waiting, timeout=20)
        await c.submit(_cancel_from_worker, waited, pure=False)
        # At once, not when f's task ends (never, until the test lets it).
        assert await asyncio.wait_for(fut, 20) == "FutureCancelledError"
    finally:
        await Event(never, client=c).set()
    assert _lines(tmp_path, "starts") == [how]  # not retried
    del fut
    await async_poll_for(lambda: not s.tasks, timeout=20)


@coroutine
def spins(folder: str, plain: bool):
    """A loop that never waits: each yield resumes at once."""
    try:
        i = 0
        while True:
            _append(folder, "ticks", str(i))
            yield (i if plain else tick(folder, -1))
            i += 1
    finally:
        _touch(folder, "spins-finally", "ran")


@pytest.mark.parametrize(
    "plain", [True, False, pytest.param(True, marks=pytest.mark.inline, id="True-inline")]
)
@cluster(nthreads=[("", 1)])
async def test_cancel_closes_a_body_that_yields_plain_values(c, s, a, tmp_path, plain):
    """A cancel closes a body at its next yield whatever it yields: a plain
    value (resumed at once, no call, no wait) as a child."""
    fut = c.compute(spins(str(tmp_path), plain))
    await async_poll_for(lambda: len(_lines(tmp_path, "ticks")) >= 3, timeout=20)
    await c.cancel(fut)
    await _assert_tree_stopped(s, [a], tmp_path, ["spins-finally"])


# --------------------------------------------------------------------------
# a worker dies under a waiting parent


@coroutine
def gated_square(i: int, go: str):
    Event(go).wait()
    return i * i


@coroutine
def tree_sum(lo: int, hi: int, go: str, folder: str):
    _append(folder, "starts", f"{lo}-{hi}")
    if hi - lo <= 2:
        values = yield [gated_square(i, go) for i in range(lo, hi)]
    else:
        mid = (lo + hi) // 2
        values = yield [tree_sum(lo, mid, go, folder), tree_sum(mid, hi, go, folder)]
    return sum(values)


@pytest.mark.parametrize("how", ["sigkill", "graceful"])
@cluster(nthreads=[("", 1), ("", 1)], Worker=Nanny, timeout=90)
async def test_worker_holding_waiting_parent_dies(c, s, a, b, tmp_path, how):
    """The worker running the root (waiting, seceded) goes away: killed
    outright, or closed by its nanny, which cancels the runner's asyncio task.
    The root runs again elsewhere and gives the right answer."""
    go = f"go-{uuid.uuid4().hex}"
    n = 8
    fut = c.compute(tree_sum(0, n, go, str(tmp_path), dask_key_name="root"))

    def root_waiting():
        ts = s.tasks.get("root")
        return (
            ts is not None
            and ts.processing_on is not None
            and ts in ts.processing_on.long_running
            # the tree is waiting on leaves that cannot finish before "go"
            and any(
                s.tasks[k].state == "processing" for k in _keys_with_prefix(s, "gated_square")
            )
        )

    try:
        await async_poll_for(root_waiting, timeout=30)
        address = s.tasks["root"].processing_on.address
        (victim,) = [nanny for nanny in (a, b) if nanny.worker_address == address]
        if how == "sigkill":
            os.kill(victim.process.process.pid, signal.SIGKILL)
        else:
            # Nanny.kill() asks the worker to close, which waits for its busy
            # threads (blocked on "go") only after leaving the scheduler.
            closing = asyncio.create_task(victim.kill(timeout=30))
        await async_poll_for(lambda: address not in s.workers, timeout=30)
        assert not fut.done()
    finally:
        await Event(go, client=c).set()
    if how == "graceful":
        await closing
    assert await fut.result(timeout=60) == sum(i * i for i in range(n))
    if how == "sigkill":
        # An unexpected death of the worker it was running on, but the root was
        # waiting on its children: not counted toward allowed-failures
        # (dask_coro/durability/scheduler.py).
        assert s.tasks["root"].suspicious <= 0
    # The root ran its body again from the start.
    assert _lines(tmp_path, "starts").count(f"0-{n}") >= 2


# --------------------------------------------------------------------------
# bad yields


@coroutine
def yields_a_set(handle: bool):
    first = yield inc(0)  # a good yield first: the bad one is yield #1
    try:
        yield [inc(1), {1, 2}]
    except BadYieldError as e:
        if handle:
            after = yield inc(first)  # and the coroutine goes on
            return type(e), str(e), after
        raise
    return None


@coroutine
async def awaits_a_set():
    await dask_coro.gather({"ok": inc(1), "bad": [0, frozenset({3})]})


class _Odd:
    def __await__(self):
        yield "odd"  # neither an asyncio future nor a dask_coro awaitable


@coroutine
async def awaits_something_odd():
    # (asyncio awaitables are awaited on the body's own loop: tests/runtime/test_asyncio.py)
    await _Odd()


@cluster(nthreads=[("", 1)])
async def test_yielding_a_set_raises_bad_yield_at_the_yield(c, s, a):
    r = recorder(s)
    etype, msg, after = await c.compute(yields_a_set(True, dask_key_name="setter"))
    assert etype is BadYieldError
    assert issubclass(etype, TypeError)
    assert "'yields_a_set'" in msg
    assert "position [1]" in msg and "yield #1" in msg
    assert after == 2
    # Rejected before anything of that yield was submitted: its valid leaf
    # never ran; the yields before and after it did.
    assert derive_key("inc", "setter", 0, ()) in places(r.seen)
    assert derive_key("inc", "setter", 1, (0,)) not in places(r.seen)
    assert derive_key("inc", "setter", 2, ()) in places(r.seen)


@cluster(nthreads=[("", 1)])
async def test_unhandled_bad_yield_fails_the_task(c, s, a):
    f1 = c.compute(yields_a_set(False))
    match = r"'yields_a_set'.*position \[1\] of yield #1"
    with pytest.raises(BadYieldError, match=match) as info:
        await f1
    assert isinstance(info.value, TypeError)

    f2 = c.compute(awaits_a_set())
    with pytest.raises(BadYieldError, match=r"'awaits_a_set'.*position \['bad'\]\[1\]"):
        await f2

    f3 = c.compute(awaits_something_odd())
    with pytest.raises(BadYieldError, match=r"'awaits_something_odd' awaited 'odd'"):
        await f3
    assert f1.status == f2.status == f3.status == "error"
    for f in (f1, f2, f3):
        f.release()
    await async_poll_for(lambda: not s.tasks, timeout=20)


# --------------------------------------------------------------------------
# kept failing on purpose: a bug in dask_coro (see the docstring)


@cluster(nthreads=[("", 1)])
async def test_child_traceback_points_at_its_source_file(c, s, a):
    """The child's frame in the traceback names the file it was defined in, as
    for any dask task, so that tools (and people) can find the source.

    Regression: ``CoroutineTask`` once pickled the undecorated function by
    value (its module names the ``@coroutine`` wrapper, not the function), so
    the code's file became ``"<dynamic-code>"``, every global it used was
    shipped with every task, and each task had its own copy of module state.
    """
    (etype, msg, tb), after = await c.compute(catches_and_continues())
    assert (etype, msg, after) == (ValueError, "boom 7", [11, 21])
    line = _line_of(boom.__wrapped__, "BOOM-LINE")
    filename = boom.__wrapped__.__code__.co_filename
    assert f'File "{filename}", line {line}, in boom' in tb, tb
