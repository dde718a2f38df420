from __future__ import annotations

import os
import sys

# Worker processes started by the tests (LocalCluster, `dask worker`) import
# the test modules' functions by name; make this folder importable for them.
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (HERE, os.environ.get("PYTHONPATH")) if p
)
