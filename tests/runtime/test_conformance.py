"""One answer on every path: random coroutine programs (tests/conformance.py)
run locally with calls inline and as tasks, on a cluster inline, as tasks,
with every call handed out (stolen) and with every step asked to pause about
every millisecond (paused: the fair share's preemption at random points),
and each must agree with a reference
interpreter in plain Python: value, exception type and message, how often
each function ran, and nothing left on the scheduler or the workers.

CI runs a fixed seed and ``--conformance-examples`` programs (60); more, as a
fuzz run: ``python tests/conformance.py --examples 5000``.
"""

from __future__ import annotations

import logging

import conformance as C
import pytest
from distributed import Client, LocalCluster
from hypothesis import HealthCheck, Phase, assume, given, seed, settings
from hypothesis import strategies as st

# Each test runs on both engines, compiled and pure (conftest.engine).
pytestmark = pytest.mark.usefixtures("engine")


@pytest.fixture(scope="module")
def harness():
    # In-process workers count runs in this process's conformance.RUNS.
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        yield C.Harness(client)


@pytest.fixture(autouse=True)
def _quiet():
    # Every failing child logs distributed's "Compute Failed" block, and an
    # error no pickle survives logs "Failed to serialize" (distributed's
    # protocol.pickle.dumps) with that error as its context. pytest keeps the
    # records of a test, so that error, its traceback and the frames and
    # Futures of the body that raised it would stay until the test ends.
    loggers = [logging.getLogger(n) for n in ("distributed.worker", "distributed.protocol.pickle")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    yield
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)


@pytest.mark.parametrize("name", sorted(C.EXAMPLES))
def test_fixed_example(harness, name):
    assert harness.divergences(C.EXAMPLES[name]) == []


def test_reference_says_what_the_docs_say():
    """The reference interpreter itself, on programs whose outcome is known."""
    node = ("node", 0, "gen", True, (("wait", ("list", (("leaf", 1, False), ("leaf", 2, False))), False),))
    outcome, runs, open_, raised = C.reference(node)
    assert outcome == ("Out", 3 + 1, (("ok", ("list", (1, 2))),))
    assert runs == {("node", 0): 1, ("leaf", 1): 1, ("leaf", 2): 1} and not open_ and not raised
    outcome, runs, open_, raised = C.reference(C.EXAMPLES["again after error"])
    err = ("err", "ValueError", "node 1 raised")
    assert outcome == ("Out", 2, (err, err)) and runs[("node", 1)] == 1 and not open_ and raised
    siblings = ("node", 0, "gen", True, (("wait", ("list", (("leaf", 1, True), ("call", ("node", 2, "gen", True, ())))), True),))
    outcome, runs, open_, raised = C.reference(siblings)
    assert outcome == ("Out", 1, (("err", "ValueError", "leaf 1 failed"),))
    assert open_ == {("node", 2)}
    # A child's error as a task's Future gives it; children failing alike
    # leave open which ran; the root's own error as the scheduler gives it.
    alike = ("node", 0, "gen", True, (("wait", ("list", (("leaf", 1, "StopIteration"), ("leaf", 2, "StopIteration"))), True),))
    outcome, runs, open_, raised = C.reference(alike)
    assert outcome == ("Out", 1, (("err", "RuntimeError", "coroutine raised StopIteration"),))
    assert open_ == {("leaf", 1), ("leaf", 2)}
    outcome = C.reference(C.EXAMPLES["root raises what cannot be pickled"])[0]
    assert (outcome.kind, outcome.message) == ("Exception", "Unpicklable('node 0 raised')")
    assert outcome.local == ("Unpicklable", "node 0 raised")


# 60 programs on five paths, groups included (a quarter of the nodes): about
# 40 s on 2 quiet cores, minutes on loaded ones, past the suite's 120 s default.
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_random_programs(harness, request):
    n = request.config.getoption("--conformance-examples")

    @seed(20261202)
    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # shrinking re-runs clusters: the fuzz run's job
        suppress_health_check=list(HealthCheck),
    )
    @given(C.programs())
    def each(node):
        try:
            found = harness.divergences(node)
        except C.Ambiguous:
            assume(False)
        assert found == [], f"program {node!r}"

    each()


@pytest.mark.slow
def test_cancel_at_random_points(harness, request):
    """A program cancelled at a random moment on a cluster path leaves nothing
    on the scheduler or the workers, and every body that started ended (its
    ``finally`` ran)."""
    n = max(1, request.config.getoption("--conformance-examples") // 4)

    @seed(20261203)
    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(C.programs(), st.sampled_from(["inline", "task", "stolen", "paused"]), st.floats(0, 0.1))
    def each(node, path, after):
        assert harness.cancel(node, path, round(after, 3)) == [], f"program {node!r}"

    each()
