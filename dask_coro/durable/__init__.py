"""Durable runs: a coroutine tree that outlives its cluster, resumed from a
store (``coro.durability.store``)."""
