"""dask_coro's settings: the ``coro`` namespace of dask.config."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask
import pytest
import yaml
from distributed import Client
from distributed.utils_test import gen_cluster
from workloads import inc

import dask_coro
from dask_coro import _config, coroutine
from dask_coro._config import get_timedelta

EXPECTED = {
    "coro.client-batch-interval": "2ms",
    "coro.secede-after": "50ms",
    "coro.inline.enabled": True,
    "coro.inline.stealing": "push",
    "coro.inline.interval": "20ms",
    "coro.inline.switch-interval": "1ms",
    "coro.durability.hold-children": True,
    "coro.durability.hold-bytes": "64MiB",
    "coro.durability.store": None,
    "coro.durability.store-key": None,
    "coro.durability.store-options": None,
    "coro.durability.store-bytes": None,
    "coro.durability.store-batch-window": "100ms",
    "coro.stream.segment-pool": "256MiB",
    "coro.stream.segment-pool-idle": "10s",
    "coro.worker-release.enabled": False,
    "coro.lifetimes.retry-delay": "500ms",
    "coro.lifetimes.close-timeout": "10s",
    "coro.lifetimes.leave-timeout": "10s",
    "coro.tree.enabled": True,
    "coro.tree.max-nodes": 100000,
}


def load(path: str) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def leaves(config: dict, prefix: str = "") -> dict:
    """{"coro.lifetimes.retry-delay": "500ms", ...} of a nested dict."""
    out = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def schema_leaves(schema: dict, prefix: str = "") -> dict:
    """{"coro.lifetimes.retry-delay": {type:, description:}, ...} of a schema."""
    out = {}
    for k, v in schema["properties"].items():
        if v.get("type") == "object" and "properties" in v:
            out.update(schema_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_defaults_loaded_at_import():
    out = run_with_env(
        "import json, dask, dask_coro\n"
        "print(json.dumps(dask.config.get('coro')))"
    )
    assert leaves({"coro": json.loads(out)}) == EXPECTED


@pytest.mark.inline  # the shipped defaults, which other tests turn off
@pytest.mark.segment_pool("256MiB")
def test_defaults_in_this_process():
    assert dask_coro._config is _config
    for key, value in EXPECTED.items():
        assert _config.get(key) == value, key
    assert get_timedelta("coro.client-batch-interval") == 0.002
    assert get_timedelta("coro.lifetimes.retry-delay") == 0.5
    assert get_timedelta("coro.lifetimes.close-timeout") == 10.0
    assert get_timedelta("coro.lifetimes.leave-timeout") == 10.0


def test_defaults_survive_a_config_reset(monkeypatch):
    # distributed.utils_test.gen_cluster resets dask.config to a copy taken at
    # its import, without "coro" if that was before import dask_coro.
    monkeypatch.delitem(dask.config.config, "coro", raising=False)
    with pytest.raises(KeyError):
        dask.config.get("coro.lifetimes.retry-delay")
    assert _config.get("coro.tree.max-nodes") == 100000
    assert get_timedelta("coro.lifetimes.retry-delay") == 0.5
    with dask.config.set({"coro.lifetimes.retry-delay": "2s"}):
        assert get_timedelta("coro.lifetimes.retry-delay") == 2.0
    with pytest.raises(KeyError):
        _config.get("coro.no-such-key")


def test_defaults_file_has_exactly_the_expected_keys():
    assert leaves(load(_config.DEFAULTS_FILE)) == EXPECTED


def test_every_key_described_in_the_schema_and_vice_versa():
    defaults = leaves(load(_config.DEFAULTS_FILE))
    schema = schema_leaves(load(_config.SCHEMA_FILE))
    assert set(defaults) == set(schema)
    for key, entry in schema.items():
        assert entry.get("type"), key
        assert isinstance(entry.get("description"), str), key
        assert entry["description"].strip(), key
    # Each object level is described too.
    top = load(_config.SCHEMA_FILE)["properties"]["coro"]
    assert top["description"]
    for name in ("inline", "lifetimes", "tree", "durability"):
        assert top["properties"][name]["description"], name


JSON_TYPES = {
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
    "null": type(None),
    "object": dict,
}


def test_schema_types_match_defaults_structurally():
    defaults = leaves(load(_config.DEFAULTS_FILE))
    schema = schema_leaves(load(_config.SCHEMA_FILE))
    for key, value in defaults.items():
        types = schema[key]["type"]
        types = [types] if isinstance(types, str) else types
        ok = any(
            isinstance(value, JSON_TYPES[t])
            and not (isinstance(value, bool) and t in ("number", "integer"))
            for t in types
        )
        assert ok, (key, value, types)


def test_schema_validates_defaults():
    jsonschema = pytest.importorskip(
        "jsonschema", reason="jsonschema not installed (the structural test still runs)"
    )
    schema = load(_config.SCHEMA_FILE)
    jsonschema.validate(load(_config.DEFAULTS_FILE), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"coro": {"tree": {"max-nodes": "many"}}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"coro": {"lifetimes": {"retry-delay": None}}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"coro": {"inline": {"stealing": "sometimes"}}}, schema)


def test_set_takes_effect_at_use_time():
    with dask.config.set({"coro.lifetimes.retry-delay": "1.5s"}):
        assert get_timedelta("coro.lifetimes.retry-delay") == 1.5
    with dask.config.set({"coro.lifetimes.retry-delay": 2}):  # bare number: seconds
        assert get_timedelta("coro.lifetimes.retry-delay") == 2.0
    assert get_timedelta("coro.lifetimes.retry-delay") == 0.5


@pytest.mark.parametrize("value", ["not-a-time", "1x", -1, True, None, [1]])
def test_bad_value_names_the_key(value):
    with dask.config.set({"coro.lifetimes.retry-delay": value}), pytest.raises(ValueError) as info:
        get_timedelta("coro.lifetimes.retry-delay")
    assert str(info.value) == f"coro.lifetimes.retry-delay: {value!r} is not a time interval"


@pytest.mark.parametrize("value", [None, 0, "0ms"])
def test_client_batch_interval_may_be_off(value):
    with dask.config.set({"coro.client-batch-interval": value}):
        assert not get_timedelta("coro.client-batch-interval", allow_none=True)


@coroutine
def two_children(x):
    a, b = yield [inc(x), inc(x + 1)]
    return a + b


def worker_client_interval(worker) -> float:
    client = worker._client
    assert client is not None and "-worker-" in client.id, client
    return client.scheduler_comm.interval


async def compute(s, call):
    # Not gen_cluster's client=True: a worker reuses a default client of its
    # scheduler found in its process, which is then not a "-worker-" client.
    async with Client(s.address, asynchronous=True, set_as_default=False) as c:
        return await c.compute(call)


@gen_cluster(nthreads=[("", 1)], config={"coro.client-batch-interval": "5ms"})
async def test_client_batch_interval_set_on_the_worker_client(s, a):
    assert await compute(s, two_children(1)) == 5
    assert worker_client_interval(a) == 0.005


@gen_cluster(nthreads=[("", 1)])
async def test_client_batch_interval_default_and_read_at_use_time(s, a):
    assert _config.get("coro.client-batch-interval") == "2ms"
    # The cluster started with the defaults; the worker's client is made (and
    # its interval set) when the first coroutine needs it.
    with dask.config.set({"coro.client-batch-interval": "7ms"}):
        assert await compute(s, two_children(1)) == 5
    assert worker_client_interval(a) == 0.007


@gen_cluster(nthreads=[("", 1)])
async def test_client_batch_interval_default(s, a):
    assert await compute(s, two_children(1)) == 5
    assert worker_client_interval(a) == 0.002


@pytest.mark.parametrize("value", [None, 0])
def test_client_batch_interval_off_leaves_distributed_default(value):
    @gen_cluster(nthreads=[("", 1)], config={"coro.client-batch-interval": value})
    async def run(s, a):
        assert await compute(s, two_children(1)) == 5
        assert worker_client_interval(a) == 0.01  # Client._ensure_connected's 10ms

    run()


@gen_cluster(nthreads=[("", 1)], config={"coro.client-batch-interval": "soon"})
async def test_client_batch_interval_bad_value_fails_the_coroutine(s, a):
    with pytest.raises(ValueError, match=r"coro\.client-batch-interval: 'soon' is not a time"):
        await compute(s, two_children(1))


def run_with_env(code: str, **env: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        # Without the settings tests/conftest.py puts in the environment.
        env={**{k: v for k, v in os.environ.items() if not k.startswith("DASK_CORO__")}, **env},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_env_var_is_picked_up():
    out = run_with_env(
        "import dask, dask_coro\n"
        "from dask_coro._config import get_timedelta\n"
        "print(dask.config.get('coro.lifetimes.close-timeout'))\n"
        "print(get_timedelta('coro.lifetimes.close-timeout'))\n"
        "print(dask.config.get('coro.lifetimes.retry-delay'))\n"
        "print(dask.config.get('coro.tree.max-nodes'))",
        DASK_CORO__LIFETIMES__CLOSE_TIMEOUT="3s",
        DASK_CORO__TREE__MAX_NODES="7",
    )
    assert out.split() == ["3s", "3.0", "500ms", "7"]


def test_env_var_null_client_batch_interval():
    out = run_with_env(
        "import dask, dask_coro\n"
        "from dask_coro._config import get_timedelta\n"
        "print(get_timedelta('coro.client-batch-interval', allow_none=True))",
        DASK_CORO__CLIENT_BATCH_INTERVAL="None",
    )
    assert out == "None"


def test_user_yaml_file_is_picked_up(tmp_path):
    (tmp_path / "mine.yaml").write_text("coro:\n  lifetimes:\n    leave-timeout: 250ms\n")
    out = run_with_env(
        "import dask, dask_coro\n"
        "from dask_coro._config import get_timedelta\n"
        "print(get_timedelta('coro.lifetimes.leave-timeout'))\n"
        "print(dask.config.get('coro.lifetimes.close-timeout'))",
        DASK_CONFIG=str(tmp_path),
    )
    assert out.split() == ["0.25", "10s"]


# -- every setting is checked where a computation uses it ----------------------------

#: A bad value of each kind of setting the schema describes.
BAD = {
    "time-interval": "soon", "boolean": "no", "integer": "many", "enum": "sometimes", "size-or-fraction": "lots",
    "string|null": 5, "object|null": "endpoint_url=x", "size": 0.5,
}


def kind_of(entry: dict) -> str:
    if entry.get("format") in ("time-interval", "size-or-fraction", "size"):
        return entry["format"]
    if "enum" in entry:
        return "enum"
    kind = entry["type"]
    return "|".join(kind) if isinstance(kind, list) else kind


@pytest.mark.parametrize("key", sorted(_config.SETTINGS))
def test_every_setting_is_checked_against_the_schema(key):
    entry = _config.SETTINGS[key]
    _config.check_value(key, _config.defaults_of(key))
    bad = BAD[kind_of(entry)]
    with pytest.raises(ValueError) as info:
        _config.check_value(key, bad)
    assert str(info.value).startswith(f"{key}: {bad!r} is not")
    with dask.config.set({key: bad}), pytest.raises(ValueError, match=f"^{key}: {bad!r} is not"):
        _config.check()
    _config.check()  # and good again
    jsonschema = pytest.importorskip("jsonschema")
    nested: dict = {}
    d = nested
    *path, last = key.split(".")
    for part in path:
        d = d.setdefault(part, {})
    d[last] = bad
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(nested, load(_config.SCHEMA_FILE))


def test_the_schema_settings_are_the_defaults():
    assert set(_config.SETTINGS) == set(leaves(load(_config.DEFAULTS_FILE)))


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("coro.inline.intervall", "1s", "coro.inline.intervall is not a dask_coro setting; did you mean coro.inline.interval?"),
        ("coro.tree.enabeld", True, "coro.tree.enabeld is not a dask_coro setting; did you mean coro.tree.enabled?"),
        ("coro.nothing", 1, "coro.nothing is not a dask_coro setting; the settings are coro.client-batch-interval"),
    ],
)
def test_a_misspelled_setting_is_named(key, value, message):
    with dask.config.set({key: value}), pytest.raises(ValueError) as info:
        _config.check()
    assert str(info.value).startswith(message)


def test_underscores_and_hyphens_are_one_key():
    # As dask.config reads them: DASK_CORO__TREE__MAX_NODES gives max_nodes.
    with dask.config.set({"coro.tree.max_nodes": 5}):
        _config.check()
    with dask.config.set({"coro.tree.max_nodes": -5}), pytest.raises(ValueError, match="max-nodes: -5"):
        _config.check()


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"coro.inline.interval": "soon"}, "coro.inline.interval: 'soon' is not a time interval"),
        ({"coro.tree.enabled": "no"}, "coro.tree.enabled: 'no' is not true or false"),
        ({"coro.tree.max-nodes": "many"}, "coro.tree.max-nodes: 'many' is not a whole number"),
        ({"coro.inline.stealing": "sometimes"}, "coro.inline.stealing: 'sometimes' is not one of push, poll"),
    ],
)
@pytest.mark.parametrize("inline", [True, False])
def test_a_bad_setting_fails_a_local_computation(setting, message, inline):
    with dask.config.set({**setting, "coro.inline.enabled": inline}):
        with pytest.raises(ValueError, match=message):
            two_children(1).compute(scheduler="sync")
        with pytest.raises(ValueError, match=message):
            dask_coro.result(two_children(1))
        with pytest.raises(ValueError, match=message):
            dask.compute(two_children(1), scheduler="threads")
        assert dask.delayed(sum)([1, 2]).compute(scheduler="sync") == 3  # plain dask is not ours to check
    assert two_children(1).compute(scheduler="sync") == 5


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"coro.inline.interval": "soon"}, "coro.inline.interval: 'soon' is not a time interval"),
        ({"coro.durability.hold-children": "yes"}, "coro.durability.hold-children: 'yes' is not true or false"),
        ({"coro.tree.max-nodes": -1}, "coro.tree.max-nodes: -1 is not a whole number of 0 or more"),
        ({"coro.durability.hold-bytes": "lots"}, "coro.durability.hold-bytes: 'lots' is not a size in bytes"),
        ({"coro.lifetimes.leave-timeout": "later"}, "coro.lifetimes.leave-timeout: 'later' is not a time interval"),
    ],
)
@pytest.mark.parametrize("inline", [True, False])
def test_a_bad_setting_on_the_worker_fails_the_computation_at_the_client(setting, message, inline):
    @gen_cluster(client=True, nthreads=[("", 1)], config={**setting, "coro.inline.enabled": inline})
    async def run(c, s, a):
        with pytest.raises(ValueError, match=message):
            await c.compute(two_children(1))
        fut = c.compute(two_children(2))
        with pytest.raises(ValueError, match=message):
            await fut.result()
        # The same program as plain Dask is not affected.
        assert await c.compute(dask.delayed(sum)([1, 2])) == 3
        with dask.config.set({**{k: _config.defaults_of(k) for k in setting}}):
            assert await c.compute(two_children(3)) == 9

    run()


@pytest.mark.inline  # the inline plugin is installed when calls may run inline
@pytest.mark.parametrize(
    "setting, message",
    [
        (
            {"coro.inline.interval": "soon"},
            "coro.inline.interval: 'soon' is not a time interval (on the scheduler, "
            "starting dask_coro's dask-coro-inline plugin)",
        ),
        (
            {"coro.tree.max-nodes": "many"},
            "coro.tree.max-nodes: 'many' is not a whole number of 0 or more (on the "
            "scheduler, starting dask_coro's dask-coro-tree plugin)",
        ),
    ],
)
def test_a_bad_setting_on_the_scheduler_fails_the_computation_at_the_client(setting, message):
    # LocalCluster's scheduler runs in this process, its worker in another,
    # started with the good settings: only the scheduler reads the bad one,
    # when the worker's first coroutine installs the plugin that reads it.
    from distributed import LocalCluster

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as lc,
        Client(lc) as c,
    ):
        with dask.config.set(setting):
            with pytest.raises(ValueError) as info:
                c.compute(two_children(1)).result()
            assert str(info.value) == message
            # Again for the next computation: not only logged once.
            with pytest.raises(ValueError, match="on the scheduler"):
                c.compute(two_children(2)).result()
        assert c.compute(two_children(3)).result() == 9  # installed now


@pytest.mark.parametrize(
    "plugin, config",
    [
        ("TreePlugin", {}),
        ("DurablePlugin", {}),
        ("InlinePlugin", {"coro.inline.enabled": True}),
        ("ReleasePlugin", {"coro.worker-release.enabled": True}),
    ],
)
def test_a_plugin_that_cannot_be_installed_fails_the_computation(plugin, config, monkeypatch):
    from dask_coro import DaskCoroError
    from dask_coro.diagnostics.scheduler import TreePlugin
    from dask_coro.durability.scheduler import DurablePlugin
    from dask_coro.release.scheduler import ReleasePlugin
    from dask_coro.runtime.scheduler import InlinePlugin

    cls = {p.__name__: p for p in (TreePlugin, DurablePlugin, InlinePlugin, ReleasePlugin)}[plugin]
    setting = {
        "TreePlugin": "coro.tree.enabled",
        "DurablePlugin": "coro.durability.hold-children",
        "InlinePlugin": "coro.inline.enabled",
        "ReleasePlugin": "coro.worker-release.enabled",
    }[plugin]

    async def refuse(self, scheduler):
        raise RuntimeError("this scheduler cannot run it")

    @gen_cluster(client=True, nthreads=[("", 1)], config=config)
    async def run(c, s, a):
        with monkeypatch.context() as m:
            m.setattr(cls, "start", refuse)
            with pytest.raises(DaskCoroError) as info:
                await c.compute(two_children(1))
        text = str(info.value)
        assert f"cannot install its scheduler plugin {cls.name!r} from worker {a.address}" in text
        assert "RuntimeError('this scheduler cannot run it')" in text
        assert f"set {setting}: false" in text
        assert cls.name not in s.plugins
        # Tried again by the next computation, which it lets run now.
        assert await c.compute(two_children(1)) == 5
        assert cls.name in s.plugins

    run()


@pytest.mark.parametrize("asked_again", [False, True])
def test_a_task_released_while_its_worker_installs_the_plugins(asked_again, monkeypatch):
    # The first coroutine on a worker waits for the installs; its key may be
    # cancelled meanwhile (and perhaps asked for again) before its body runs.
    import asyncio

    from distributed.utils_test import async_poll_for

    from dask_coro.diagnostics.scheduler import TreePlugin

    @gen_cluster(client=True, nthreads=[("", 1)])
    async def run(c, s, a):
        started, gate = asyncio.Event(), asyncio.Event()
        original = TreePlugin.start

        async def slow(self, scheduler):
            started.set()
            await gate.wait()
            await original(self, scheduler)

        monkeypatch.setattr(TreePlugin, "start", slow)
        call = two_children(1)
        fut = c.compute(call)
        key = fut.key
        await started.wait()
        assert a.state.tasks[key].state == "executing"
        await fut.cancel()
        del fut
        await async_poll_for(lambda: key not in s.tasks, timeout=10)
        assert a.state.tasks[key].state == "cancelled"
        again = c.compute(call) if asked_again else None
        if asked_again:
            await async_poll_for(lambda: a.state.tasks[key].state == "executing", timeout=10)
        gate.set()
        if asked_again:
            assert await again == 5
            del again
        await async_poll_for(lambda: not s.tasks and not a.state.tasks, timeout=10)
        assert await c.compute(two_children(2)) == 7

    run()


def test_a_setting_of_another_schema_kind_is_checked_by_its_json_type(monkeypatch):
    # A setting added later with a plain schema entry is held to its types
    # and minimum, not refused by the check (every coroutine task runs it).
    monkeypatch.setitem(_config.SETTINGS, "coro.extra.ratio", {"type": ["number", "null"], "minimum": 0})
    monkeypatch.setitem(_config.SETTINGS, "coro.extra.label", {"type": "string"})
    for key, value in [("coro.extra.ratio", 0.5), ("coro.extra.ratio", None), ("coro.extra.label", "x")]:
        _config.check_value(key, value)
    for key, value, message in [
        ("coro.extra.ratio", -1, "coro.extra.ratio: -1 is not a number or null of 0 or more"),
        ("coro.extra.ratio", True, "coro.extra.ratio: True is not a number or null of 0 or more"),
        ("coro.extra.label", 3, "coro.extra.label: 3 is not a string"),
    ]:
        with pytest.raises(ValueError) as info:
            _config.check_value(key, value)
        assert str(info.value) == message


def test_a_bad_setting_in_a_worker_process_fails_the_computation():
    # A worker process of its own, whose configuration says 'false' (as an
    # environment variable DASK_CORO__TREE__ENABLED=false would: lowercase
    # false is no Python literal, so dask reads the string). A Nanny hands its
    # worker the configuration in effect when the Nanny is made.
    from distributed import LocalCluster

    with dask.config.set({"coro.tree.enabled": "false"}):
        lc = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0")
    with lc, Client(lc) as c:
        with pytest.raises(ValueError) as info:
            c.compute(two_children(1)).result()
        assert str(info.value) == (
            "coro.tree.enabled: 'false' is not true or false (in an environment "
            "variable, write True or False)"
        )
        assert c.submit(sum, [1, 2]).result() == 3  # plain tasks run on


@pytest.mark.parametrize(
    "value, expected",
    [("64MiB", 64 * 2**20), (0, 0), (1000, 1000), (0.05, 0.05), (1.0, 1.0), (None, None)],
)
def test_hold_bytes_is_a_size_a_fraction_or_null(value, expected):
    with dask.config.set({"coro.durability.hold-bytes": value}):
        assert _config.get_size_or_fraction("coro.durability.hold-bytes") == expected


@pytest.mark.parametrize("value", [True, -1, 1.5, 0.0, "lots", "-5MB", [1], float("nan")])
def test_hold_bytes_bad_value_names_the_key(value):
    message = r"^coro\.durability\.hold-bytes: .* is not a size in bytes .*, a fraction of a worker's memory"
    with dask.config.set({"coro.durability.hold-bytes": value}):
        with pytest.raises(ValueError, match=message):
            _config.get_size_or_fraction("coro.durability.hold-bytes")
        with pytest.raises(ValueError, match=message):
            _config.check()  # held to the schema where a computation starts
    _config.check()
