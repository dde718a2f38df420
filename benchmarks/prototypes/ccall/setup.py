"""Builds the prototype in place: python setup.py build_ext --inplace (see README.md)."""

from setuptools import Extension, setup

setup(
    name="dask-coro-ccall-prototype",
    ext_modules=[Extension("_ccall", ["_ccall.c"], extra_compile_args=["-O2", "-Wall"])],
)
