"""A coroutine's function sent by value is pickled once and loaded once per process.

A function that cannot be imported by name where it runs (defined in
``__main__``, in a notebook, or in another function) travels by value:
cloudpickle copies its code and the globals it uses. distributed pickles a
task's spec for every message that carries it: the client's graph, then the
scheduler's ``compute-task`` message to a worker (``Scheduler._task_to_msg``
wraps ``ts.run_spec`` in ``ToPickle``), and the worker unpickles a copy per
task. For a small function that was some 400 us to pickle, 90 us to load and
1.7 KB kept per task: the largest single cost of a child task, and of a
suspended coroutine's memory, when the coroutine was defined in a notebook.

Here a ``CoroutineTask`` pickles its function as a ``ByValue`` box, one per
function, so one pickling of a whole graph copies it once (pickle's memo).
A box pickles to cloudpickle's bytes of the function. The process that loads
those bytes keeps the function (a bounded cache, by its bytes): the next task
with the same bytes gets the same function object, not a copy, and pickling
it again (the scheduler sending it on, a worker submitting children of it)
reuses the bytes it came as.

A function pickled in the process that defined it is pickled anew each
time: its globals there may have changed since (a notebook cell reassigning
a constant), and the task must see them as they are when it is submitted.
A loaded function is a snapshot; all tasks of it in one process share it,
as tasks of an importable function share its module.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import cloudpickle

#: Functions loaded in this process, by the bytes they came as, least recently
#: used first. Bounded: a process running many different functions by value
#: loads some of them more than once, never keeps them all.
_LOADED: OrderedDict[bytes, Callable[..., Any]] = OrderedDict()
_MAX_LOADED = 256
#: The bytes each function loaded here came as (weakly: the cache above
#: decides how long a function lives).
_BYTES: weakref.WeakKeyDictionary[Callable[..., Any], bytes] = weakref.WeakKeyDictionary()
_BOXES: weakref.WeakKeyDictionary[Callable[..., Any], ByValue] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class ByValue:
    """What a coroutine task's function pickles as when it travels by value;
    unpickled, it is the function itself."""

    __slots__ = ("func", "__weakref__")

    def __init__(self, func: Callable[..., Any]):
        self.func = func

    def __reduce__(self) -> tuple[Any, ...]:
        payload = _BYTES.get(self.func)
        if payload is None:  # defined here: as its globals are now
            payload = cloudpickle.dumps(self.func)
        return load, (payload,)


def by_value(func: Callable[..., Any]) -> Any:
    """The box ``func`` pickles as, the same object each time (``func``
    itself if it takes no weak reference: pickled as it always was)."""
    try:
        return _BOXES[func]
    except KeyError:
        with _LOCK:
            box = _BOXES.get(func)
            if box is None:
                box = _BOXES[func] = ByValue(func)
            return box
    except TypeError:
        return func


def load(payload: bytes) -> Callable[..., Any]:
    """The function pickled as ``payload``, loaded once while it is cached."""
    with _LOCK:
        func = _LOADED.get(payload)
        if func is not None:
            _LOADED.move_to_end(payload)
            return func
    func = cloudpickle.loads(payload)  # unlocked: loading may import, or load a function
    with _LOCK:
        known = _LOADED.get(payload)
        if known is not None:  # another thread loaded it meanwhile: one copy
            return known
        _LOADED[payload] = func
        try:
            _BYTES[func] = payload
        except TypeError:  # takes no weak reference: pickled anew when sent on
            pass
        while len(_LOADED) > _MAX_LOADED:
            _LOADED.popitem(last=False)
    return func
