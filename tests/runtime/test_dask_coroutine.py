"""``@dask.coroutine``: the spelling of dask/distributed #1663, whose examples
run as written there once ``dask_coro`` is imported.

``FIB`` and ``PROCESS_ALL`` below are the code blocks of #1663's description,
``import dask`` style. Around them the tests define what #1663 leaves
undefined: the imports (``import dask``, and ``import dask_coro``, which makes
``dask.coroutine``), and ``random``, which #1663's ``generate_data`` uses
without importing it; here it is a seeded ``random.Random``, so that the
list's unknown length is known to the test. When this test was written, the
text of #1663 at hand was checked up to ``n = yield my_len(L)``; the last
three lines of ``process_all`` are the pattern its helpers are defined for
(``inc`` on each item, ``my_sum`` of them) and are to be compared with #1663
when it is quoted again.
"""

from __future__ import annotations

import random
import subprocess
import sys

import dask
import pytest
from distributed.utils_test import gen_cluster

import dask_coro

FIB = '''
@dask.coroutine
def fib(i):
    if i < 2:
        return i
    else:
        a, b = yield [fib(i - 1), fib(i - 2)]
        return a + b
'''

PROCESS_ALL = '''
@dask.coroutine
def generate_data():
    return list(range(random.randint(0, 10)))  # a list of data of unknown length

@dask.coroutine
def inc(x):
    return x + 1

@dask.coroutine
def my_len(L):
    return len(L)

@dask.coroutine
def my_sum(L):
    return sum(L)

@dask.coroutine
def process_all():
    L = generate_data()
    n = yield my_len(L)
    processed = [inc(L[i]) for i in range(n)]
    total = yield my_sum(processed)
    return total
'''


def define(code: str, **names: object) -> dict:
    """Run #1663's code as a module of its own would, ``import dask``
    first; its functions then pickle by value, as a script's do."""
    namespace: dict = {"__name__": "dask_distributed_1663", **names}
    exec("import dask\nimport dask_coro\n" + code, namespace)
    return namespace


def sequential_fib(i: int) -> int:
    return i if i < 2 else sequential_fib(i - 1) + sequential_fib(i - 2)


def sequential_process_all(seed: int) -> int:
    L = list(range(random.Random(seed).randint(0, 10)))
    return sum(x + 1 for x in L)


def test_dask_coroutine_is_dask_coro_coroutine():
    assert dask.coroutine is dask_coro.coroutine


def test_a_dask_coroutine_defined_before_is_left_alone():
    code = (
        "import dask\n"
        "mine = object()\n"
        "dask.coroutine = mine\n"
        "import dask_coro\n"
        "assert dask.coroutine is mine, dask.coroutine\n"
        "assert dask_coro.coroutine is not mine\n"
        "print('left alone')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "left alone"


def test_dask_coroutine_is_unset_before_import_dask_coro():
    # The alias comes from dask_coro, not from dask: dask itself has none.
    code = "import dask\nprint(hasattr(dask, 'coroutine'))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


@pytest.mark.inline
@gen_cluster(client=True, nthreads=[("", 1), ("", 1)])
async def test_1663_fib_inline(c, s, a, b):
    fib = define(FIB)["fib"]
    assert isinstance(fib, dask_coro.CoroutineFunction)
    for i in [0, 1, 2, 10, 18]:
        assert await c.compute(fib(i)) == sequential_fib(i)


@gen_cluster(client=True, nthreads=[("", 1), ("", 1)])
async def test_1663_fib_as_tasks(c, s, a, b):
    # Inline calls off (this suite's default): every call is a task.
    fib = define(FIB)["fib"]
    results = await c.gather(c.compute([fib(i) for i in range(11)]))
    assert results == [sequential_fib(i) for i in range(11)]


@pytest.mark.parametrize("inline", [pytest.param(True, marks=pytest.mark.inline), False])
@gen_cluster(client=True, nthreads=[("", 1), ("", 1)])
async def test_1663_process_all(c, s, a, b, inline):
    lengths = set()
    for seed in range(12):
        process_all = define(PROCESS_ALL, random=random.Random(seed))["process_all"]
        assert await c.compute(process_all()) == sequential_process_all(seed), seed
        lengths.add(random.Random(seed).randint(0, 10))
    assert len(lengths) > 3  # lists of several lengths, the empty one among them
    assert 0 in lengths


def test_1663_examples_without_a_cluster():
    # No distributed client: the same code runs in-process.
    assert define(FIB)["fib"](12).compute() == sequential_fib(12)
    process_all = define(PROCESS_ALL, random=random.Random(3))["process_all"]
    assert process_all().compute() == sequential_process_all(3)
