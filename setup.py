"""The optional compiled engine, ``dask_coro/core/_cengine.c``; everything
else about the package is in pyproject.toml.

Where no C compiler (or no Python headers) is found, the build goes on
without it and the package runs its pure engine, the reference
(``python -m dask_coro`` says which engine runs); so it is on a Python it
is not written for (``left_out``: a free-threaded build, another version or
implementation). ``DASK_CORO_REQUIRE_COMPILED=1`` makes a failed build an
error instead (CI sets it)."""

from __future__ import annotations

import os
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: The CPython versions _cengine.c is written for (it says the same).
VERSIONS = ((3, 10), (3, 13))


def left_out(
    version: tuple[int, ...] = tuple(sys.version_info[:2]),
    implementation: str = sys.implementation.name,
    gil_disabled: object = sysconfig.get_config_var("Py_GIL_DISABLED"),
) -> str | None:
    """Why the compiled engine is not built for this Python, or None (built).

    It reads and writes CPython's objects under the GIL: a free-threaded
    build would share its lists and its free list of calls between threads
    without a lock, so it runs the pure engine there."""
    if implementation != "cpython":
        return f"{implementation} is not CPython"
    if gil_disabled:
        return "a free-threaded Python: the compiled engine needs the GIL"
    low, high = VERSIONS
    if not low <= tuple(version[:2]) <= high:
        shown = ".".join(map(str, version[:2]))
        return (f"CPython {shown}: the compiled engine is written for "
                f"{low[0]}.{low[1]} to {high[0]}.{high[1]}")
    return None


class OptionalBuildExt(build_ext):
    """build_ext that leaves the compiled engine out when it cannot build it."""

    def run(self) -> None:
        why = left_out()
        if why is not None:
            self._left_out(RuntimeError(why))
            return
        try:
            super().run()
        except Exception as e:  # no compiler at all: distutils' errors, and OSError
            self._left_out(e)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            self._left_out(e, ext.name)

    def _left_out(self, error: Exception, name: str = "dask_coro.core._cengine") -> None:
        if os.environ.get("DASK_CORO_REQUIRE_COMPILED", "") not in ("", "0"):
            raise error
        what = {
            "dask_coro.core._cengine": "the compiled engine was not built ({}); installing the pure engine",
            "dask_coro.lifetimes._npalloc": "the stream items' allocator was not built ({}); items are copied",
        }
        print("dask_coro: " + what.get(name, name + " was not built ({})").format(error), file=sys.stderr)


if __name__ == "__main__":  # also under pip (setuptools.build_meta runs it so); tests import it
    setup(
        ext_modules=[
            Extension(
                "dask_coro.core._cengine",
                ["dask_coro/core/_cengine.c"],
                # CPython's own warnings level; the code is C99.
                extra_compile_args=["-Wall", "-Wno-missing-field-initializers"] if os.name != "nt" else [],
                optional=False,
            )
        ]
        + (
            # NumPy arrays of a stream's items made in shared memory
            # (lifetimes/_npalloc.c): POSIX only, no NumPy headers needed.
            [
                Extension(
                    "dask_coro.lifetimes._npalloc",
                    ["dask_coro/lifetimes/_npalloc.c"],
                    extra_compile_args=["-Wall", "-Wno-missing-field-initializers"],
                    optional=False,
                )
            ]
            if os.name == "posix"
            else []
        ),
        cmdclass={"build_ext": OptionalBuildExt},
    )
