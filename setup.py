"""The optional compiled engine, ``dask_coro/core/_cengine.c``; everything
else about the package is in pyproject.toml.

Where no C compiler (or no Python headers) is found, the build goes on
without it and the package runs its pure engine, the reference
(``python -m dask_coro`` says which engine runs). ``DASK_CORO_REQUIRE_COMPILED=1``
makes a failed build an error instead (CI sets it)."""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that leaves the compiled engine out when it cannot build it."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler at all: distutils' errors, and OSError
            self._left_out(e)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            self._left_out(e)

    def _left_out(self, error: Exception) -> None:
        if os.environ.get("DASK_CORO_REQUIRE_COMPILED", "") not in ("", "0"):
            raise error
        print(
            f"dask_coro: the compiled engine was not built ({error}); installing the pure engine",
            file=sys.stderr,
        )


setup(
    ext_modules=[
        Extension(
            "dask_coro.core._cengine",
            ["dask_coro/core/_cengine.c"],
            # CPython's own warnings level; the code is C99.
            extra_compile_args=["-Wall", "-Wno-missing-field-initializers"] if os.name != "nt" else [],
            optional=False,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
