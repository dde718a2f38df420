# The compiled engine (_cengine.c): what its Python callers use of it.
from typing import Any

SLOW: int
BREAK: int
DONE: int

class Exit:
    # Where steps() stopped (a struct sequence): the pure loop's locals by name.
    code: int
    top: Any
    countdown: int
    barren: bool
    method: Any
    arg: Any
    out: Any
    ended: int
    fresh: int
    body: Any
    func: Any
    ctx: Any

class FunctionBase:
    _inline: Any
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

def steps(
    tramp: Any, top: Any, run: Any, countdown: int, barren: bool, stack: Any, idle: Any,
    call_type: Any, annotations_now: Any, own_annotations: Any, /,
) -> Exit | None: ...
def setup(**objects: Any) -> bool: ...
def setup_calls(**objects: Any) -> None: ...
def fast_calls(cls: type, /) -> None: ...
