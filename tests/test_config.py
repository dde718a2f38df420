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
    "coro.inline.enabled": True,
    "coro.inline.stealing": "push",
    "coro.inline.interval": "20ms",
    "coro.inline.switch-interval": "1ms",
    "coro.durability.hold-children": True,
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


@pytest.mark.inline  # the shipped default, which other tests turn off
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
