"""Features plug into the runtime here; the runtime names none of them.

A feature (a folder beside ``runtime/``: ``diagnostics``, ``durability``,
``release``, ...) ships one subclass of ``Extension`` beside its book, in its
``extension.py``, and registers an instance with ``register``.
``dask_coro/_features.py`` imports each of those modules once, so
``import dask_coro`` fills the table; this module imports no feature. As with
distributed's ``DEFAULT_EXTENSIONS`` the table is a name -> object mapping the
server side builds from, and, as with trio's ``Instruments``, each hook is
called only on the extensions that override it: where no extension listens,
a call site costs one truth test of an empty tuple.

Its readers:

- the preload hook (``dask_coro.dask_setup``, ``preload`` here) installs the
  scheduler plugin and the worker plugin of every enabled extension;
- the worker runner, on the first coroutine task a worker runs, installs the
  plugins of every enabled extension with ``at_first_use`` (before the
  task's body runs: one that cannot be installed fails the task, with an
  error naming its ``setting``), then calls each run's hooks;
- ``@coroutine`` checks the options it is given (``check_options``);
- worker release, on the scheduler, asks the plugins that keep keys
  (``keepers``).

An extension (every method a no-op here; override what the feature needs)

``name``, ``setting``, ``what``
    Its name in the table; the ``coro.*`` setting that turns it on (None:
    always on); what its scheduler plugin does, for the error a worker
    raises when it cannot install it.
``enabled()``
    Whether it is on, from the settings (``setting`` by default). Read once
    per run, at the run's start, and at preload.
``scheduler_plugin()``, ``worker_plugin()``
    A new plugin to install (each with ``name`` and ``idempotent = True``),
    or None. Import the plugin's module inside the method: ``import
    dask_coro`` does not import distributed.
``at_first_use``
    The runner installs the plugins before the first coroutine task on each
    worker runs (else only the preload does, or the feature itself on first
    use of its API, as ``Promise`` and ``tie`` do).
``counts_calls``
    Its runs count their inline calls per function
    (``run.trampoline.call_counts()``).
``parent``
    The children its runs submit carry their parent's key (the runtime's
    ``PARENT`` annotation, read on the scheduler with
    ``children_by_parent``): the tree records it, durability holds them
    for it. Added once, whoever asks.
``options``, ``check_option(name, value)``
    The keyword options of ``@coroutine`` it reads (``run.options``), and
    their check, raising ``TypeError`` or ``ValueError`` for a bad value
    where the function is decorated (``check_options``). The call object
    carries them to the run without knowing what they mean; an option no
    extension declares is refused as an unexpected keyword argument.
``keeper``
    Scheduler side: the name of its scheduler plugin if that plugin keeps
    keys which no worker may release on its own; the plugin then has
    ``keeps(key, copy) -> bool`` (``Keeper``). Worker release asks every
    installed one (``keepers``) instead of reading other plugins.

and its hooks on a run (``Run`` below), called on the worker's event loop
unless said otherwise, only for a run during which it was enabled, once its
plugins are installed:

``run_started(run)``
    Before the body's first step.
``async supplied(run, keys)``
    The outcomes the extension has already for some of ``keys``: a
    mapping of key to the engine's ``Returned`` (a value) or ``Raised``
    (an error). Asked with the run's own key before its body's first step
    (an outcome given ends the run with it: its body never runs), and with
    the keys of each yield's tasks before they are sent (each one given is
    sent as its value, or as a task raising its error, instead of its
    task, placed on the run's own worker, where its body reads it; the
    scheduler culls a task only those needed, unless the run
    asks for it too, as it does for a ``Delayed`` a later yield may use).
    Where no extension overrides it, nothing is asked.
``async submitting(run, client, graph)``
    Before a yield's graph is sent: futures of what the extension submitted
    for it to depend on (it may rewrite ``graph``), held until it is sent.
    What it raises is raised at the yield, and nothing is sent.
``annotations(run)``
    Annotations (a dict, or None) for the children of each of the run's
    yields; merged with every other extension's.
``async around_wait(run, wait)``
    Around each wait of the run that holds no thread (its children, or an
    asyncio await of an async body), once its task is long-running: it
    must await ``wait`` once and return what it gives (or raise what it
    raises); it may do work before and after (resources are lent while
    the run waits, taken back before its body goes on). Extensions nest in
    the order they registered, the first outermost. What it raises is
    raised at the yield, as the wait's own error; a wait it ends for good
    raises ``Released`` (``run.until``).
``async results_received(run, results)``
    Values that reach the body from the cluster, before the futures that
    held them are let go of: a yield's results, a group's children's values
    (as they arrive, before the group lets go of the children), a stream's
    items and its producer's value (each batch, before the stream lets go
    of its producer), what an asyncio Task of the body (or a body run
    beside the run) awaited. A feature delivering values of its own calls
    ``run.received(values)``. What it raises is raised where the body
    would get them: at the yield, as a child's error would be; as the
    group's child's error; at the stream's wait.
``released(run, futures)``
    The run let go of these children's futures, on the loop: what this hook
    queues there runs after the client's reference counting of them and
    before the scheduler's answer to it.
``run_left(run)``
    The run is let go of because its worker closes; before its children are
    released (the scheduler reruns it elsewhere).
``async run_ended(run, outcome)``
    The run ended: ``outcome`` is the engine's ``Returned`` or ``Raised``,
    or None if it was cancelled (then do not wait: the worker may be
    closing). Before its futures are released, ahead of the task's end.

and one hook on the client side, outside any run:

``computing(key)``
    A coroutine call (or an operation on one) of key ``key`` is made into
    an expression to compute or persist on a client
    (``__dask_postcompute__``, which ``Client.compute``, ``Client.persist``
    and ``dask.compute`` ask for where they run), before its graph is sent.
    Called in the caller's thread, for the extensions enabled there.

An exception raised by a hook other than ``submitting``, ``around_wait``
and ``results_received`` is logged, naming the extension, and the run goes
on (as distributed does with its plugins' hooks): a feature's failure never
fails a user's task.

What a feature may use of a run is ``Run``, and nothing else: its hooks
get one, and so does a feature's code that runs in a body (a group, a
stream: ``Trampoline.host``, a run, or a body run beside one,
``runtime/beside.py``). What a feature keeps per run goes in
``run.notes[its name]``. ``tests/project/test_layout.py`` checks that every
attribute the feature folders read of a run is declared here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .. import _config

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Awaitable, Iterable, Mapping

    from dask.typing import Key

logger = logging.getLogger("dask_coro")

T = TypeVar("T")

#: The annotation that gives each child of a run its parent's key, when an
#: enabled extension asks for it (``Extension.parent``).
PARENT = "dask_coro_parent"


def children_by_parent(annotations: dict[str, dict[Key, Any]] | None) -> dict[Key, list[Key]]:
    """The keys of one graph submission (a scheduler plugin's
    ``update_graph``), by the run that submitted them (their ``PARENT``)."""
    out: dict[Key, list[Key]] = {}
    for key, parent in ((annotations or {}).get(PARENT) or {}).items():
        out.setdefault(parent, []).append(key)
    return out


class Run(Protocol):
    """What a feature may use of a run on a worker: what its hooks get, and
    what its code in a body finds as the trampoline's host
    (``Trampoline.host``: the run, or a body run beside it,
    ``runtime/beside.py``). Read on the worker's event loop, unless said
    otherwise."""

    #: Per extension (by name), what it keeps for this run (any thread).
    notes: dict[str, Any]
    #: Set (on the loop) to let the body's next step go without waiting for
    #: a thread of the pool: a feature waking it for a deadline.
    urgent: bool

    @property
    def worker(self) -> Any:
        """The distributed ``Worker`` it runs on."""

    @property
    def key(self) -> Key:
        """Its task's key (a body beside a run: the run's)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The worker's event loop (``call_soon_threadsafe`` from the body's thread)."""

    @property
    def options(self) -> Mapping[str, Any]:
        """The options of its function (``@coroutine(name=value)``), each
        read by the extension that declares it (``Extension.options``)."""

    @property
    def beside(self) -> bool:
        """True for a body run beside a run: no task of its own (it is no
        stream's producer)."""

    @property
    def trampoline(self) -> Any:
        """The engine stepping it (``call_counts()``); None before its start."""

    @property
    def client(self) -> Any:
        """The worker's client the run submits through, or None before its first submission."""

    def annotations(self) -> dict[str, Any]:
        """The annotations of its task (a body beside a run: the run's, with
        those its starter gave)."""

    def ident(self, kind: str) -> Any:
        """A new name under the run's key for a feature's children
        (``kind``): the same in a re-run that asks in the same order."""

    def scope_here(self, tramp: Any) -> Any:
        """Asked from a body of the run, on its thread (``tramp`` its
        engine): what children started for it share with its yields (a
        yield's cache of results, for ``start_children``); None where there
        is nothing to share (a body beside a run)."""

    async def start_children(
        self, leaves: list[Any], paths: list[Any], ident: Any, annotations: dict[str, Any] | None = None,
        scope: Any = None,
    ) -> list[Any]:
        """Submit ``leaves`` as children of the run in one message, keyed as
        a yield's leaves at ``paths`` under ``ident``, annotated as a yield's
        children and with ``annotations``; the futures of their values, in
        order, which the caller holds and lets go of (``release``). With
        ``scope`` (``scope_here``), planned as a yield of that body: its
        earlier results used, those below the leaves kept for its later
        yields."""

    def release(self, futures: Any) -> None:
        """Let go of futures ``start_children`` gave (any thread)."""

    async def gather(self, futures: Any) -> Any:
        """The values of ``futures`` (a list, or one), gathered as a task of
        this worker does: from its own memory, or from the workers holding
        them."""

    async def received(self, values: list[Any]) -> None:
        """``values`` reach the body (a feature's children's values, a
        stream's items): the extensions' ``results_received``, awaited
        before the caller lets go of the futures that held them."""

    async def submitting_client(self) -> Any:
        """The worker's client the run submits with (made on first use)."""

    def installed(self, name: str) -> bool:
        """Whether the plugins of extension ``name`` are installed (those
        installed at first use are, before the run starts)."""

    async def until(self, waiting: asyncio.Future[Any]) -> Any:
        """Await ``waiting``; raise ``Released`` (and cancel it) once the
        run's task stops running here: how ``around_wait`` waits for
        anything else."""


class Keeper(Protocol):
    """A scheduler plugin that keeps keys (``Extension.keeper``)."""

    def keeps(self, key: Key, copy: bool) -> bool:
        """Whether ``key`` (in memory) must stay until the scheduler
        releases it: no worker may drop it on its own (``copy``: the copy
        another worker fetched of it, its original kept where it is)."""
        ...


class Extension:
    """A feature's hooks into the runtime: see the module's docstring."""

    name: str = ""
    setting: str | None = None
    what: str = ""
    at_first_use: bool = False
    counts_calls: bool = False
    parent: bool = False
    options: tuple[str, ...] = ()
    keeper: str | None = None

    def enabled(self) -> bool:
        return self.setting is None or bool(_config.get(self.setting))

    def scheduler_plugin(self) -> Any:
        return None

    def worker_plugin(self) -> Any:
        return None

    def check_option(self, name: str, value: Any) -> None:
        """Raise ``TypeError`` or ``ValueError`` if ``value`` is no value of
        option ``name`` (one of ``options``)."""

    # -- hooks on a run ------------------------------------------------------

    def run_started(self, run: Run) -> None:
        pass

    def annotations(self, run: Run) -> dict[str, Any] | None:
        return None

    async def supplied(self, run: Run, keys: list[Key]) -> Mapping[Key, Any]:
        """Outcomes (``Returned`` or ``Raised``) the extension has already for
        some of ``keys``: the run's own, before its body starts, or its
        yields' tasks, before they are sent."""
        return {}

    async def submitting(self, run: Run, client: Any, graph: dict[Any, Any]) -> list[Any]:
        """Before a yield's graph is sent: what the graph must depend on that
        the extension submits itself (it may rewrite ``graph`` in place); the
        futures it returns are held until the graph is sent. What it raises is
        raised at the yield, and nothing is sent."""
        return []

    async def around_wait(self, run: Run, wait: Awaitable[T]) -> T:
        """Around a wait of the run: await ``wait`` once and return its
        value (or raise its error), with work of the extension's own before
        and after."""
        return await wait

    async def results_received(self, run: Run, results: list[Any]) -> None:
        pass

    def released(self, run: Run, futures: list[Any]) -> None:
        pass

    def run_left(self, run: Run) -> None:
        pass

    async def run_ended(self, run: Run, outcome: Any) -> None:
        pass

    # -- on the client side --------------------------------------------------

    def computing(self, key: Key) -> None:
        """A coroutine call of key ``key`` is computed or persisted on a client."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


#: The hooks on a run, in the order a run calls them.
HOOKS = (
    "run_started", "supplied", "submitting", "annotations", "around_wait", "results_received", "released", "run_left", "run_ended",
)

_TABLE: dict[str, Extension] = {}
_ACTIVE: dict[tuple[Extension, ...], Active] = {}
_KEEPERS: list[tuple[str, ...]] = []  # keepers(), once made


def register(extension: Extension) -> Extension:
    """Add ``extension`` to the table (once: registering the same name again
    with another type is an error). Returns it."""
    name = extension.name
    if not name:
        raise ValueError(f"{extension!r} has no name: set Extension.name")
    old = _TABLE.get(name)
    if old is not None and type(old) is not type(extension):
        raise ValueError(f"a dask_coro extension named {name!r} is registered already: {old!r}")
    _TABLE[name] = extension
    _ACTIVE.clear()
    _KEEPERS.clear()
    return extension


def unregister(name: str) -> Extension | None:
    """Take the extension ``name`` out of the table (for tests)."""
    _ACTIVE.clear()
    _KEEPERS.clear()
    return _TABLE.pop(name, None)


def registered() -> tuple[Extension, ...]:
    """Every extension in the table, in the order they registered."""
    return tuple(_TABLE.values())


def get(name: str) -> Extension | None:
    return _TABLE.get(name)


def keepers() -> tuple[str, ...]:
    """Scheduler side: the names of the scheduler plugins that keep keys
    (``Extension.keeper``), of every registered extension, enabled or not
    (a plugin another process installed counts); ask each one installed."""
    if not _KEEPERS:
        _KEEPERS.append(tuple(e.keeper for e in _TABLE.values() if e.keeper))
    return _KEEPERS[0]


def check_options(options: Mapping[str, Any]) -> None:
    """Check the ``@coroutine`` keyword ``options``: each declared by a
    registered extension (``Extension.options``), which checks its value."""
    for name, value in options.items():
        owner = next((e for e in _TABLE.values() if name in e.options), None)
        if owner is None:
            raise TypeError(f"coroutine() got an unexpected keyword argument {name!r}")
        owner.check_option(name, value)


class Active:
    """The extensions enabled for one run, and per hook the ones that
    override it (a tuple each, empty when none does)."""

    __slots__ = ("all", "at_first_use", "counts_calls", "parent", "computing", *HOOKS)

    all: tuple[Extension, ...]
    at_first_use: tuple[Extension, ...]
    counts_calls: bool
    parent: bool
    run_started: tuple[Extension, ...]
    supplied: tuple[Extension, ...]
    annotations: tuple[Extension, ...]
    submitting: tuple[Extension, ...]
    around_wait: tuple[Extension, ...]
    results_received: tuple[Extension, ...]
    released: tuple[Extension, ...]
    run_left: tuple[Extension, ...]
    run_ended: tuple[Extension, ...]
    computing: tuple[Extension, ...]

    def __init__(self, extensions: Iterable[Extension]):
        self.all = tuple(extensions)
        self.at_first_use = tuple(e for e in self.all if e.at_first_use)
        self.counts_calls = any(e.counts_calls for e in self.all)
        self.parent = any(e.parent for e in self.all)
        for hook in (*HOOKS, "computing"):
            base = getattr(Extension, hook)
            setattr(self, hook, tuple(e for e in self.all if getattr(type(e), hook) is not base))


def active() -> Active:
    """The extensions enabled now (each one's ``enabled()``, read here),
    with their hooks; the same object for the same set."""
    on = tuple(e for e in _TABLE.values() if e.enabled())
    found = _ACTIVE.get(on)
    if found is None:
        found = _ACTIVE[on] = Active(on)
    return found


def notify(listeners: tuple[Extension, ...], hook: str, *args: Any) -> None:
    """Call ``hook`` of each of ``listeners``, logging one that raises."""
    for ext in listeners:
        try:
            getattr(ext, hook)(*args)
        except Exception:
            logger.exception("dask_coro extension %r failed in %s", ext.name, hook)


def computing(key: Key) -> None:
    """The ``computing`` hook of the extensions enabled now (a call is
    computed on a client: ``ops.BuiltLazily.__dask_postcompute__``)."""
    listeners = active().computing
    if listeners:
        notify(listeners, "computing", key)


async def notify_async(listeners: tuple[Extension, ...], hook: str, *args: Any) -> None:
    """Await ``hook`` of each of ``listeners``, logging one that raises."""
    for ext in listeners:
        try:
            await getattr(ext, hook)(*args)
        except Exception:
            logger.exception("dask_coro extension %r failed in %s", ext.name, hook)


async def preload(server: Any) -> None:
    """Install the scheduler and worker plugins of every enabled extension
    from a scheduler's or a worker's preload (``dask_setup``); a worker asks
    its scheduler. Installing them again later (first use) is a no-op."""
    from distributed import Scheduler
    from distributed.protocol.pickle import dumps

    on_scheduler = isinstance(server, Scheduler)
    for ext in registered():
        if not ext.enabled():
            continue
        plugin = ext.scheduler_plugin()
        if plugin is not None:
            if on_scheduler:
                server.add_plugin(plugin, idempotent=True)
            else:
                await server.scheduler.register_scheduler_plugin(
                    plugin=dumps(plugin), name=plugin.name, idempotent=True
                )
        plugin = ext.worker_plugin()
        if plugin is not None:
            # The scheduler adds it to every worker, now and to come
            # (``Scheduler.register_worker_plugin``).
            register_worker = server.register_worker_plugin if on_scheduler else server.scheduler.register_worker_plugin
            args = (None,) if on_scheduler else ()
            await register_worker(*args, plugin=dumps(plugin), name=plugin.name, idempotent=True)
