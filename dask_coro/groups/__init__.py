"""Groups of children: completion order, limits, deadlines, one way out
(``dask_coro.group``). ``book.py`` is the pure part; ``api.py`` the user's
object and the runner-less backend; ``worker.py`` and ``client.py`` the
backends on a distributed worker and in client code."""
