"""Streaming children (``dask_coro.stream``, ``dask_coro.emit``): a producer
hands items to its consumer while it runs. ``api.py`` is the user's objects
and the runner-less backend; ``book.py`` the pure part (what a stream
published, what its consumer took, whether a producer may go on);
``remote.py`` the consumer and the producer on a cluster; ``scheduler.py``
the plugin that tells each side of the other."""
