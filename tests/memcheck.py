"""Memory safety of the compiled engine (CI, .ci/run; docs/development.md).

``python tests/memcheck.py``
    Reference and memory leaks: runs each workload below many times in one
    process, as CPython's own ``regrtest -R`` hunts leaks on a release build:
    a few warm-up rounds, then rounds whose growth in allocated memory blocks
    (``sys.getallocatedblocks``) and in the reference counts of the engine's
    shared objects must not be positive every time. A leak of one object per
    call shows as thousands of blocks a round.
``python tests/memcheck.py --valgrind``
    The same workloads, each run twice (valgrind checks every access as it
    happens and lists every block lost at exit: one run finds what a hundred
    would, and the second runs on what the first left in the engine's caches
    and free lists), then the engine's tests (``ENGINE_TESTS``, on both
    engines), in one process under valgrind's memcheck
    (``PYTHONMALLOC=malloc``): fails on any error, or any block definitely
    lost, with a frame of the compiled engine in its stack, a wrong result,
    or a test that fails. CPython itself
    reports a few uninitialised reads at interpreter exit, with or without
    dask_coro: those name no frame of ours and are not counted.

Both exit 0 when all holds, and say which engine ran; ``--require-compiled``
fails if the compiled engine is not the one in use.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable

import dask
from bodies import leaf

import dask_coro
from dask_coro import coroutine, gather, result
from dask_coro.core import accel, engine
from dask_coro.examples import fib
from dask_coro.runtime.call import CoroutineTask, trampoline
from dask_coro.runtime.local import run_local


@coroutine
def bad(x):
    raise ValueError(x)


@coroutine
def catches(n):
    # a child's error at the yield, a wide yield (more than engine._NRANGES),
    # keyword arguments (a partial), a call yielded twice
    try:
        yield [leaf(1), bad(n)]
    except ValueError:
        pass
    again = leaf(2)
    out = yield [leaf(i, k=1) for i in range(100)] + [again, again]
    return sum(out)


@coroutine
def waits(n):
    # a plain body waiting from plain code: greenlets park it
    return sum(result([leaf(i) for i in range(n)]))


@coroutine
async def awaits(n):
    a = await gather([fib(n), leaf(1)])
    return a[0] + a[1]


@coroutine
def nested_waits(n):
    if n < 1:
        return 0
    a = yield waits(3)
    b = yield nested_waits(n - 1)
    return a + b


def _local(fn: object, *args: object) -> object:
    """Run a coroutine task in this process, as a local compute runs it,
    without dask.compute (whose expression caches grow on their own)."""
    return run_local(CoroutineTask(fn.run, f"{fn.prefix}-memcheck"), args, {})  # type: ignore[attr-defined]


def _stopped() -> None:
    t = trampoline("fib", inline=True, cancelled=lambda: True, check_every=16, awaits=False)
    out = t.start(fib.__wrapped__, (12,), {})
    assert type(out) is engine.Stopped, out
    assert t.close() == []


def _made_not_run() -> None:
    for i in range(50):
        leaf(i)
        leaf(i, dask_key_name=f"leaf-{i}")
        with dask.annotate(priority=1):
            leaf(i)
        leaf([i])


WORKLOADS: dict[str, Callable[[], object]] = {
    "fib": lambda: _local(fib, 12),
    "errors": lambda: _local(catches, 3),
    "waits": lambda: _local(waits, 20),
    "async": lambda: _local(awaits, 8),
    "nested waits": lambda: _local(nested_waits, 4),
    "stopped": _stopped,
    "calls made": _made_not_run,
}
EXPECTED = {"fib": 144, "errors": 5054, "waits": 190, "async": 22, "nested waits": 12}

#: The engine's shared objects: a reference leaked per call grows their count.
SHARED = [engine._PENDING, engine._STEPPED, engine.NOT_DONE, engine._EMPTY, engine.Frame, engine.Failed]


def hunt(name: str, fn: Callable[[], object], warmup: int, rounds: int, per_round: int) -> str | None:
    """regrtest -R's way, with a floor: growth in every round of at least one
    block (or reference) per run of the workload is a leak. A leak in the
    engine loses one or more per call, and each run makes tens to hundreds
    of calls; the caches of cloudpickle and tblib (a child's error is
    pickled as a task's would be) grow by a few blocks a round for a while,
    under either engine, then stop."""
    blocks, refs = [], []
    for r in range(warmup + rounds):
        gc.collect()
        b0 = sys.getallocatedblocks()
        c0 = [sys.getrefcount(o) for o in SHARED]
        for _ in range(per_round):
            out = fn()
            if name in EXPECTED:
                assert out == EXPECTED[name], (name, out)
        del out
        gc.collect()
        if r >= warmup:
            blocks.append(sys.getallocatedblocks() - b0)
            c1 = [sys.getrefcount(o) for o in SHARED]
            refs.append(max(after - before for after, before in zip(c1, c0)))
    if all(d >= per_round for d in blocks):
        return f"{name}: allocated blocks grew every round: {blocks}"
    if all(d >= per_round for d in refs):
        return f"{name}: references to the engine's shared objects grew every round: {refs}"
    return None


def twice() -> int:
    """Each workload run twice, its results checked (under valgrind, which
    judges the memory: ``valgrind()``)."""
    for name, fn in WORKLOADS.items():
        for _ in range(2):
            out = fn()
            if name in EXPECTED and out != EXPECTED[name]:
                print(f"  {name}: {out!r}, not {EXPECTED[name]!r}", flush=True)
                return 1
        print(f"  {name}: ran twice", flush=True)
    return 0


def leaks(rounds: int, per_round: int) -> int:
    failures = []
    for name, fn in WORKLOADS.items():
        problem = hunt(name, fn, warmup=5, rounds=rounds, per_round=per_round)
        print(f"  {name}: {'LEAK ' + problem if problem else 'no leak'}", flush=True)
        if problem:
            failures.append(problem)
    return 1 if failures else 0


#: The engine's tests run under valgrind too (--valgrind): every path of the
#: compiled loop they reach, on both engines (conftest.engine). Those that
#: start processes are left out: their children would not run under it.
ENGINE_TESTS = ["tests/core/test_engines.py", "tests/core/test_trampoline_inline.py", "tests/core/test_trampoline_result.py"]
LEFT_OUT = "not worker_processes and not pure_forces"


def _under_valgrind(exe: str, args: list[str]) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONMALLOC="malloc")
    cmd = [exe, "--leak-check=full", "--num-callers=40", sys.executable, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def _ours(stderr: str) -> tuple[int, list[str]]:
    """valgrind's reports (blocks separated by a line of its pid alone): how
    many errors in all, and those with a frame of the compiled engine."""
    reports = re.split(r"^==\d+== ?\n", stderr, flags=re.M)
    kinds = r"== (Invalid|Use of|Conditional|Syscall|Mismatched|Source and|.*definitely lost)"
    ours = [r for r in reports if "_cengine" in r and re.search(kinds, r)]
    counted = len([r for r in reports if re.search(r"== (Invalid|Use of|Conditional)", r)])
    return counted, ours


def valgrind() -> int:
    exe = shutil.which("valgrind")
    if exe is None:
        print("valgrind is not installed: apt-get install valgrind", file=sys.stderr)
        return 1
    # One process for both: starting Python and importing dask and
    # distributed under valgrind takes about 20 s.
    code, out, err = _under_valgrind(exe, [__file__, "--in-valgrind"])
    print(out[-3000:], end="")
    counted, ours = _ours(err)
    print(f"valgrind, the workloads and the engine's tests: exit {code}, {counted} error reports in all, "
          f"{len(ours)} with a frame of the compiled engine", flush=True)
    for r in ours:
        print(r, file=sys.stderr)
    if code != 0:
        print(err[-5000:], file=sys.stderr)
    return 1 if code != 0 or ours else 0


def in_valgrind() -> int:
    """What ``--valgrind`` runs under valgrind: the workloads twice, then the
    engine's tests, in this process."""
    import pytest

    with dask.config.set({"coro.inline.enabled": True}):
        code = twice()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tests = pytest.main(["-o", "addopts=", "-p", "no:cacheprovider", "-q", "-k", LEFT_OUT,
                         *(os.path.join(root, t) for t in ENGINE_TESTS)])
    return code or int(tests)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--valgrind", action="store_true")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--per-round", type=int, default=20)
    p.add_argument("--require-compiled", action="store_true")
    p.add_argument("--in-valgrind", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    print(f"dask_coro {dask_coro.__version__}, {accel.describe()}", flush=True)
    if args.require_compiled and accel.ENGINE != "compiled":
        print("the compiled engine is required", file=sys.stderr)
        return 1
    if args.valgrind:
        return valgrind()
    if args.in_valgrind:
        return in_valgrind()
    with dask.config.set({"coro.inline.enabled": True}):
        return leaks(args.rounds, args.per_round)


if __name__ == "__main__":
    sys.exit(main())
