"""Durability: a coroutine's children are held on the scheduler for the
coroutine's key, so a parent re-run after its worker died finds them."""
