"""Groups in the table of extensions (``runtime/extensions.py``): no hook,
no plugin. A group's children are children of the run (``Run.start_children``)
or bodies run beside it (``runtime/beside.py``), and a re-run's replay is
durability's (``DurablePlugin``); the group reaches the run through the
engine's ``InPlace`` request and the trampoline's host, a ``Run``."""

from __future__ import annotations

from ..runtime.extensions import Extension, register


class GroupsExtension(Extension):
    name = "groups"
    what = "runs the children of a group"


GROUPS = register(GroupsExtension())
