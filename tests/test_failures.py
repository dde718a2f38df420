"""Failure modes on a cluster: child errors, siblings of a failed child,
cancellation (root future cancelled, client closed), a worker dying under a
waiting parent, and bad yields.

No timing assertions: every wait polls a condition with a generous timeout.
Anything that blocks a worker thread is released in a ``finally`` so that
gen_cluster's thread-leak check and worker shutdown never hang.

Coroutine functions are pickled by value (the task carries the undecorated
function, which its module does not name), so module globals are copied into
the worker: children record what they did in files under ``tmp_path`` or in
``distributed.Event`` objects, never in module state.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import traceback
import uuid
from pathlib import Path

import pytest
from distributed import Client, Event, Nanny, SchedulerPlugin
from distributed.utils_test import async_poll_for, gen_cluster

import dask_coro
from dask_coro import BadYieldError, coroutine
from dask_coro._plan import derive_key

# --------------------------------------------------------------------------
# helpers (run on the workers; gen_cluster workers share this process, Nanny
# workers do not, so they only touch files and distributed primitives)


def _touch(folder: str, name: str, text: str = "") -> None:
    Path(folder, name).write_text(text)


def _append(folder: str, name: str, line: str) -> None:
    with open(Path(folder, name), "a") as f:
        f.write(line + "\n")


def _lines(folder, name: str) -> list[str]:
    p = Path(folder, name)
    return p.read_text().splitlines() if p.exists() else []


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


class Recorder(SchedulerPlugin):
    """Every key the scheduler ever heard of, and the keys that reached memory."""

    def __init__(self) -> None:
        self.seen: set = set()
        self.memory: list = []

    def update_graph(self, scheduler, *, keys, **kwargs):
        self.seen.update(keys)

    def transition(self, key, start, finish, *args, **kwargs):
        self.seen.add(key)
        if finish == "memory":
            self.memory.append(key)


# --------------------------------------------------------------------------
# child errors


@coroutine
def boom(x):
    raise ValueError(f"boom {x}")  # BOOM-LINE


@coroutine
def inc(x):
    return x + 1


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


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_child_error_raised_at_yield_with_remote_traceback(c, s, a):
    (etype, msg, tb), after = await c.compute(catches_and_continues())
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


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_error_crosses_two_levels_with_its_type_and_args(c, s, a):
    etype, args, tb = await c.compute(top_catches())
    assert etype is MyError
    assert args == ("custom", 3)
    # Both the grandchild that raised and the coroutine it passed through.
    assert "in raises_custom" in tb, tb
    assert "in middle" in tb, tb


@coroutine
def does_not_catch():
    yield inc(1)
    yield [inc(2), boom(8)]
    return "unreachable"


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_unhandled_child_error_fails_the_task_with_original_type(c, s, a):
    fut = c.compute(does_not_catch())
    with pytest.raises(ValueError, match="^boom 8$") as info:
        await fut.result()
    assert type(info.value) is ValueError
    assert fut.status == "error"
    exc = await fut.exception()
    assert type(exc) is ValueError and str(exc) == "boom 8"
    line = _line_of(boom.__wrapped__, "BOOM-LINE")
    tb = "".join(traceback.format_exception(info.value))
    assert f"line {line}, in boom" in tb, tb

    # Once the erred root is released nothing of the tree is left behind.
    del fut, info, exc
    await async_poll_for(lambda: not s.tasks, timeout=20)


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
@gen_cluster(client=True, nthreads=[("", 2)])
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
        ts = a.state.tasks.get(sibling)
        assert ts is None or ts.state == "cancelled", ts
    finally:
        await Event(never).set()
    # Given its thread back, the sibling is dropped, not stored or rescheduled.
    await async_poll_for(lambda: sibling not in a.state.tasks, timeout=20)
    assert sibling not in a.data
    assert not _keys_with_prefix(s, "blocked")


@coroutine
def waiter(gate, folder: str, name: str):
    """Waits on ``gate`` (which no worker can run) holding no thread; its
    ``finally`` records that the runner closed it."""
    try:
        value = yield gate
        return value
    finally:
        _touch(folder, name)


@coroutine
def handles_then_keeps_running(gate, folder: str):
    try:
        # The long-running sibling comes last in the yield.
        yield [boom(1), waiter(gate, folder, "sibling-closed")]
    except ValueError:
        _touch(folder, "handled")
    # Still running, waiting on something else entirely.
    value = yield waiter(gate, folder, "second-closed")
    return value


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_sibling_released_while_parent_still_runs(c, s, a, tmp_path):
    """"Its siblings are released as soon as the coroutine has handled the
    error": not only when the coroutine ends."""
    gate = c.submit(lambda: 42, resources={"GATE": 1}, pure=False, key="gate")
    root = handles_then_keeps_running(gate, str(tmp_path), dask_key_name="root")
    sibling = derive_key("waiter", "root", 0, (1,))
    fut = c.compute(root)
    await async_poll_for(lambda: (tmp_path / "handled").exists(), timeout=20)
    await async_poll_for(lambda: derive_key("waiter", "root", 1, ()) in s.tasks, timeout=20)

    await async_poll_for(
        lambda: sibling not in s.tasks,
        timeout=10,
        fail_func=lambda: print("still held:", {k: v.state for k, v in s.tasks.items()}),
    )
    # The sibling's runner saw its key released and closed its body.
    await async_poll_for(lambda: (tmp_path / "sibling-closed").exists(), timeout=20)
    assert not fut.done()
    assert s.tasks["root"].state == "processing"

    await a.set_resources(GATE=1)  # open the gate: the parent's second yield ends
    assert await fut == 42
    assert not (tmp_path / "second-closed").read_text()


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


@gen_cluster(client=True, nthreads=[("", 2)])
async def test_sibling_still_used_by_the_parent_is_kept_and_reused(c, s, a, tmp_path):
    r = Recorder()
    s.add_plugin(r)
    go = f"go-{uuid.uuid4().hex}"
    root = keeps_its_sibling(go, str(tmp_path), dask_key_name="keeper")
    sibling = derive_key("slow_value", "keeper", 0, (1,))
    try:
        fut = c.compute(root)
        await async_poll_for(lambda: (tmp_path / "handled").exists(), timeout=20)
        # Held across the error, never released and recomputed.
        assert sibling in s.tasks
        assert s.tasks[sibling].state == "processing"
        assert a.state.tasks[sibling].state == "executing"
    finally:
        await Event(go).set()
    assert await fut == 5
    assert r.memory.count(sibling) == 1
    # The second yield referred to the same key instead of a new task.
    assert not [k for k in r.seen if str(k).startswith("slow_value-") and k != sibling]


@coroutine
def future_sibling(fut):
    try:
        yield [boom(3), fut]
    except ValueError:
        return "handled"
    return "unreachable"


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_sibling_held_by_the_client_is_not_cancelled(c, s, a):
    other = c.submit(lambda: 99, resources={"GATE": 1}, pure=False, key="held-by-client")
    assert await c.compute(future_sibling(other)) == "handled"
    assert other.status == "pending"
    assert s.tasks["held-by-client"].state in ("no-worker", "queued", "processing")
    await a.set_resources(GATE=1)
    assert await other == 99


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
    await async_poll_for(
        lambda: not s.tasks,
        timeout=20,
        fail_func=lambda: print({k: v.state for k, v in s.tasks.items()}),
    )
    await async_poll_for(lambda: not any(w.state.tasks for w in workers), timeout=20)
    n = len(_lines(folder, "ticks"))
    await asyncio.sleep(0.5)  # not a timing assertion: nothing may happen meanwhile
    assert len(_lines(folder, "ticks")) == n
    assert not s.tasks
    for m in finally_markers:
        assert (folder / m).read_text() == "ran"


@pytest.mark.parametrize("nested", [False, True])
@gen_cluster(client=True, nthreads=[("", 1)])
async def test_cancel_root_stops_the_whole_tree(c, s, a, tmp_path, nested):
    root = async_root(str(tmp_path)) if nested else forever(str(tmp_path))
    fut = c.compute(root)
    await async_poll_for(lambda: len(_lines(tmp_path, "ticks")) >= 3, timeout=20)
    assert not fut.done()
    await c.cancel(fut)
    assert fut.cancelled()
    markers = ["middle-finally", "root-finally"] if nested else ["forever-finally"]
    await _assert_tree_stopped(s, [a], tmp_path, markers)


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


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_cancel_while_body_runs_between_yields(c, s, a, tmp_path):
    go = f"go-{uuid.uuid4().hex}"
    r = Recorder()
    s.add_plugin(r)
    try:
        fut = c.compute(blocks_between_yields(str(tmp_path), go, dask_key_name="busy"))
        await async_poll_for(lambda: (tmp_path / "in-body").exists(), timeout=20)
        await c.cancel(fut)
        await async_poll_for(lambda: "busy" not in s.tasks, timeout=20)
    finally:
        await Event(go).set()
    await _assert_tree_stopped(s, [a], tmp_path, ["body-finally"])
    assert _lines(tmp_path, "ticks") == ["0"]
    assert not (tmp_path / "after").exists()
    assert derive_key("tick", "busy", 1, ()) not in r.seen


@pytest.mark.parametrize("nested", [False, True])
@gen_cluster(client=True, nthreads=[("", 1)])
async def test_closing_the_client_stops_the_whole_tree(c, s, a, tmp_path, nested):
    c2 = await Client(s.address, asynchronous=True)
    try:
        root = async_root(str(tmp_path)) if nested else forever(str(tmp_path))
        fut = c2.compute(root)
        await async_poll_for(lambda: len(_lines(tmp_path, "ticks")) >= 3, timeout=20)
        assert not fut.done()
    finally:
        await c2.close()
    markers = ["middle-finally", "root-finally"] if nested else ["forever-finally"]
    await _assert_tree_stopped(s, [a], tmp_path, markers)
    # The first client is unaffected and the worker still serves coroutines.
    assert await c.compute(inc(1)) == 2


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


@gen_cluster(client=True, nthreads=[("", 1), ("", 1)], Worker=Nanny, timeout=90)
async def test_worker_holding_waiting_parent_dies(c, s, a, b, tmp_path):
    go = f"go-{uuid.uuid4().hex}"
    n = 8
    fut = c.compute(tree_sum(0, n, go, str(tmp_path), dask_key_name="root"))

    def root_waiting():
        ts = s.tasks.get("root")
        return (
            ts is not None
            and ts.processing_on is not None
            and ts in ts.processing_on.long_running
            and len(_lines(tmp_path, "starts")) == 7  # the whole tree is waiting
        )

    try:
        await async_poll_for(root_waiting, timeout=30)
        address = s.tasks["root"].processing_on.address
        (victim,) = [n_ for n_ in (a, b) if n_.worker_address == address]
        os.kill(victim.process.process.pid, signal.SIGKILL)
        await async_poll_for(lambda: address not in s.workers, timeout=30)
        assert not fut.done()
    finally:
        await Event(go).set()
    assert await fut.result(timeout=60) == sum(i * i for i in range(n))
    assert s.tasks["root"].suspicious >= 1  # it was running on the dead worker
    # The root ran its body again from the start.
    assert _lines(tmp_path, "starts").count(f"0-{n}") >= 2


# --------------------------------------------------------------------------
# bad yields


@coroutine
def yields_a_set(handle: bool):
    try:
        yield [inc(1), {1, 2}]
    except BadYieldError as e:
        if handle:
            return type(e), str(e)
        raise
    return None


@coroutine
async def awaits_a_set():
    await dask_coro.gather({"ok": inc(1), "bad": [0, frozenset({3})]})


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_yielding_a_set_raises_bad_yield_at_the_yield(c, s, a):
    r = Recorder()
    s.add_plugin(r)
    etype, msg = await c.compute(yields_a_set(True))
    assert etype is BadYieldError
    assert issubclass(etype, TypeError)
    assert "'yields_a_set'" in msg
    assert "position [1]" in msg and "yield #0" in msg
    # Rejected before anything was submitted: the valid sibling never ran.
    assert not [k for k in r.seen if str(k).startswith("inc-")]


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_unhandled_bad_yield_fails_the_task(c, s, a):
    with pytest.raises(BadYieldError, match=r"'yields_a_set'.*position \[1\]") as info:
        await c.compute(yields_a_set(False))
    assert isinstance(info.value, TypeError)

    with pytest.raises(BadYieldError, match=r"'awaits_a_set'.*position \['bad'\]\[1\]"):
        await c.compute(awaits_a_set())
    del info
    await async_poll_for(lambda: not s.tasks, timeout=20)
