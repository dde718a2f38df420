"""Builds floor_pyx and cycall in place: python setup.py build_ext --inplace (see README.md)."""

from Cython.Build import cythonize
from setuptools import setup

setup(name="dask-coro-cython-floor", ext_modules=cythonize(["floor_pyx.pyx", "cycall.pyx"], quiet=True))
