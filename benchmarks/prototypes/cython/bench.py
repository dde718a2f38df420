"""ns per inline call of fib(20) in one process, for the Cython question of the
compiled core: the pure engine as it is, the same two modules (core/engine.py,
runtime/call.py) compiled unchanged by Cython (pure-Python mode), and the least
generator trampoline in Python and typed in a ``.pyx`` (floor_pyx), and the call
object with the stepping loop typed in a ``.pyx`` (cycall) beside the C
prototype (../ccall, when built there), bare and wired as a worker wires a run. Each number
is the fastest of 15 runs, in a fresh process per driver set, ``--rounds``
times; the median over rounds is printed.

Run from the repository root (Cython and a C compiler needed; builds in a
temporary folder and in place here):
    python benchmarks/prototypes/cython/bench.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
CALLS = 21_891  # calls of fib(20)

CHILD = r"""
import sys, time
sys.path.insert(0, {bench!r})
sys.path.insert(0, {here!r})
import dask_coro.core.engine as E
import profile_fib as P
compiled = E.__file__.endswith(".so")
def best(fn, k=15):
    ts = []
    for _ in range(k):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return min(ts) / {calls} * 1e9
out = {{"seq": best(lambda: P._fib(20)), "worker": best(lambda: P._worker_fib(20))}}
if not compiled:
    import floor_pyx
    assert floor_pyx.floor_run(P._floor_body, (20,)) == P._fib(20)
    out["floor"] = best(lambda: P._floor_run(P._floor_body, (20,)))
    out["floor_pyx"] = best(lambda: floor_pyx.floor_run(P._floor_body, (20,)))
    import cycall

    @cycall.coroutine
    def cyfib(i):
        if i < 2:
            return i
        a, b = yield [cyfib(i - 1), cyfib(i - 2)]
        return a + b

    from dask_coro._internals.dask_private import annotations_in_effect
    from dask_coro.core.engine import Idle

    def wired(mod, root):
        # as a worker wires a run: a cancelled() callback, an Idle, the annotations read
        mod.set_annotations_var(annotations_in_effect)
        try:
            return mod.Trampoline(cancelled=lambda: False, idle=Idle(0)).run(root)
        finally:
            mod.set_annotations_var(None)

    assert cycall.Trampoline().run(cyfib(20)) == P._fib(20) == wired(cycall, cyfib(20))
    out["cycall"] = best(lambda: cycall.Trampoline().run(cyfib(20)))
    out["cycall_wired"] = best(lambda: wired(cycall, cyfib(20)))
    try:
        sys.path.insert(0, {ccall!r})
        import _ccall, fibc
    except ImportError:
        pass
    else:
        out["ccall"] = best(lambda: _ccall.Trampoline().run(fibc.fib(20)))
        out["ccall_wired"] = best(lambda: wired(_ccall, fibc.fib(20)))
print(repr((compiled, out)))
"""


def build_compiled_copy(tmp: str) -> str:
    """A copy of the package with core/engine.py and runtime/call.py compiled
    by Cython as they are (the .so beside each .py is imported first)."""
    shutil.copytree(os.path.join(ROOT, "dask_coro"), os.path.join(tmp, "dask_coro"))
    script = (
        "from setuptools import setup\nfrom Cython.Build import cythonize\n"
        "setup(ext_modules=cythonize(['dask_coro/core/engine.py', 'dask_coro/runtime/call.py'],"
        " compiler_directives={'language_level': 3, 'binding': True}, quiet=True),"
        " script_args=['build_ext', '--inplace'])\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=tmp, check=True, capture_output=True)
    return tmp


def run(path: str) -> tuple[bool, dict]:
    code = CHILD.format(bench=os.path.join(ROOT, "benchmarks"), here=HERE, calls=CALLS,
                        ccall=os.path.join(os.path.dirname(HERE), "ccall"))
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=path, check=True, capture_output=True, text=True)
    return eval(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=HERE, check=True, capture_output=True)
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        compiled_path = build_compiled_copy(tmp)
        for _ in range(args.rounds):
            for path, label in ((ROOT, "pure"), (compiled_path, "cython")):
                compiled, out = run(path)
                assert compiled == (label == "cython"), (label, compiled)
                for k, v in out.items():
                    rows.setdefault(f"{label} {k}", []).append(v)
    names = {
        "pure seq": "sequential Python (`def fib`)",
        "pure floor": "least generator trampoline in Python (`_floor_run`)",
        "pure floor_pyx": "the same loop typed in Cython (`floor_pyx.pyx`: cdef Frames, PyIter_Send)",
        "pure cycall": "call object and loop typed in Cython (`cycall.pyx`), bare: counting and the stop flag",
        "pure ccall": "the C prototype (`../ccall`, if built), bare",
        "pure cycall_wired": "`cycall.pyx` wired as a worker (counting, `cancelled()`, stop flag, `Idle.n`, annotations read)",
        "pure ccall_wired": "the C prototype, wired the same way",
        "pure worker": "pure engine, wired as a worker (`_worker_fib`)",
        "cython worker": "the same, core/engine.py and runtime/call.py compiled by Cython unchanged",
    }
    seq = statistics.median(rows["pure seq"])
    print("| ns per call of fib(20), one process | ns per call | / sequential |")
    print("|---|---|---|")
    for key, name in names.items():
        if key not in rows:
            continue
        v = statistics.median(rows[key])
        print(f"| {name} | {v:,.0f} ({min(rows[key]):,.0f}-{max(rows[key]):,.0f}) | {v / seq:.1f} x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
