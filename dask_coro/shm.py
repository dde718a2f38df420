"""Shared-memory arrays tied to task keys: the public face of
``dask_coro.lifetimes.shm`` (see there). Needs NumPy (the ``shm`` extra)."""

from .lifetimes.shm import PREFIX, ShmArray, empty, from_array, segments, segments_in, zeros

__all__ = ["PREFIX", "ShmArray", "empty", "from_array", "segments", "segments_in", "zeros"]
