"""A smoke test of dask_coro as installed from its wheel (CI, .ci/run), run
as ``python tests/smoke_installed.py`` by the environment's interpreter from
a folder outside the repository, so that the installed package, not the
source tree, is imported. It checks what only a built package can get wrong:
the files beside the code (package data), the version, the engine (with
``--engine compiled``: the compiled one is built into the wheel and runs), the console script,
that every module imports with the base dependencies alone, and one
computation on a cluster. With ``--base`` (right after ``pip install`` of
the wheel alone) it checks too that no package only an extra asks for came
with it. Exit status 0 when all hold."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
import importlib.util
import os
import pkgutil
import shutil
import subprocess
import sys

import dask

import dask_coro


def _extras_only() -> set[str]:
    """The distributions that only an extra of dask-coro asks for."""
    from packaging.requirements import Requirement

    extra, base = set(), set()
    for line in importlib.metadata.requires("dask-coro") or []:
        req = Requirement(line)
        (extra if req.marker is not None and "extra" in str(req.marker) else base).add(req.name.lower())
    return extra - base


def main(base_only: bool, engine: str | None) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    source = os.path.dirname(here)
    assert not os.path.abspath(dask_coro.__file__).startswith(source + os.sep), (
        f"dask_coro was imported from the source tree ({dask_coro.__file__}), not the installed package"
    )
    # the version: written once, and the installed distribution's
    assert dask_coro.__version__ == importlib.metadata.version("dask-coro"), dask_coro.__version__
    if base_only:  # pip install of the wheel brought the base dependencies only
        installed = {d.metadata["Name"].lower() for d in importlib.metadata.distributions()}
        extras = _extras_only()
        assert extras, "dask-coro's metadata names no extras"
        assert not extras & installed, f"installed, though only an extra asks for them: {sorted(extras & installed)}"
    # the engine in use: with --engine compiled, the wheel carries the
    # compiled engine and it is the one that runs (DASK_CORO_PURE unset)
    if engine is not None:
        assert dask_coro.engine == engine, f"engine {dask_coro.engine!r}, not {engine!r}"
        if engine == "compiled":
            assert dask_coro.CoroutineFunction.__mro__[1].__module__ == "dask_coro.core._cengine"
    # the package data
    files = importlib.resources.files("dask_coro")
    for name in ("py.typed", "coro.yaml", "coro-schema.yaml"):
        assert (files / name).is_file(), f"{name} is missing from the installed package"
    assert dask.config.get("coro.inline.enabled") is True  # coro.yaml's defaults are loaded
    # every module imports; shared memory (dask_coro.shm) needs NumPy, the shm extra
    no_numpy = importlib.util.find_spec("numpy") is None
    for module in pkgutil.walk_packages(dask_coro.__path__, "dask_coro."):
        if module.name in ("dask_coro.shm", "dask_coro.lifetimes.shm") and no_numpy:
            continue
        importlib.import_module(module.name)
    # the console script
    script = shutil.which("dask-coro", path=os.path.dirname(sys.executable))
    assert script, "the dask-coro script is not installed"
    out = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage: dask-coro "), out.stdout + out.stderr
    # a coroutine on a cluster whose worker processes import the installed package
    from distributed import Client

    from dask_coro.examples import fib, process_all

    with Client(n_workers=1, threads_per_worker=1, dashboard_address=":0") as client:
        assert client.compute(fib(15)).result() == 610
        assert process_all().compute() == 55
        # the workers run the engine this process does
        assert set(client.run(lambda: __import__("dask_coro").engine).values()) == {dask_coro.engine}
    print(f"dask_coro {dask_coro.__version__} installed at {os.path.dirname(dask_coro.__file__)}: ok")


if __name__ == "__main__":
    argv = sys.argv[1:]
    main(base_only="--base" in argv, engine=argv[argv.index("--engine") + 1] if "--engine" in argv else None)
