"""Compare the outcomes of two runs of the same tests, per test id, from the
JUnit XML files pytest writes (``--junitxml``): distributed's own tests run
without dask_coro and with it preloaded (docs/development.md says how).

    python tests/distributed_outcomes.py base-client.xml coro-client.xml

prints the counts of each run and every test whose outcome differs, and
exits 1 if one does (0 otherwise). Fetches nothing: the runs are yours.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path: str) -> dict[str, str]:
    """``{test id: passed | failed | error | skipped}`` of one JUnit XML file."""
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        test_id = f"{module}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "error" in kinds:
            outcome = "error"  # a setup/teardown error counts over the call's outcome
        elif "failure" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        out[test_id] = outcome
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("without", help="JUnit XML of the run without dask_coro")
    parser.add_argument("with_", metavar="with", help="JUnit XML of the run with dask_coro preloaded")
    args = parser.parse_args(argv)
    a, b = outcomes(args.without), outcomes(args.with_)
    print(f"without: {dict(Counter(a.values()))}")
    print(f"with:    {dict(Counter(b.values()))}")
    differ = sorted(t for t in a.keys() | b.keys() if a.get(t) != b.get(t))
    for t in differ:
        print(f"{t}: {a.get(t, 'not run')} without, {b.get(t, 'not run')} with")
    if not differ:
        print("the same outcome for every test")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
