"""Workers release keys on their own once every dependent ran there
(``coro.worker-release.enabled``): the pure book beside its plugins."""
