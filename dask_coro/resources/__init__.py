"""A waiting coroutine gives its worker resources back (unless its function
says ``keep_resources=True``) and takes them again before its body goes on:
the pure book beside its worker and scheduler plugins."""
