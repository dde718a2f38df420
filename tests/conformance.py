"""Random coroutine programs, the coroutines that run them, and a reference
interpreter in plain Python (tests/runtime/test_conformance.py runs them on every path).

A program is plain data (nested tuples), passed to its coroutine pickled:
bytes are a plain argument, so the call may run inline. A *node* is one coroutine call::

    ("node", ident, form, inline, steps)

``form`` is how its body waits: ``"gen"`` (``v = yield s``), ``"async"``
(``v = await gather(s)``) or ``"plain"`` (``v = result(s)`` from a helper the
body calls). ``inline`` False makes it ``@coroutine(inline=False)``. Each step
is one of::

    ("wait", shape, catch, p) wait for the children in ``shape``; with ``catch``
                             an exception at the wait is recorded, not raised;
                             with a priority ``p`` (not None), under
                             ``dask.annotate(priority=p)``
    ("raise", kind)          raise ``kind`` naming the node (``("raise",)``: ValueError)
    ("group", children, limit, catch)
                             open ``dask_coro.group(limit=limit)``, spawn each
                             child (a leaf, a future or a call), and take
                             every one with ``next()``; an event
                             ``("group", delivered)`` lists ``("ok", index,
                             value)`` or ``("err", index, type, message)`` in
                             the order they were delivered; without ``catch``
                             a child's error leaves the group (the rest are
                             cancelled) and the node
    ("emit", x)              ``emit(x)``: hand the int ``x`` to the stream this
                             node produces (only a stream step's producer has
                             these; anywhere else an item is dropped)
    ("stream", producer, buffer, catch, grouped)
                             read ``dask_coro.stream(call of producer,
                             buffer=buffer)`` to its end (in a ``for`` loop,
                             or, ``grouped``, spawned in a group); an event
                             ``("stream", items, ("ok", its value) or ("err",
                             type, message))``: the items it emitted before
                             its end, then its value or its error (raised
                             again without ``catch``)

A shape nests children in containers dask traverses (list, tuple, dict, a
namedtuple, an OrderedDict, a dataclass). A child is::

    ("leaf", x, fail)        dask.delayed(leaf, pure=False)(x, fail): x, or raises
                             (``fail`` False, or the kind of error: see ``KINDS``)
    ("future", x, fail)      the same leaf submitted by the worker's client: a
                             Future (programs holding one run on the cluster
                             paths only)
    ("call", node)           a coroutine call of ``node``
    ("get", how, child)      a lazy value of a call child: ``c[0]``, ``c.total``
                             or ``c.total + 1``
    ("again", j)             the j-th child this node made, yielded again

A node returns ``Out(total, events)``: one event per wait, ``("ok",
description of the value)`` or ``("err", type name, message)``, and the sum
of every number it received. Every leaf and node counts its runs in ``RUNS``,
under the epoch of the program's run it belongs to
(gen_cluster's workers share this process).

The rules the reference applies are the ones docs/coroutines.md states: a
yield resumes with its children's values in the yielded shape, through every
container dask traverses; an error of a child is raised at the yield with its
type and message; a child yielded again gives its first outcome (value or
error) and does not run again; a node body runs once, a leaf once; a
child's error reaches its parent as a task's would on a cluster (an error
that cannot be pickled as distributed's ``Exception(repr(e))``, a
``StopIteration`` as ``RuntimeError``), while the root's own error is what
the scheduler computing it gives (``ERRORS``). A group
delivers its children one at a time in spawn order without a cluster, in any
order on one (the order results arrive): the comparison sorts a group's
deliveries on the cluster paths, and takes them as they are on the local ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import pickle
import threading
import time
from collections import Counter, OrderedDict, namedtuple
from typing import Any

import dask
from helpers import Background

import dask_coro
from dask_coro import coroutine, gather, result

RUNS: Counter = Counter()
_RUNS_LOCK = threading.Lock()

Out = namedtuple("Out", "total events")
Pair = namedtuple("Pair", "a b")


class Unpicklable(Exception):
    """An error no pickle round trip survives: it holds a lock."""

    def __init__(self, message: str):
        super().__init__(message)
        self.lock = threading.Lock()


#: The errors a leaf or a node may raise (a fail of True, and a bare
#: ``("raise",)``, are ValueError).
KINDS = {"ValueError": ValueError, "StopIteration": StopIteration, "Unpicklable": Unpicklable}


def _raise(fail: Any, message: str) -> None:
    raise KINDS["ValueError" if fail is True else fail](message)


@dataclasses.dataclass
class Box:
    a: Any
    b: Any


# ----------------------------------------------------------------------------
# What runs: the same interpreter for every body form.


#: Which run of a program this is: every call carries it, and counts under
#: it (a leaf of an earlier run, cancelled while its thread still ran, may
#: finish during a later one: it counts for its own).
EPOCH = [0]


def _ran(epoch: int, what: tuple) -> None:
    with _RUNS_LOCK:
        RUNS[(epoch, *what)] += 1


def runs_of(epoch: int) -> Counter:
    """The runs counted for run ``epoch``, as ``(kind, id)``."""
    with _RUNS_LOCK:
        return Counter({k[1:]: v for k, v in RUNS.items() if k[0] == epoch})


def leaf(x: int, fail: bool, epoch: int = 0) -> int:
    _ran(epoch, ("leaf", x))
    time.sleep(0.005 * (x % 3))  # some leaves take a while: a cancel may come meanwhile
    if fail:
        _raise(fail, f"leaf {x} failed")
    return x


def _build(spec: Any, made: list, epoch: int) -> Any:
    """The lazy object (or container of them) a shape spec stands for."""
    kind = spec[0]
    if kind == "leaf":
        obj = dask.delayed(leaf, pure=False)(spec[1], spec[2], epoch)
        made.append(obj)
        return obj
    if kind == "future":  # a Future of the worker's client (cluster paths only)
        from distributed import get_client

        obj = get_client().submit(leaf, spec[1], spec[2], epoch, pure=False)
        made.append(obj)
        return obj
    if kind == "call":
        node = spec[1]
        obj = FUNCTIONS[node[2], node[3]](pickle.dumps((epoch, node)))
        made.append(obj)
        return obj
    if kind == "get":
        c = _build(spec[2], made, epoch)
        return c[0] if spec[1] == "item" else c.total if spec[1] == "attr" else c.total + 1
    if kind == "again":
        return made[spec[1]]
    items = [_build(s, made, epoch) for s in spec[1]]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    if kind == "pair":
        return Pair(*items)
    if kind == "box":
        return Box(*items)
    if kind == "dict":
        return {f"k{i}": v for i, v in enumerate(items)}
    if kind == "odict":
        return OrderedDict((f"k{i}", v) for i, v in enumerate(items))
    raise AssertionError(spec)


def describe(v: Any) -> Any:
    """A value as plain data, container types named, so paths compare exactly."""
    if type(v) is Out:
        return ("Out", v.total, v.events)
    if type(v) is Pair:
        return ("Pair", describe(v.a), describe(v.b))
    if type(v) is Box:
        return ("Box", describe(v.a), describe(v.b))
    if type(v) is OrderedDict:
        return ("OrderedDict", tuple((k, describe(x)) for k, x in v.items()))
    if type(v) is dict:
        return ("dict", tuple((k, describe(x)) for k, x in v.items()))
    if type(v) in (list, tuple):
        return (type(v).__name__, tuple(describe(x) for x in v))
    if type(v) is int:
        return v
    return ("unexpected", type(v).__name__)  # an uncomputed Delayed, say


def _numbers(d: Any) -> int:
    if type(d) is int:
        return d
    if type(d) is tuple:
        return sum(_numbers(x) for x in d)
    return 0


def _annotated(step: tuple) -> Any:
    """``dask.annotate(priority=p)`` around a wait whose step asks for it: a
    value-neutral annotation (the children become tasks carrying it)."""
    if len(step) > 3 and step[3] is not None:
        return dask.annotate(priority=step[3])
    return contextlib.nullcontext()


def _record(events: list, got: Any) -> int:
    d = describe(got)
    events.append(("ok", d))
    return _numbers(d)


def _error(events: list, e: BaseException) -> None:
    events.append(("err", type(e).__name__, str(e)))


def _delivered(delivered: list, step: tuple, got: Any = None, error: BaseException | None = None) -> None:
    """One child delivered by a group step: its value, or its error (raised
    again without ``catch``)."""
    if error is None:
        child, value = got
        delivered.append(("ok", child.index, describe(value)))
        return
    if not step[3]:
        raise error
    delivered.append(("err", error.dask_coro_child.index, type(error).__name__, str(error)))  # type: ignore[attr-defined]


def _group_event(events: list, delivered: list) -> int:
    events.append(("group", tuple(delivered)))
    return sum(_numbers(d[2]) for d in delivered if d[0] == "ok")


def _open_stream(step: tuple, epoch: int) -> Any:
    producer = step[1]
    return dask_coro.stream(FUNCTIONS[producer[2], producer[3]](pickle.dumps((epoch, producer))), buffer=step[2])


def _stream_event(events: list, step: tuple, items: list, s: Any, error: BaseException | None) -> int:
    """The event of a stream step: its items, then its value or its error
    (raised again without ``catch``)."""
    if error is not None:
        if not step[3]:
            raise error
        end: tuple = ("err", type(error).__name__, str(error))
    else:
        end = ("ok", describe(s.result))
    events.append(("stream", tuple(items), end))
    return sum(items) + (_numbers(end[1]) if end[0] == "ok" else 0)


def _read_stream(step: tuple, epoch: int, events: list) -> int:
    """A stream step in a generator body or plain code: ``for`` waits as
    ``result()`` does."""
    s = _open_stream(step, epoch)
    items: list = []
    try:
        if step[4]:
            with dask_coro.group() as g:
                g.spawn(s)
                for _, item in g:
                    items.append(item)
        else:
            for item in s:
                items.append(item)
    except Exception as e:
        return _stream_event(events, step, items, s, e)
    return _stream_event(events, step, items, s, None)


async def _aread_stream(step: tuple, epoch: int, events: list) -> int:
    s = _open_stream(step, epoch)
    items: list = []
    try:
        if step[4]:
            async with dask_coro.group() as g:
                g.spawn(s)
                async for _, item in g:
                    items.append(item)
        else:
            async for item in s:
                items.append(item)
    except Exception as e:
        return _stream_event(events, step, items, s, e)
    return _stream_event(events, step, items, s, None)


def _gen(src: bytes) -> Any:
    epoch, node = pickle.loads(src)
    _ran(epoch, ("node", node[1]))
    try:
        made: list = []
        events: list = []
        total = 0
        for step in node[4]:
            if step[0] == "raise":
                _raise(step[1] if len(step) > 1 else True, f"node {node[1]} raised")
            if step[0] == "emit":
                yield dask_coro.emit(step[1])
                continue
            if step[0] == "stream":
                total += _read_stream(step, epoch, events)
                continue
            if step[0] == "group":
                delivered: list = []
                with dask_coro.group(limit=step[2]) as g:
                    for spec in step[1]:
                        g.spawn(_build(spec, [], epoch))  # never yielded again
                    while g:
                        try:
                            got = yield g.next()
                        except Exception as e:
                            _delivered(delivered, step, error=e)
                        else:
                            _delivered(delivered, step, got)
                total += _group_event(events, delivered)
                continue
            shape = _build(step[1], made, epoch)
            with _annotated(step):  # in effect at the yield, made before it
                if step[2]:
                    try:
                        got = yield shape
                    except Exception as e:
                        _error(events, e)
                        continue
                else:
                    got = yield shape
            total += _record(events, got)
        return Out(total + len(events), tuple(events))
    finally:
        _ran(epoch, ("end", node[1]))  # returned, raised or closed


async def _async(src: bytes) -> Any:
    epoch, node = pickle.loads(src)
    _ran(epoch, ("node", node[1]))
    try:
        made: list = []
        events: list = []
        total = 0
        for step in node[4]:
            if step[0] == "raise":
                _raise(step[1] if len(step) > 1 else True, f"node {node[1]} raised")
            if step[0] == "emit":
                await dask_coro.emit(step[1])
                continue
            if step[0] == "stream":
                total += await _aread_stream(step, epoch, events)
                continue
            if step[0] == "group":
                delivered: list = []
                async with dask_coro.group(limit=step[2]) as g:
                    for spec in step[1]:
                        g.spawn(_build(spec, [], epoch))  # never yielded again
                    while g:
                        try:
                            got = await g.next()
                        except Exception as e:
                            _delivered(delivered, step, error=e)
                        else:
                            _delivered(delivered, step, got)
                total += _group_event(events, delivered)
                continue
            shape = _build(step[1], made, epoch)
            # A call, or a lazy value of one, is awaited as it is; anything else
            # (a plain Delayed has dask's own __await__) through gather.
            direct = step[1][0] in ("call", "get")
            with _annotated(step):
                if step[2]:
                    try:
                        got = await (shape if direct else gather(shape))
                    except Exception as e:
                        _error(events, e)
                        continue
                else:
                    got = await (shape if direct else gather(shape))
            total += _record(events, got)
        return Out(total + len(events), tuple(events))
    finally:
        _ran(epoch, ("end", node[1]))  # returned, raised or closed


def _wait_from_a_helper(shape: Any) -> Any:
    return result(shape)


def _plain(src: bytes) -> Any:
    epoch, node = pickle.loads(src)
    _ran(epoch, ("node", node[1]))
    try:
        made: list = []
        events: list = []
        total = 0
        for step in node[4]:
            if step[0] == "raise":
                _raise(step[1] if len(step) > 1 else True, f"node {node[1]} raised")
            if step[0] == "emit":
                dask_coro.emit(step[1])  # from plain code: waits there as result() does
                continue
            if step[0] == "stream":
                total += _read_stream(step, epoch, events)
                continue
            if step[0] == "group":
                delivered: list = []
                with dask_coro.group(limit=step[2]) as g:
                    for spec in step[1]:
                        g.spawn(_build(spec, [], epoch))  # never yielded again
                    while g:
                        try:
                            got = _wait_from_a_helper(g.next())
                        except Exception as e:
                            _delivered(delivered, step, error=e)
                        else:
                            _delivered(delivered, step, got)
                total += _group_event(events, delivered)
                continue
            shape = _build(step[1], made, epoch)
            with _annotated(step):
                if step[2]:
                    try:
                        got = _wait_from_a_helper(shape)
                    except Exception as e:
                        _error(events, e)
                        continue
                else:
                    got = _wait_from_a_helper(shape)
            total += _record(events, got)
        return Out(total + len(events), tuple(events))
    finally:
        _ran(epoch, ("end", node[1]))  # returned, raised or closed


def gen_node(src: bytes) -> Any:
    return (yield from _gen(src))


FUNCTIONS = {
    ("gen", True): coroutine(gen_node, name="gen"),
    ("gen", False): coroutine(inline=False, name="gen-task")(gen_node),
    ("async", True): coroutine(_async, name="async"),
    ("async", False): coroutine(inline=False, name="async-task")(_async),
    ("plain", True): coroutine(_plain, name="plain"),
    ("plain", False): coroutine(inline=False, name="plain-task")(_plain),
}


def root_call(node: tuple) -> Any:
    return FUNCTIONS[node[2], node[3]](pickle.dumps((EPOCH[0], node)))


# ----------------------------------------------------------------------------
# The reference: the same program in plain Python.


class Raised(Exception):
    """An outcome of the reference: what the program raises. ``local``: what
    dask's local schedulers raise instead, if that differs (the root's own
    error, see ``ERRORS``)."""

    def __init__(self, kind: str, message: str, local: tuple[str, str] | None = None):
        super().__init__(kind, message)
        self.kind, self.message = kind, message
        self.local = local


def error_seen(kind: str, message: str, form: str | None, caller: str = "parent") -> tuple[str, str]:
    """``(type name, message)`` of an error of ``kind`` raised by a leaf
    (``form`` None: a plain function) or by a node body of ``form``, as its
    parent catches it at a yield (``caller="parent"``, on every path: what a
    task's Future raises on a cluster), or as the program's caller gets it
    from the root (``"cluster"``: the same; ``"local"``: dask's local
    schedulers raise the original, as for any task).

    Python itself turns a ``StopIteration`` raised in a generator or an
    ``async def`` body into ``RuntimeError`` (PEP 479) on every path; one
    raised by a plain function reaches a parent as ``RuntimeError`` too, as
    distributed's client raises it inside a coroutine. An error no pickle
    survives reaches it as distributed's stand-in, ``Exception(repr(e))``."""
    if kind == "ValueError":
        return kind, message
    if kind == "StopIteration":
        if form == "gen":
            return "RuntimeError", "generator raised StopIteration"
        if form == "async" or caller != "local":
            return "RuntimeError", "coroutine raised StopIteration"
        return "StopIteration", message
    assert kind == "Unpicklable", kind
    if caller == "local":
        return "Unpicklable", message
    return "Exception", f"Unpicklable({message!r})"


#: The rule ``error_seen`` applies (docs/coroutines.md, "One answer on every path").
ERRORS = error_seen


class Ambiguous(Exception):
    """A wait whose children raise different errors: which one the yield
    raises is the first to fail, a matter of timing. The test skips these."""


class Reference:
    def __init__(self) -> None:
        self.runs: Counter = Counter()
        # Runs the rules leave open: the siblings of a child that failed
        # (and all below them) may have run, or not, or been cancelled.
        self.open: set = set()
        self.raised = False  # anything raised, caught or not

    def node(self, node: tuple, sink: list | None = None) -> Out:
        """A node's run; ``sink``: the items it emits, as a stream's producer
        (else dropped)."""
        self.runs[("node", node[1])] += 1
        made: list = []
        events: list = []
        total = 0
        for step in node[4]:
            if step[0] == "raise":
                self.raised = True
                kind = step[1] if len(step) > 1 and step[1] is not True else "ValueError"
                message = f"node {node[1]} raised"
                seen = error_seen(kind, message, node[2])
                local = error_seen(kind, message, node[2], "local") if node[1] == 0 else None
                raise Raised(*seen, local if local != seen else None)
            if step[0] == "emit":
                if sink is not None:
                    sink.append(step[1])
                continue
            if step[0] == "stream":
                items: list = []
                try:
                    out = self.node(step[1], items)
                except Raised as e:
                    if not step[3]:
                        raise
                    events.append(("stream", tuple(items), ("err", e.kind, e.message)))
                    total += sum(items)
                    continue
                value = ("Out", out.total, out.events)
                events.append(("stream", tuple(items), ("ok", value)))
                total += sum(items) + _numbers(value)
                continue
            if step[0] == "group":
                delivered = self.group(step)
                events.append(("group", tuple(delivered)))
                total += sum(_numbers(d[2]) for d in delivered if d[0] == "ok")
                continue
            try:
                got = self.wait(step[1], made)
            except Raised as e:
                if not step[2]:
                    raise
                events.append(("err", e.kind, e.message))
                continue
            d = got
            events.append(("ok", d))
            total += _numbers(d)
        return Out(total + len(events), tuple(events))

    def group(self, step: tuple) -> list:
        """A group step: its children one at a time in spawn order (the order
        without a cluster; on one, the comparison sorts them). Without
        ``catch`` the first error leaves the group: which child fails first
        is a matter of timing on a cluster if two may, and the other
        children may have run, or not, or been cancelled."""
        children = step[1]
        failing = [spec for spec in children if _may_fail(spec)]
        delivered: list = []
        for i, spec in enumerate(children):
            ok, v = self._child(spec, [])
            if ok:
                delivered.append(("ok", i, ("Out", v.total, v.events) if type(v) is Out else v))
                continue
            if not step[3]:
                if len(failing) > 1:
                    raise Ambiguous("two children of a group may fail first")
                for other in children:
                    if other is not spec:
                        self.open |= _runs_below(other)
                raise v
            delivered.append(("err", i, v.kind, v.message))
        return delivered

    def wait(self, shape: Any, made: list) -> Any:
        """The described value of a yielded shape, or ``Raised``."""
        errors: list[Raised] = []
        ok: list = []
        failing: list = []
        d = self._shape(shape, made, errors, ok, failing)
        distinct = {(e.kind, e.message) for e in errors}
        if len(distinct) > 1:
            raise Ambiguous(distinct)
        if errors:
            if len(failing) > 1:
                # Children failing alike (a StopIteration each: one
                # RuntimeError): the first to fail is raised, the others
                # may not have run.
                ok += failing
            for spec in ok:
                self.open |= _runs_below(spec)
            raise errors[0]
        return d

    def _outcome(self, make: Any) -> tuple[bool, Any]:
        try:
            return True, make()
        except Raised as e:
            return False, e

    def _child(self, spec: Any, made: list) -> tuple[bool, Any]:
        """(ok, value or Raised) of one child, memoized per made object."""
        kind = spec[0]
        if kind in ("leaf", "future"):
            x, fail = spec[1], spec[2]

            def run_leaf() -> int:
                self.runs[("leaf", x)] += 1
                if fail:
                    self.raised = True
                    kind = "ValueError" if fail is True else fail
                    raise Raised(*error_seen(kind, f"leaf {x} failed", None))
                return x

            outcome = self._outcome(run_leaf)
            made.append(outcome)
            return outcome
        if kind == "call":
            outcome = self._outcome(lambda: self.node(spec[1]))
            made.append(outcome)
            return outcome
        if kind == "again":
            return made[spec[1]]
        assert kind == "get", spec
        ok, v = self._child(spec[2], made)
        if not ok:
            return ok, v
        return True, v.total if spec[1] != "op" else v.total + 1

    def _shape(self, spec: Any, made: list, errors: list, fine: list, failing: list) -> Any:
        kind = spec[0]
        if kind in ("leaf", "future", "call", "get", "again"):
            ok, v = self._child(spec, made)
            if not ok:
                errors.append(v)
                if kind != "again":
                    failing.append(spec)
                return None
            if kind != "again":  # what ran before this yield stays counted
                fine.append(spec)
            return ("Out", v.total, v.events) if type(v) is Out else v
        items = [self._shape(s, made, errors, fine, failing) for s in spec[1]]
        if kind == "list":
            return ("list", tuple(items))
        if kind == "tuple":
            return ("tuple", tuple(items))
        if kind == "pair":
            return ("Pair", *items)
        if kind == "box":
            return ("Box", *items)
        if kind in ("dict", "odict"):
            name = "dict" if kind == "dict" else "OrderedDict"
            return (name, tuple((f"k{i}", v) for i, v in enumerate(items)))
        raise AssertionError(spec)


def _may_fail(spec: Any) -> bool:
    """Whether a child spec may raise: a failing leaf, or a node that raises
    or waits without catching on anything that may."""
    if spec[0] in ("leaf", "future"):
        return bool(spec[2])
    if spec[0] == "call":
        for step in spec[1][4]:
            if step[0] == "raise":
                return True
            if step[0] == "group" and not step[3] and any(_may_fail(c) for c in step[1]):
                return True
            if step[0] == "stream" and not step[3] and _may_fail(("call", step[1])):
                return True
            if step[0] == "wait" and not step[2] and _shape_may_fail(step[1]):
                return True
        return False
    return _shape_may_fail(spec)


def _shape_may_fail(spec: Any) -> bool:
    if spec[0] in ("leaf", "future", "call"):
        return _may_fail(spec)
    if spec[0] == "get":
        return _may_fail(spec[2])
    if spec[0] == "again":
        return True  # an earlier child: it may have failed
    return any(_shape_may_fail(s) for s in spec[1])


def _runs_below(spec: Any) -> set:
    """The run counters of every node and leaf a child spec may run."""
    found: set = set()
    stack = [spec]
    while stack:
        s = stack.pop()
        if type(s) is not tuple:
            continue
        if s[:1] in (("leaf",), ("future",)):
            found.add(("leaf", s[1]))
        elif s[:1] == ("node",):
            found.add(("node", s[1]))
        stack.extend(s)  # every tuple inside: shapes, items, steps
    return found


def reference(node: tuple) -> tuple[Any, Counter, set, bool]:
    """``(outcome, runs, open, raised)``: the root's described value or its
    ``Raised``; how often each node and leaf ran; the counters the rules
    leave open (siblings of a failed child may have run, or not, or been
    cancelled mid-way); whether anything raised, caught or not."""
    ref = Reference()
    try:
        out: Any = ref.node(node)
        outcome: Any = ("Out", out.total, out.events)
    except Raised as e:
        outcome = e
    return outcome, ref.runs, ref.open, ref.raised


# ----------------------------------------------------------------------------
# Random programs.


#: The kinds of error raised, ValueError the commonest.
_ERROR_KINDS = ["ValueError", "ValueError", "StopIteration", "Unpicklable"]


def _fail(draw: Any) -> Any:
    """A leaf's ``fail``: False nine times in ten, else a kind of error."""
    from hypothesis import strategies as st

    if draw(st.integers(0, 9)):
        return False
    return draw(st.sampled_from(_ERROR_KINDS))


def programs(max_depth: int = 3, futures: bool = True):  # -> hypothesis strategy of nodes
    """Random programs; with ``futures``, a third of them have Futures among
    their children (those run on the cluster paths only)."""
    from hypothesis import strategies as st

    forms = st.sampled_from(["gen", "async", "plain"])
    containers = st.sampled_from(["list", "tuple", "dict", "pair", "box", "odict"])

    @st.composite
    def node(draw, depth: int, counter: list, futures: bool, producer: bool = False) -> tuple:
        ident = counter[0]
        counter[0] += 1
        made = 0

        def child() -> Any:
            nonlocal made
            choices = ["leaf", "leaf", "get"] + (["call", "call"] if depth < max_depth else [])
            if futures:
                choices.append("future")
            if made:
                choices.append("again")
            kind = draw(st.sampled_from(choices))
            if kind == "again":
                return ("again", draw(st.integers(0, made - 1)))
            if kind == "get" and depth >= max_depth:
                kind = "leaf"  # a get is of a call, and calls stop at max_depth
            if kind in ("leaf", "future"):
                counter[0] += 1
                made += 1
                return (kind, counter[0], _fail(draw))
            sub = draw(node(depth + 1, counter, futures))
            made += 1
            if kind == "get":
                return ("get", draw(st.sampled_from(["item", "attr", "op"])), ("call", sub))
            return ("call", sub)

        def shape(level: int) -> Any:
            if level >= 2 or draw(st.booleans()):
                return child()
            kind = draw(containers)
            n = 2 if kind in ("pair", "box") else draw(st.integers(0, 3))
            return (kind, tuple(shape(level + 1) for _ in range(n)))

        steps: list = []
        for _ in range(draw(st.integers(0, 3))):
            # Some waits under dask.annotate(priority=...): value-neutral.
            priority = draw(st.sampled_from([None, None, None, 1, -1]))
            steps.append(("wait", shape(0), draw(st.booleans()), priority))
        if draw(st.integers(0, 3)) == 0:
            # A group of fresh children, taken in completion order.
            kids = []
            for _ in range(draw(st.integers(0, 3))):
                kind = draw(st.sampled_from(["leaf", "leaf", "call"] + (["future"] if futures else [])))
                if kind == "call" and depth < max_depth:
                    kids.append(("call", draw(node(depth + 1, counter, futures))))
                else:
                    counter[0] += 1
                    kids.append(("leaf" if kind == "call" else kind, counter[0], draw(st.integers(0, 9)) == 0))
            steps.append(("group", tuple(kids), draw(st.sampled_from([None, 1, 2])), draw(st.booleans())))
        if depth < max_depth and draw(st.integers(0, 5)) == 0:
            # A stream read to its end: a producer node emitting between its waits.
            sub = draw(node(depth + 1, counter, futures, True))
            steps.append(("stream", sub, draw(st.sampled_from([None, 1, 2])), draw(st.booleans()), draw(st.booleans())))
        if producer:
            for _ in range(draw(st.integers(0, 3))):
                counter[0] += 1
                steps.insert(draw(st.integers(0, len(steps))), ("emit", counter[0]))
        if draw(st.integers(0, 9)) == 0:
            steps.append(("raise", draw(st.sampled_from(_ERROR_KINDS))))
        return ("node", ident, draw(forms), draw(st.booleans()), tuple(steps))

    if not futures:
        return st.deferred(lambda: node(0, [0], False))
    return st.deferred(lambda: st.sampled_from([False, False, True]).flatmap(lambda f: node(0, [0], f)))


# A program every path must agree on, written by hand: each of the divergences
# tests/runtime/test_conformance.py found first, kept as a fixed example.
EXAMPLES: dict[str, tuple] = {}


def _again_after_error() -> tuple:
    # issue: yielding the same call again after it raised.
    failing = ("node", 1, "gen", True, (("raise",),))
    steps = (
        ("wait", ("call", failing), True),
        ("wait", ("again", 0), True),
    )
    return ("node", 0, "gen", True, steps)


EXAMPLES["again after error"] = _again_after_error()
EXAMPLES["containers"] = (
    "node",
    0,
    "gen",
    True,
    (
        ("wait", ("odict", (("leaf", 1, False), ("leaf", 2, False))), False),
        ("wait", ("box", (("leaf", 3, False), ("call", ("node", 4, "async", True, ())))), False),
        ("wait", ("pair", (("leaf", 5, False), ("tuple", ()))), False),
    ),
)
# A task child's error caught by its parent, itself a task child: locally, the
# error reached the root as well (the loop kept it when the parent returned).
EXAMPLES["caught in a task child"] = (
    "node",
    0,
    "gen",
    True,
    (("wait", ("call", ("node", 1, "gen", False, (("wait", ("call", ("node", 2, "gen", False, (("raise",),))), True),))), False),),
)
EXAMPLES["lazy attribute awaited"] = (
    "node",
    0,
    "async",
    True,
    (("wait", ("get", "attr", ("call", ("node", 1, "gen", True, ()))), False),),
)
# A call yielded in one yield both as itself and through a lazy value on it
# (``c = g(); await gather([c[0], c])``), every call handed out: the call went
# out as a task while the item, computed in place, ran it again (stolen path).
EXAMPLES["call and its item in one yield"] = (
    "node",
    0,
    "plain",
    True,
    (
        (
            "wait",
            (
                "call",
                (
                    "node",
                    1,
                    "gen",
                    False,
                    (
                        (
                            "wait",
                            (
                                "call",
                                (
                                    "node",
                                    2,
                                    "async",
                                    True,
                                    (
                                        (
                                            "wait",
                                            (
                                                "list",
                                                (
                                                    ("get", "item", ("call", ("node", 3, "gen", True, ()))),
                                                    ("again", 0),
                                                ),
                                            ),
                                            False,
                                        ),
                                    ),
                                ),
                            ),
                            False,
                        ),
                    ),
                ),
            ),
            False,
        ),
    ),
)
# Two items of one call, each computed in place: the second ran it again
# (every path with calls inline).
EXAMPLES["two items of one call"] = (
    "node",
    0,
    "gen",
    True,
    (
        (
            "wait",
            (
                "list",
                (
                    ("get", "item", ("call", ("node", 1, "gen", True, ()))),
                    ("get", "attr", ("again", 0)),
                ),
            ),
            False,
        ),
    ),
)

# Errors that change type on the way to a parent: raised inline, they reached
# it as raised (StopIteration, Unpicklable), as tasks as distributed gives them.
EXAMPLES["errors a task changes"] = (
    "node",
    0,
    "gen",
    True,
    (
        ("wait", ("leaf", 1, "StopIteration"), True),
        ("wait", ("leaf", 2, "Unpicklable"), True),
        ("wait", ("call", ("node", 3, "plain", True, (("raise", "StopIteration"),))), True),
        ("wait", ("call", ("node", 4, "async", True, (("raise", "Unpicklable"),))), True),
        ("wait", ("call", ("node", 5, "gen", True, (("raise", "StopIteration"),))), True),
        ("wait", ("call", ("node", 6, "plain", False, (("raise", "Unpicklable"),))), True),
        ("wait", ("call", ("node", 7, "plain", True, (("raise", "Unpicklable"),))), False),
    ),
)
# The root's own error is what the scheduler computing it gives.
EXAMPLES["root raises StopIteration"] = ("node", 0, "plain", True, (("raise", "StopIteration"),))
EXAMPLES["root raises what cannot be pickled"] = ("node", 0, "async", False, (("raise", "Unpicklable"),))
# Found by the random programs: a root that held Futures raises what cannot be
# pickled. distributed logs the failed pickle with the error as its context,
# and a handler that keeps log records (pytest's capture) keeps the body's
# frame, and so its Futures, with it (tests/runtime/test_conformance.py quiets it).
EXAMPLES["root holding futures raises what cannot be pickled"] = (
    "node", 0, "gen", True,
    (("wait", ("dict", (("future", 3, False),)), True), ("raise", "Unpicklable")),
)

# Groups: children in completion order (any order on a cluster, spawn order
# without one), a caught error among them, under a limit, and a coroutine
# child with a group of its own.
EXAMPLES["group"] = (
    "node",
    0,
    "gen",
    True,
    (
        (
            "group",
            (
                ("leaf", 1, False),
                ("call", ("node", 2, "async", True, (("group", (("leaf", 3, False), ("leaf", 4, True)), None, True),))),
                ("leaf", 5, True),
                ("call", ("node", 6, "plain", False, (("wait", ("leaf", 7, False), False),))),
            ),
            2,
            True,
        ),
        ("wait", ("leaf", 8, False), False),
    ),
)
# Plain children of groups (beside the parent on the inline path, where
# every plain child that may run inline does: ``_force_beside``): one
# returning, one waiting from plain code, errors of each kind a task changes,
# and one opening a group of its own.
EXAMPLES["plain children of a group"] = (
    "node",
    0,
    "gen",
    True,
    (
        (
            "group",
            (
                ("call", ("node", 1, "plain", True, ())),
                ("call", ("node", 2, "plain", True, (("wait", ("leaf", 3, False), False),))),
                ("call", ("node", 4, "plain", True, (("raise",),))),
                ("call", ("node", 5, "plain", True, (("raise", "Unpicklable"),))),
            ),
            2,
            True,
        ),
        (
            "group",
            (
                ("call", ("node", 6, "plain", True, (("raise", "StopIteration"),))),
                ("call", ("node", 7, "plain", True, (("group", (("call", ("node", 8, "plain", True, ())),), None, True),))),
            ),
            None,
            True,
        ),
    ),
)
# A child's error not caught leaves the group: the rest are cancelled, the
# node raises it.
EXAMPLES["group error leaves"] = (
    "node",
    0,
    "async",
    False,
    (("group", (("leaf", 1, False), ("leaf", 2, True), ("call", ("node", 3, "gen", True, ()))), 1, False),),
)
# Producers of each form, read with for and in a group, one of them failing
# after its items (caught), one inside another's producer.
_PRODUCE = (("emit", 11), ("wait", ("leaf", 12, False), False), ("emit", 13))
EXAMPLES["streams"] = (
    "node",
    0,
    "gen",
    True,
    (
        ("stream", ("node", 1, "gen", True, _PRODUCE), 1, False, False),
        ("stream", ("node", 2, "async", False, (*_PRODUCE, ("raise",))), None, True, True),
        ("stream", ("node", 3, "plain", True, (
            ("emit", 14),
            ("stream", ("node", 4, "async", True, (("emit", 15),)), 2, False, True),
            ("emit", 16),
        )), 2, False, False),
    ),
)
# A producer's error not caught: the consumer raises it after the items.
EXAMPLES["stream error leaves"] = (
    "node",
    0,
    "async",
    True,
    (("stream", ("node", 1, "plain", False, (("emit", 1), ("raise", "Unpicklable"))), None, False, False),),
)


# ----------------------------------------------------------------------------
# The paths, and the comparison.

PATHS = ("local-inline", "local-task", "inline", "task", "stolen", "paused")


class _AlwaysIdle:
    """A worker's view of idle threads elsewhere that never runs out: every
    call that could run inline is handed out as a task (the stolen path)."""

    @property
    def n(self) -> int:
        return 1 << 20

    @n.setter
    def n(self, value: int) -> None:
        pass


def _set_idle(dask_worker: Any, always: bool) -> None:
    from dask_coro.core.engine import Idle
    from dask_coro.runtime.worker import _watcher

    watcher = _watcher(dask_worker)
    watcher.idle = _AlwaysIdle() if always else Idle()


def _force_beside(dask_worker: Any, on: bool) -> None:
    """The inline path: every plain child of a group that may run inline
    runs beside its parent, as a short one does once measured
    (``runtime/timings.py``); off, the measurements decide again."""
    from dask_coro.runtime.timings import TIMINGS

    TIMINGS.force = True if on else None


class _Pauser(Background):
    """The paused path: every run of every worker of an in-process cluster
    asked to pause (``_Run._pause``, as a waiting step of a fairer tree
    asks; docs/running.md, fair progress between trees) about every
    millisecond, so steps stop at random inline calls and yields, secede,
    and go on from there."""

    def __init__(self, client: Any):
        self.workers = list(client.cluster.workers.values())
        super().__init__(name="conformance-pauser")

    def _run(self) -> None:
        from dask_coro.runtime.worker import _watcher

        watchers = [_watcher(w) for w in self.workers]
        while not self._stop.wait(0.001):
            for watcher in watchers:
                for run in list(watcher.runs.values()):
                    run._pause()


class Harness:
    """Runs a program on each path and compares it with the reference.

    ``client`` is a client of an in-process cluster (``processes=False``):
    its workers count runs in this process's ``RUNS``.
    """

    def __init__(self, client: Any, timeout: float = 30):
        self.client = client
        self.timeout = timeout

    def run(self, node: tuple, path: str) -> tuple[Any, Counter, dict | None]:
        """``(outcome, runs, progress)``: the described value, or ``Raised``;
        the runs counted; ``dask_coro.progress``'s final counts on a cluster.
        Raises ``AssertionError`` if a cluster path left anything behind."""
        with _RUNS_LOCK:
            RUNS.clear()  # a late run of an earlier epoch counts under its own
            EPOCH[0] += 1
            epoch = EPOCH[0]
        inline = path in ("local-inline", "inline", "stolen", "paused")
        counts = None
        with dask.config.set({"coro.inline.enabled": inline}):
            if path.startswith("local"):
                try:
                    (value,) = dask.compute(root_call(node), scheduler="sync")
                    outcome: Any = describe(value)
                except Exception as e:
                    outcome = Raised(type(e).__name__, str(e))
            elif path == "paused":
                with _Pauser(self.client):
                    outcome, counts = self._on_cluster(node, stolen=False)
                self.leftovers()
            elif path == "inline":
                self.client.run(_force_beside, on=True)
                try:
                    outcome, counts = self._on_cluster(node, stolen=False)
                finally:
                    self.client.run(_force_beside, on=False)
                self.leftovers()
            else:
                outcome, counts = self._on_cluster(node, stolen=path == "stolen")
                self.leftovers()
        return outcome, runs_of(epoch), counts

    def _on_cluster(self, node: tuple, stolen: bool) -> tuple[Any, dict | None]:
        from dask_coro import progress

        if stolen:
            self.client.run(_set_idle, always=True)
        fut = self.client.compute(root_call(node))
        counts = None
        try:
            outcome: Any = describe(fut.result(timeout=self.timeout))
        except TimeoutError:
            fut.cancel()
            outcome = Raised("Hang", f"no outcome in {self.timeout} s")
        except Exception as e:
            outcome = Raised(type(e).__name__, str(e))
        finally:
            if fut.done():
                counts = progress(fut, file=io.StringIO())
            # A raised error's traceback holds the future (as in plain
            # distributed: the erred key stays while it lives): let go of it
            # explicitly, and then see that nothing else held anything.
            fut.release()
            del fut
            if stolen:
                self.client.run(_set_idle, always=False)
        return outcome, counts

    def leftovers(self) -> None:
        """Wait until the scheduler and workers hold no task; raise naming
        what stays.

        A body that raised past Futures it held keeps them in a reference
        cycle: the child's error, stored in its Future, has the body's frame
        in its traceback once raised at the yield, and the frame holds the
        Futures (so does ``client.gather`` in a ``worker_client`` task, in
        plain distributed). The cycle goes at Python's next collection of
        it: collect now and then, as a busy worker process does."""
        deadline = time.monotonic() + 10

        def held() -> list:
            s = self.client.cluster.scheduler
            keys = list(s.tasks)
            for w in self.client.cluster.workers.values():
                keys += [f"{w.name}:{k}" for k in w.state.tasks]
            return keys

        rounds = 0
        while (left := held()) and time.monotonic() < deadline:
            if rounds % 20 == 19:  # most tasks go within 0.2 s with no help
                gc.collect()
            rounds += 1
            time.sleep(0.01)
        if left:
            raise AssertionError(f"left on the cluster: {left[:5]}")

    def cancel(self, node: tuple, path: str, after: float) -> list[str]:
        """Cancel the program ``after`` seconds into its run on a cluster
        path: what it left behind, and bodies that never ended (their
        ``finally`` did not run)."""
        with _RUNS_LOCK:
            RUNS.clear()
            EPOCH[0] += 1
            epoch = EPOCH[0]
        stolen = path == "stolen"
        found = []
        with dask.config.set({"coro.inline.enabled": path != "task"}):
            if stolen:
                self.client.run(_set_idle, always=True)
            if path == "inline":
                self.client.run(_force_beside, on=True)
            pauser = _Pauser(self.client) if path == "paused" else contextlib.nullcontext()
            try:
                with pauser:
                    fut = self.client.compute(root_call(node))
                    time.sleep(after)
                    fut.cancel()
                    del fut
                try:
                    self.leftovers()
                except AssertionError as e:
                    found.append(f"{path}, cancelled after {after} s: {e}")
                    self.forget()
            finally:
                if stolen:
                    self.client.run(_set_idle, always=False)
                if path == "inline":
                    self.client.run(_force_beside, on=False)
        deadline = time.monotonic() + 10
        while True:
            ran = runs_of(epoch)
            unended = sorted(k[1] for k in ran if k[0] == "node" and ran[k] != ran["end", k[1]])
            if not unended or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if unended:
            found.append(f"{path}, cancelled after {after} s: bodies that never ended: {unended}")
        return found

    def forget(self) -> None:
        """After a path left tasks behind. The divergence is reported; the
        cluster is not restarted (``Client.restart`` of an in-process cluster,
        whose workers have no nanny, waits for workers that never come back),
        so later programs of the same run may report the leftovers again."""

    def divergences(self, node: tuple, paths: tuple[str, ...] = PATHS) -> list[str]:
        """What each path did differently from the reference (empty: none).
        Raises ``Ambiguous`` for a program whose outcome depends on timing."""
        expected, runs, open_, raised = reference(node)
        if _has_futures(node):  # a Future needs a cluster: no local paths
            paths = tuple(p for p in paths if not p.startswith("local"))
        found = []
        for path in paths:
            want = _show(expected, local=path.startswith("local"))
            try:
                got, got_runs, counts = self.run(node, path)
            except AssertionError as e:  # leftovers
                found.append(f"{path}: {e}")
                self.forget()
                continue
            shown, wanted = _show(got), want
            if not path.startswith("local"):
                # On a cluster a group delivers in any order: compare as sets.
                shown, wanted = _any_order(shown), _any_order(wanted)
            if shown != wanted:
                found.append(f"{path}: {_show(got)} != reference {want}")
                continue
            ran = {k for k in runs.keys() | got_runs.keys() if k[0] != "end"} - open_
            diff = {k: (got_runs[k], runs[k]) for k in ran if got_runs[k] != runs[k]}
            if diff:
                found.append(f"{path}: runs (got, reference) {diff}")
            unended = {k[1] for k in got_runs if k[0] == "node" and got_runs[k] != got_runs["end", k[1]]}
            if unended:
                found.append(f"{path}: bodies started but never ended (no finally ran): {sorted(unended)}")
            if counts is not None and not raised:
                # Every run but the root's is a task or an inline call, each
                # done; tasks may also be dask's operators on calls (c[0]),
                # which other paths compute in place.
                inline = counts["functions"].values()
                started, done = sum(f["started"] for f in inline), sum(f["done"] for f in inline)
                n = sum(v for k, v in runs.items() if k[0] != "end") - 1
                if (counts["done"], counts["failed"], done) != (counts["spawned"], 0, started) or counts["spawned"] + started < n:
                    found.append(f"{path}: progress {counts}, {n} runs below the root")
        return found


def _has_futures(node: tuple) -> bool:
    stack: list = [node]
    while stack:
        s = stack.pop()
        if type(s) is tuple:
            if s[:1] == ("future",):
                return True
            stack.extend(s)
    return False


def _any_order(d: Any) -> Any:
    """``d`` with every group's deliveries sorted (the orders a cluster may
    give are every order)."""
    if type(d) is not tuple:
        return d
    if len(d) == 2 and d[0] == "group" and type(d[1]) is tuple:
        return ("group", tuple(sorted((_any_order(x) for x in d[1]), key=repr)))
    return tuple(_any_order(x) for x in d)


def _show(outcome: Any, local: bool = False) -> Any:
    if isinstance(outcome, Raised):
        if local and outcome.local is not None:
            return ("raises", *outcome.local)
        return ("raises", outcome.kind, outcome.message)
    return outcome


def main(argv: list[str] | None = None) -> None:
    """Run random programs on every path and count the clean ones:
    ``python tests/conformance.py --examples 1000``."""
    import argparse

    from distributed import Client, LocalCluster
    from hypothesis import HealthCheck, Phase, given, settings

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=5, help="divergent programs to print")
    parser.add_argument("--no-futures", action="store_true", help="no Futures among the children")
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    clean = divergent = ambiguous = 0
    by_path: Counter = Counter()
    shown = 0
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        harness = Harness(client)

        @settings(max_examples=args.examples, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(programs(futures=not args.no_futures))
        def each(node: tuple) -> None:
            nonlocal clean, divergent, ambiguous, shown
            try:
                found = harness.divergences(node)
            except Ambiguous:
                ambiguous += 1
                return
            if not found:
                clean += 1
                return
            divergent += 1
            for line in found:
                by_path[line.split(":", 1)[0]] += 1
            if shown < args.show:
                shown += 1
                print(f"program {node!r}:\n  " + "\n  ".join(found), flush=True)

        from hypothesis import seed

        seed(args.seed)(each)()
    print(f"{clean + divergent} programs ({ambiguous} more skipped as timing-dependent): "
          f"{clean} clean, {divergent} divergent; divergences by path: {dict(by_path)}")


if __name__ == "__main__":
    # Import this file as a module: workers then find its functions by name
    # (as __main__ they would travel by value, with RUNS and its lock).
    import conformance

    conformance.main()
