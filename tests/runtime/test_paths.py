"""One answer on every path: the same coroutine run locally
(without a cluster) and on a cluster, with calls inline (the default) and
with every call a task (``coro.inline.enabled: False``), compared with what
plain Dask gives for the same program.

The cluster is one in-process worker with two threads (``processes=False``,
so ``dask.config.set`` here reaches the worker that runs the coroutine).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import threading

import dask
import pytest
from conformance import _set_idle
from distributed import Client, LocalCluster, worker_client

from dask_coro import coroutine, gather

# Each test runs on both engines, compiled and pure (conftest.engine).
pytestmark = pytest.mark.usefixtures("engine")

PATHS = ["local-inline", "local-task", "inline", "task"]


@pytest.fixture(scope="module")
def client():
    with LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
    ) as lc, Client(lc, set_as_default=False) as c:
        yield c


def compute(path, client, call):
    """``call`` computed on ``path``; its error raised here."""
    with dask.config.set({"coro.inline.enabled": path.endswith("inline")}):
        if path.startswith("local"):
            return call.compute(scheduler="sync")
        return client.compute(call).result()


def plain(path, client, obj):
    """``obj`` computed by plain Dask on ``path``'s scheduler."""
    return dask.compute(obj, scheduler="sync" if path.startswith("local") else client)[0]


@dask.delayed(pure=False)
def inc(x):
    return x + 1


# -- containers dask traverses are traversed ---------------


@dataclasses.dataclass
class Pair:
    a: object
    b: object


Point = collections.namedtuple("Point", "x y")


class SubDict(dict):
    pass


def containers():
    """Each container of Delayeds, made afresh (a Delayed is computed once)."""
    return {
        "ordered": lambda: collections.OrderedDict(a=inc(1), b=[inc(2), 5]),
        "dataclass": lambda: Pair(inc(1), {"k": inc(2)}),
        "namedtuple": lambda: Point(inc(1), (inc(2), 3)),
        "nested": lambda: [Pair(Point(inc(1), 0), collections.OrderedDict(z=inc(2)))],
        # Not traversed by dask.compute (dask/base.py unpack_collections walks
        # dict and OrderedDict by exact type): returned as it is, Delayeds in it.
        "dict-subclass": lambda: SubDict(a=1, b="x"),
    }


@coroutine
def yields(kind):
    got = yield containers()[kind]()
    return got


@coroutine
async def awaits(kind):
    return await gather(containers()[kind]())


@pytest.mark.parametrize("kind", list(containers()))
@pytest.mark.parametrize("body", [yields, awaits], ids=["yield", "await"])
@pytest.mark.parametrize("path", PATHS)
def test_containers_dask_traverses_are_traversed(client, path, body, kind):
    got = compute(path, client, body(kind))
    want = plain(path, client, containers()[kind]())
    assert got == want
    assert type(got) is type(want)


@pytest.mark.parametrize("path", PATHS)
def test_a_dict_subclass_is_a_plain_value_as_in_dask(client, path):
    @coroutine
    def f():
        d = SubDict(a=inc(1))
        got = yield d
        return got is d, type(got["a"]).__name__

    assert compute(path, client, f()) == (True, "Delayed")
    d = SubDict(a=inc(1))
    assert plain(path, client, d) is d


@coroutine
def takes(x):
    return x


@pytest.mark.parametrize("path", PATHS)
def test_containers_in_arguments_are_computed_as_dask_does(client, path):
    # A call with a container argument holding lazy values: computed in
    # place or as a task, its argument is what dask.delayed gives a task.
    @coroutine
    def f():
        return (yield [takes(Pair(inc(1), 2)), takes(Point(inc(1), inc(2)))])

    want = plain(path, client, [dask.delayed(takes.__wrapped__)(Pair(inc(1), 2)),
                                dask.delayed(takes.__wrapped__)(Point(inc(1), inc(2)))])
    assert compute(path, client, f()) == want == [Pair(2, 2), Point(2, 3)]


# -- a Delayed wrapping a Future, a Promise -----------------

CLUSTER_PATHS = ["inline", "task"]  # a Future needs a cluster


@coroutine
def yields_wrapped(kind, key):
    from distributed import Future, get_client

    from dask_coro import Promise

    if kind.startswith("promise"):
        p = Promise()
        p.resolve_with(inc(4))
        x = p if kind == "promise" else p + 1
    else:
        f = Future(key, get_client())
        x = {
            "delayed": dask.delayed(f),
            "delayed+1": dask.delayed(f) + 1,
            "call": dask.delayed(lambda v: v + 1)(f),
            "in-list": [dask.delayed(f), 1],
        }[kind]
    return (yield x)


@pytest.mark.parametrize("kind", ["delayed", "delayed+1", "call", "in-list", "promise", "promise+1"])
@pytest.mark.parametrize("path", CLUSTER_PATHS)
def test_a_delayed_wrapping_a_future_and_a_promise(client, path, kind):
    f = client.submit(lambda: 41, pure=False)
    want = {
        "delayed": 41,
        "delayed+1": 42,
        "call": 42,
        "in-list": [41, 1],
        "promise": 5,
        "promise+1": 6,
    }[kind]
    # plain Dask, for what it can express here
    if kind in ("delayed", "delayed+1", "call"):
        plain_value = {"delayed": dask.delayed(f), "delayed+1": dask.delayed(f) + 1,
                       "call": dask.delayed(lambda v: v + 1)(f)}[kind]
        assert plain(path, client, plain_value) == want
    assert compute(path, client, yields_wrapped(kind, f.key)) == want


# -- every lazy value built from a call is awaitable ---------


class Box:
    def __init__(self, v):
        self.v = v
        self.inner = {"k": [v, v + 1]}

    def times(self, k, plus=0):
        return self.v * k + plus

    def __getitem__(self, i):
        return self.v + i

    def __call__(self, x):
        return self.v - x


def box_body(v):
    return Box(v)


box = coroutine(box_body)
plain_box = dask.delayed(box_body, pure=True)


def derived(b):
    """The lazy values a user builds from a call (or a Delayed) ``b``."""
    return {
        "attr": lambda: b.v,
        "attr.attr[i]": lambda: b.inner["k"][1],
        "item": lambda: b[10],
        "method": lambda: b.times(3),
        "method-kwargs": lambda: b.times(2, plus=inc(0)),
        "call": lambda: b(1),
        "operator": lambda: b.v * 2 + 1,
        "swapped": lambda: 100 - b.v,
        "attr-of-method": lambda: b.times(3).real,
    }


EXPRESSIONS = list(derived(None))


@coroutine
async def awaits_derived(name):
    return await derived(box(7))[name]()


@coroutine
async def gathers_derived(name):
    return await gather(derived(box(7))[name]())


@coroutine
def yields_derived(name):
    return (yield derived(box(7))[name]())


@pytest.mark.parametrize("name", EXPRESSIONS)
@pytest.mark.parametrize("path", PATHS)
def test_await_of_every_lazy_value_built_from_a_call(client, path, name):
    want = plain(path, client, derived(plain_box(7))[name]())
    assert not dask.is_dask_collection(want)
    assert compute(path, client, awaits_derived(name)) == want
    assert compute(path, client, gathers_derived(name)) == want
    assert compute(path, client, yields_derived(name)) == want


# -- recursion with task children, deep, without a cluster --

LOCAL_PATHS = ["local-inline", "local-task"]


@coroutine(inline=False)
def down_tasks(n):
    if n == 0:
        return 0
    return (yield down_tasks(n - 1)) + 1


@coroutine
def down_lazy(n):
    # A lazy argument: a plain dask.delayed one keeps the call a task.
    if n == 0:
        return 0
    return (yield down_lazy(inc(n - 2))) + 1


@pytest.mark.parametrize("body", [down_tasks, down_lazy], ids=["inline=False", "lazy-argument"])
@pytest.mark.parametrize("path", LOCAL_PATHS)
def test_deep_recursion_of_task_children_without_a_cluster(path, body):
    import sys

    depth = 600
    # Under the interpreter's default limit: jedi (which IPython imports, and
    # progress() in a notebook imports IPython) raises this process's limit
    # to 3000 when it is imported, so an earlier test may have raised it.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        assert depth > sys.getrecursionlimit() / 2  # a level took ~14 frames before
        assert compute(path, None, body(depth)) == depth
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.parametrize("path", CLUSTER_PATHS)
def test_recursion_of_task_children_on_a_cluster(client, path):
    # The same program, shallower (every level is a task here): one answer.
    assert compute(path, client, down_tasks(30)) == 30
    assert compute(path, client, down_lazy(30)) == 30


# -- a BaseException subclass raised by a child ------------


class UserBase(BaseException):
    """A user's BaseException subclass (not SystemExit/KeyboardInterrupt)."""


def raises_base(kind):
    if kind == "system-exit":
        raise SystemExit(3)
    raise UserBase("from the child")


child_inline = coroutine(raises_base, name="child_inline")
child_task = coroutine(raises_base, inline=False, name="child_task")


@coroutine
def catches_base(kind, task):
    child = {False: child_inline, True: child_task, "delayed": dask.delayed(raises_base)}[task]
    try:
        yield child(kind)
    except BaseException as e:
        return f"caught {type(e).__name__}: {e}"
    return "not raised"


@pytest.mark.parametrize("task", [False, True, "delayed"], ids=["inline-child", "task-child", "delayed-child"])
@pytest.mark.parametrize("kind", ["user", "system-exit"])
@pytest.mark.parametrize("path", LOCAL_PATHS)
def test_a_base_exception_of_a_child_is_raised_at_the_yield_locally(path, kind, task):
    want = "caught UserBase: from the child" if kind == "user" else "caught SystemExit: 3"
    assert compute(path, None, catches_base(kind, task)) == want
    # plain Dask on the sync scheduler raises it to the caller, type kept
    with pytest.raises(UserBase if kind == "user" else SystemExit):
        dask.compute(dask.delayed(raises_base)(kind), scheduler="sync")


@pytest.mark.parametrize("task", [False, True, "delayed"], ids=["inline-child", "task-child", "delayed-child"])
@pytest.mark.parametrize("path", CLUSTER_PATHS)
def test_a_base_exception_of_a_child_is_raised_at_the_yield_on_a_cluster(client, path, task):
    # (SystemExit and KeyboardInterrupt are not tried here: distributed's
    # worker passes them on to its event loop, _run_task_async, which stops.)
    assert compute(path, client, catches_base("user", task)) == "caught UserBase: from the child"


@coroutine
def root_raises_base():
    yield inc(1)
    raise UserBase("from the root")


@pytest.mark.parametrize("path", PATHS)
def test_a_root_raising_a_base_exception(client, path):
    # Locally dask's synchronous scheduler raises it as it is. On a cluster a
    # client never returns from a task that ended with one (a plain task's
    # Future.result() waits forever: distributed.utils.sync catches Exception
    # only), so the coroutine's task ends with BaseExceptionError instead.
    from dask_coro import BaseExceptionError

    if path.startswith("local"):
        with pytest.raises(UserBase, match="from the root"):
            compute(path, client, root_raises_base())
        return
    with pytest.raises(BaseExceptionError, match="UserBase") as info:
        compute(path, client, root_raises_base())
    assert type(info.value.error) is UserBase
    assert str(info.value.error) == "from the root"


async def cancels_itself(x):
    await asyncio.sleep(0.01)
    raise asyncio.CancelledError(f"by itself {x}")


cancels_inline = coroutine(cancels_itself, name="cancels_inline")
cancels_task = coroutine(cancels_itself, inline=False, name="cancels_task")


@coroutine
def catches_cancelled(task):
    try:
        yield (cancels_task if task else cancels_inline)(1)
    except asyncio.CancelledError as e:
        return f"caught CancelledError: {e}"
    return "not raised"


@coroutine
async def root_cancels_itself():
    await inc(1)
    raise asyncio.CancelledError("from the root")


@pytest.mark.parametrize("task", [False, True], ids=["inline-child", "task-child"])
@pytest.mark.parametrize("path", PATHS)
def test_a_body_raising_its_own_cancelled_error(client, path, task):
    # A body's own CancelledError is its error, not a cancel: a task that
    # ended with one was taken for a cancelled task on a worker (rescheduled,
    # raising again for ever: a hang). The parent is given it at its yield
    # on every path.
    assert compute(path, client, catches_cancelled(task)) == "caught CancelledError: by itself 1"


@pytest.mark.parametrize("path", PATHS)
def test_a_root_raising_its_own_cancelled_error(client, path):
    from dask_coro import BaseExceptionError

    if path.startswith("local"):
        with pytest.raises(asyncio.CancelledError, match="from the root"):
            compute(path, client, root_cancels_itself())
        return
    # As any BaseException a client could not be given (above).
    with pytest.raises(BaseExceptionError, match="CancelledError") as info:
        compute(path, client, root_cancels_itself())
    assert type(info.value.error) is asyncio.CancelledError


# -- a cancel stops inline calls at the next call ------------


GATE = threading.Event()  # in-process workers: the test and the calls share it
STARTED: list[int] = []
CLOSED: list[str] = []


def step_body(i):
    STARTED.append(i)
    if i == 5:
        GATE.wait(60)  # held until the worker knows of the cancel
    return i


step_inline = coroutine(step_body, name="step_inline")
step_task = coroutine(step_body, inline=False, name="step_task")


@coroutine
def many_steps(task):
    try:
        for i in range(1000):
            yield (step_task if task else step_inline)(i)
    finally:
        CLOSED.append("finally")


@pytest.mark.parametrize("path", CLUSTER_PATHS)
def test_cancel_stops_calls_at_the_next_call(client, path):
    from distributed.utils import sync

    GATE.clear()
    STARTED.clear()
    CLOSED.clear()
    (worker,) = client.cluster.workers.values()
    with dask.config.set({"coro.inline.enabled": path == "inline"}):
        call = many_steps(path == "task")
        fut = client.compute(call)
        key = fut.key

        async def until(predicate):
            from distributed.utils_test import async_poll_for

            await async_poll_for(predicate, timeout=30)

        sync(client.loop, until, lambda: 5 in STARTED)
        assert key in worker.state.tasks
        fut.cancel()
        # The worker learned of it: its task no longer runs there.
        sync(client.loop, until, lambda: getattr(worker.state.tasks.get(key), "state", None)
             not in ("executing", "long-running"))
        GATE.set()
        sync(client.loop, until, lambda: CLOSED == ["finally"])
    # Call 5 was running when the cancel came; none started after it.
    assert STARTED == list(range(6))


# -- yielding a call again after it raised -----------------

RUNS: list[int] = []  # in-process workers: the calls append here


def flaky_body(x):
    RUNS.append(x)
    if len(RUNS) == 1:
        raise ValueError("first run fails")
    return len(RUNS)


flaky_inline = coroutine(flaky_body, name="flaky_inline")
flaky_task = coroutine(flaky_body, inline=False, name="flaky_task")


@coroutine
def yields_again(how):
    c = (flaky_task if how.endswith("task") else flaky_inline)(1)
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append((yield (takes(c) if how.startswith("argument") else c)))
        except ValueError as e:
            outcomes.append(f"ValueError: {e}")
    return outcomes


@pytest.mark.parametrize("how", ["same-call", "same-task", "argument", "argument-task"])
@pytest.mark.parametrize("path", PATHS)
def test_a_call_that_raised_raises_again_when_yielded_again(client, path, how):
    RUNS.clear()
    got = compute(path, client, yields_again(how))
    assert got == ["ValueError: first run fails"] * 2
    assert RUNS == [1]  # its outcome is kept: it did not run again


@pytest.mark.parametrize("path", CLUSTER_PATHS)
def test_plain_dask_keeps_an_erred_key_s_outcome(client, path):
    # The rule borrowed: a key computed to an error, asked for again while
    # held, gives the same error; its task does not run again.
    RUNS.clear()
    d = dask.delayed(flaky_body, pure=False)(1)
    first = client.compute(d)
    with pytest.raises(ValueError, match="first run fails"):
        first.result()
    second = client.compute(d)
    with pytest.raises(ValueError, match="first run fails"):
        second.result()
    assert RUNS == [1]


# -- handed out: an unstarted inline call becomes a task ----------------------
# A sibling that waits on the cluster first (an inline call yielding a plain
# task) makes the engine promote every unstarted call of the stack to a task
# before it waits: the path a stolen call takes (handed out, planned as
# itself), here without depending on when a thread is idle.


@coroutine
def waits_first():
    return (yield inc(0))


@coroutine
def handed_out_again():
    c = flaky_inline(1)
    outcomes = []
    try:
        outcomes.append((yield c))  # runs inline, raises
    except ValueError as e:
        outcomes.append(f"ValueError: {e}")
    try:
        outcomes.append((yield [waits_first(), c])[1])  # c handed out as a task
    except ValueError as e:
        outcomes.append(f"ValueError: {e}")
    return outcomes


def test_handed_out_a_call_that_raised_raises_again(client):
    RUNS.clear()
    assert compute("inline", client, handed_out_again()) == ["ValueError: first run fails"] * 2
    assert RUNS == [1]


@coroutine
async def handed_out_derived(name):
    _, value = await gather([waits_first(), derived(box(7))[name]()])
    return value


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_handed_out_lazy_values_built_from_a_call(client, name):
    want = plain("inline", client, derived(plain_box(7))[name]())
    assert compute("inline", client, handed_out_derived(name)) == want


@coroutine
def handed_out_wrapped(key):
    from distributed import Future, get_client

    f = Future(key, get_client())
    return (yield [waits_first(), dask.delayed(f) + 1])[1]


def test_handed_out_a_delayed_wrapping_a_future(client):
    f = client.submit(lambda: 41, pure=False)
    assert compute("inline", client, handed_out_wrapped(f.key)) == 42


# -- two lazy values on one call, each computed in place, in one yield -------


@coroutine
def pair_counted():
    RUNS.append(1)
    yield []
    return (40, 2)


@coroutine
def items_of_one_call(also_the_call):
    c = pair_counted()
    return (yield [c[0], c[1], c] if also_the_call else [c[0], c[1]])


@pytest.mark.parametrize("also_the_call", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_items_of_one_call_computed_in_place_run_it_once(client, path, also_the_call):
    """Each item is computed in place; the second found the call computed by
    the first and ran it again (one key in dask: one run)."""
    RUNS.clear()
    want = [40, 2, (40, 2)] if also_the_call else [40, 2]
    assert compute(path, client, items_of_one_call(also_the_call)) == want
    assert RUNS == [1]


# -- a child's error has one type on every path --------------------------------


class Unpicklable(Exception):
    """No pickle round trip survives it (it holds a lock)."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


def raises_kind(kind):
    if kind == "stop":
        raise StopIteration("done early")
    raise Unpicklable("holds a lock")


@coroutine
def catches_kind(kind, child):
    made = {
        "inline": coroutine(raises_kind, name="raises-inline"),
        "task": coroutine(raises_kind, inline=False, name="raises-task"),
        "delayed": dask.delayed(raises_kind, pure=False),
    }[child]
    try:
        yield made(kind)
    except BaseException as e:
        return type(e).__name__, str(e), type(e.__cause__).__name__
    return "not raised"


def catches_kind_as_a_task(kind):
    """The same program as a worker_client task: plain Dask's answer."""
    with worker_client() as c:
        try:
            c.submit(raises_kind, kind, pure=False).result()
        except BaseException as e:
            return type(e).__name__, str(e), type(e.__cause__).__name__
    return "not raised"


@pytest.mark.parametrize("child", ["inline", "task", "delayed"])
@pytest.mark.parametrize("kind", ["stop", "unpicklable"])
@pytest.mark.parametrize("path", [*PATHS, "stolen"])
def test_a_childs_error_has_the_type_a_task_gives_on_every_path(client, path, kind, child):
    """StopIteration, and an error no pickle survives, reach the parent as
    they come from a task on a cluster (RuntimeError; distributed's
    Exception(repr(e))), whether the child ran inline, as a task, or without
    a cluster: the type does not depend on whether an idle thread took it."""
    want = client.submit(catches_kind_as_a_task, kind, pure=False).result()
    assert want == (
        ("RuntimeError", "coroutine raised StopIteration", "StopIteration")
        if kind == "stop"
        else ("Exception", "Unpicklable('holds a lock')", "NoneType")
    )
    if path == "stolen":  # every inline call handed out to an idle thread
        client.run(_set_idle, always=True)
        try:
            got = compute("inline", client, catches_kind(kind, child))
        finally:
            client.run(_set_idle, always=False)
    else:
        got = compute(path, client, catches_kind(kind, child))
    assert got == want


# -- a context variable set in a call stays in it ----------------------------

CV: contextvars.ContextVar[str] = contextvars.ContextVar("dask_coro_test_paths", default="unset")


@coroutine
def sets_plain(x):
    CV.set(x)
    return CV.get()


@coroutine
def sets_then_yields(x):
    CV.set(x)
    inner = yield sets_plain(x + "-inner")
    return CV.get(), inner  # its own, kept from step to step; not its child's


@coroutine
async def sets_then_awaits(x):
    CV.set(x)
    inner = await sets_plain(x + "-inner")
    return CV.get(), inner


@coroutine
def parent_of_setters():
    CV.set("parent")
    got = yield [sets_plain("a"), sets_then_yields("b"), sets_then_awaits("c"), sets_plain("d")]
    return got, CV.get()


def _sets_in_a_task(x):
    CV.set(x)
    return CV.get()


def plain_parent_of_setters():
    """The same program as a worker_client task: what its children set
    never reaches it."""
    CV.set("parent")
    with worker_client() as c:
        got = c.gather([c.submit(_sets_in_a_task, x, pure=False) for x in "abcd"])
    return got, CV.get()


@coroutine
def resets_after_a_yield(x):
    token = CV.set(x)
    inner = yield sets_plain(x + "-inner")
    kept = CV.get()
    CV.reset(token)  # ValueError unless in the very context it was set in
    with dask.annotate(priority=1):  # a context manager around a yield
        again = yield sets_plain(x + "-again")
    return kept, inner, again


@coroutine
async def resets_after_an_await(x):
    token = CV.set(x)
    inner = await sets_plain(x + "-inner")
    kept = CV.get()
    CV.reset(token)
    return kept, inner


@coroutine
def parent_of_resetters():
    token = CV.set("parent")
    got = yield [resets_after_a_yield("a"), resets_after_an_await("b"), resets_after_a_yield("c")]
    kept = CV.get()
    CV.reset(token)
    return got, kept


@pytest.mark.parametrize("path", PATHS)
def test_a_context_variable_set_before_a_yield_is_reset_after_it(client, path):
    """A body that sets a ContextVar before a yield (or an await) resets it
    after, with the token it got (``with dask.annotate(...)`` around a yield
    does): its steps run in the very context it set it in, on every path, as
    a task's do."""
    want = ([("a", "a-inner", "a-again"), ("b", "b-inner"), ("c", "c-inner", "c-again")], "parent")
    assert compute(path, client, parent_of_resetters()) == want


@pytest.mark.parametrize("path", [*PATHS, "stolen"])
def test_a_context_variable_set_in_a_call_stays_in_it(client, path):
    """A ContextVar a call sets (a plain function, a generator or an async
    body, on any of its steps) reaches neither its caller nor its siblings,
    whether it ran inline or as a task, as in plain Dask; a body keeps what
    it set from one step to the next."""
    assert client.submit(plain_parent_of_setters, pure=False).result() == (list("abcd"), "parent")
    want = (["a", ("b", "b-inner"), ("c", "c-inner"), "d"], "parent")
    if path == "stolen":  # every inline call handed out to an idle thread
        client.run(_set_idle, always=True)
        try:
            got = compute("inline", client, parent_of_setters())
        finally:
            client.run(_set_idle, always=False)
    else:
        got = compute(path, client, parent_of_setters())
    assert got == want
