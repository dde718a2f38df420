"""Every use of distributed's private or undocumented API, one module per
distributed module it relies on, named after it: ``worker`` (the ``Worker``
object: its plugins, data, streams, the task thread's state),
``worker_state_machine`` (``WorkerState``, its tasks and events),
``threadpoolexecutor`` (the pool thread a task runs on, seceding),
``client`` (``Client`` and ``Future``: submitting, streams, blocking calls),
``scheduler`` (``Scheduler`` and its task state), ``core`` (a server's
handlers), ``batched`` (``BatchedSend``), ``collections`` (the scheduler
queue's ``HeapSet``) and ``dashboard`` (the scheduler's dashboard).

Checked against distributed 2025.9.0 to 2026.8.0 (the supported window,
docs/development.md: no release of it differs in what is used here). Each
function names what it relies on; ``tests/internals/test_internals.py`` pins each
assumption against the installed distributed, so a release that changes one
fails a named test instead of hanging somewhere; its difference is absorbed
here, with a comment naming the release. Only the adapters (runners, plugins)
import these modules; most import distributed as they are imported.
"""
