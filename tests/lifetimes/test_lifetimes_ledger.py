"""The lifetimes ledger, without a cluster: events in, releases out."""

from __future__ import annotations

import random

import pytest

from dask_coro.lifetimes.ledger import Ledger, Origin

A = Origin("10.0.0.1", "tcp://10.0.0.1:1")
A2 = Origin("10.0.0.1", "tcp://10.0.0.1:2")
B = Origin("10.0.0.2", "tcp://10.0.0.2:1")
WORKERS = {A.worker: A.host, A2.worker: A2.host, B.worker: B.host}


def test_release_owed_when_last_key_forgotten():
    led = Ledger()
    led.tie("r", "k1", A)
    led.tie("r", "k2", A)
    assert led.holders("r") == {"k1", "k2"}
    led.forget("k1")
    assert not led.owed
    assert led.assign(WORKERS) == {}
    led.forget("k2")
    assert led.owed == {"r"}
    assert led.assign(WORKERS) == {A.worker: ["r"]}
    assert led.sent == {"r": A.worker}
    led.acknowledged(A.worker, ["r"])
    assert not led
    assert led.assign(WORKERS) == {}


def test_tying_twice_from_one_key_counts_once():
    led = Ledger()
    led.tie("r", "k", A)
    led.tie("r", "k", A)
    led.forget("k")
    assert led.owed == {"r"}


def test_forgetting_an_unknown_key_is_a_no_op():
    led = Ledger()
    led.tie("r", "k", A)
    led.forget("other")
    assert led.holders("r") == {"k"} and not led.owed
    assert not led.ties("other") and led.ties("k")


def test_one_key_ties_many_ids():
    led = Ledger()
    led.tie("r1", "k", A)
    led.tie("r2", "k", B)
    assert led.ids_of("k") == {"r1", "r2"}
    led.forget("k")
    assert led.assign(WORKERS) == {A.worker: ["r1"], B.worker: ["r2"]}


def test_untie_hands_an_id_over_or_lets_it_go():
    led = Ledger()
    led.tie("r", "producer", A)
    led.tie("r", "item", A)
    led.untie("r", "producer")  # handed over: the item holds it
    assert led.holders("r") == {"item"} and not led.ties("producer") and not led.owed
    led.untie("r", "other")  # a key that does not tie it: a no-op
    assert led.holders("r") == {"item"} and not led.owed
    led.untie("r", "item")  # let go of by its last key
    assert led.owed == {"r"} and not led.ties("item")
    assert led.assign(WORKERS) == {A.worker: ["r"]}


def test_tie_to_dead_key_is_owed_at_once():
    led = Ledger()
    led.tie("r", "gone", A, key_alive=False)
    assert led.owed == {"r"}
    assert led.holders("r") == frozenset()


def test_tie_to_dead_key_while_others_hold_it_releases_nothing():
    led = Ledger()
    led.tie("r", "k", A)
    led.tie("r", "gone", A, key_alive=False)
    assert not led.owed
    led.forget("k")
    assert led.owed == {"r"}


def test_release_goes_to_the_worker_that_tied_first():
    led = Ledger()
    led.tie("r", "k1", A2)
    led.tie("r", "k2", A)  # a later tie does not move the resource
    led.forget("k1")
    led.forget("k2")
    assert led.assign(WORKERS) == {A2.worker: ["r"]}


def test_release_goes_to_another_worker_on_the_host_when_origin_is_gone():
    led = Ledger()
    led.tie("r", "k", A)
    led.forget("k")
    alive = {A2.worker: A2.host, B.worker: B.host}
    assert led.assign(alive) == {A2.worker: ["r"]}


def test_release_waits_for_a_worker_on_its_host():
    led = Ledger()
    led.tie("r", "k", A)
    led.forget("k")
    only_b = {B.worker: B.host}
    assert led.assign(only_b) == {}  # never on another host
    assert led.owed == {"r"}
    assert led.waiting_hosts(only_b) == {A.host}
    joined = {**only_b, "tcp://10.0.0.1:9": A.host}
    assert led.assign(joined) == {"tcp://10.0.0.1:9": ["r"]}
    assert led.waiting_hosts(joined) == set()


def test_worker_leaving_mid_release_owes_it_again():
    led = Ledger()
    led.tie("r", "k", A)
    led.forget("k")
    assert led.assign(WORKERS) == {A.worker: ["r"]}
    led.worker_left(A.worker)
    assert led.owed == {"r"} and not led.sent
    rest = {A2.worker: A2.host}
    assert led.assign(rest) == {A2.worker: ["r"]}
    # The late answer of the dead worker changes nothing
    led.acknowledged(A.worker, ["r"])
    led.failed(A.worker, ["r"])
    assert led.sent == {"r": A2.worker}
    led.acknowledged(A2.worker, ["r"])
    assert not led


def test_failed_call_owes_again():
    led = Ledger()
    led.tie("r", "k", A)
    led.forget("k")
    led.assign(WORKERS)
    led.failed(A.worker, ["r"])
    assert led.owed == {"r"}
    assert led.assign(WORKERS) == {A.worker: ["r"]}


def test_tied_again_before_handed_out_cancels_the_release():
    led = Ledger()
    led.tie("r", "k1", A)
    led.forget("k1")
    led.tie("r", "k2", A)
    assert not led.owed
    assert led.assign(WORKERS) == {}
    led.forget("k2")
    assert led.owed == {"r"}


def test_tied_again_while_being_released_keeps_holders():
    led = Ledger()
    led.tie("r", "k1", A)
    led.forget("k1")
    led.assign(WORKERS)
    led.tie("r", "k2", A)  # ids must not be reused; if they are, no leak
    led.acknowledged(A.worker, ["r"])
    assert led.holders("r") == {"k2"}
    led.forget("k2")
    assert led.assign(WORKERS) == {A.worker: ["r"]}


def test_tie_to_dead_key_while_being_released_adds_nothing():
    led = Ledger()
    led.tie("r", "k", A)
    led.forget("k")
    led.assign(WORKERS)
    led.tie("r", "gone", A, key_alive=False)
    assert not led.owed
    led.acknowledged(A.worker, ["r"])
    assert not led


def test_forget_all():
    led = Ledger()
    for i in range(5):
        led.tie(f"r{i}", f"k{i}", A)
    led.tie("r0", "k-extra", A)
    led.forget_all()
    assert led.owed == {f"r{i}" for i in range(5)}
    assert led.ids_of("k0") == frozenset()


def test_assign_batches_per_worker_and_is_deterministic():
    led = Ledger()
    for i in range(10):
        led.tie(f"r{i}", f"k{i}", A if i % 2 else B)
        led.forget(f"k{i}")
    out = led.assign(WORKERS)
    assert out == {
        A.worker: [f"r{i}" for i in range(1, 10, 2)],
        B.worker: [f"r{i}" for i in range(0, 10, 2)],
    }


def _indexes_match(led):
    """The ledger's indexes (worker -> ids sent, host -> ids) are its maps
    read the other way: a worker or host leaving costs O(its own ids)."""
    sent_to: dict = {}
    for rid, to in led._sent.items():
        sent_to.setdefault(to, set()).add(rid)
    on_host: dict = {}
    for rid, origin in led._origin.items():
        on_host.setdefault(origin.host, set()).add(rid)
    assert led._sent_to == sent_to and led._on_host == on_host


@pytest.mark.parametrize("seed", range(20))
def test_random_histories_release_each_id_once_and_never_while_held(seed):
    """Random ties, forgets, worker deaths and answers: a release is handed out
    only when no key holds its id, and every id ends up released."""
    rng = random.Random(seed)
    led = Ledger()
    origins = [A, A2, B]
    keys = [f"k{i}" for i in range(8)]
    alive_keys = set(keys)
    alive_workers = dict(WORKERS)
    ids = [f"r{i}" for i in range(6)]
    released: list[str] = []
    ever_tied: set[str] = set()
    late: list = []
    handed: set[str] = set()  # an id whose release went out is not tied again (see tie)
    for _ in range(300):
        op = rng.random()
        if op < 0.35 and alive_keys and set(ids) - handed:
            rid = rng.choice(sorted(set(ids) - handed))
            led.tie(rid, rng.choice(sorted(alive_keys)), rng.choice(origins))
            ever_tied.add(rid)
        elif op < 0.5:
            key = rng.choice(keys)
            alive_keys.discard(key)
            led.forget(key)
        elif op < 0.6 and len(alive_workers) > 1:
            w = rng.choice(sorted(alive_workers))
            del alive_workers[w]
            led.worker_left(w)
        elif op < 0.65:
            alive_workers.update(WORKERS)
        else:
            for worker, rids in led.assign(alive_workers).items():
                for rid in rids:
                    assert not led.holders(rid), (rid, led.holders(rid))
                handed.update(rids)
                if rng.random() < 0.3:
                    late.append((worker, rids))  # answered later, if ever
                elif rng.random() < 0.2:
                    led.failed(worker, rids)
                else:
                    released.extend(rids)
                    led.acknowledged(worker, rids)
            if late and rng.random() < 0.5:
                worker, rids = late.pop(0)
                led.acknowledged(worker, rids)
                released.extend(rids)
        _indexes_match(led)
    for key in keys:
        led.forget(key)
    alive_workers.update(WORKERS)
    for _ in range(3):
        for worker, rids in led.assign(alive_workers).items():
            released.extend(rids)
            led.acknowledged(worker, rids)
    assert not led, led
    assert ever_tied and ever_tied <= set(released)


def test_exactly_once_without_failures():
    led = Ledger()
    for i in range(100):
        led.tie(f"r{i % 10}", f"k{i}", A)
    released: list[str] = []
    for i in range(100):
        led.forget(f"k{i}")
        for worker, rids in led.assign(WORKERS).items():
            released.extend(rids)
            led.acknowledged(worker, rids)
    assert sorted(released) == sorted(f"r{i}" for i in range(10))


def test_host_emptied_takes_owed_sent_and_host_bound_held():
    led = Ledger()
    bound = Origin(A.host, A.worker, host_bound=True)
    led.tie("sent", "k2", A2)
    led.forget("k2")
    assert led.assign({A2.worker: A2.host}) == {A2.worker: ["sent"]}
    led.tie("owed", "k1", A)
    led.forget("k1")
    led.tie("held-bound", "k3", bound)
    led.tie("held-bound", "k4", bound)
    led.tie("held-free", "k3", A)  # not host-bound: someone may still reach it
    led.tie("elsewhere", "k5", Origin(B.host, B.worker, host_bound=True))
    assert led.host_emptied(A.host) == ["held-bound", "owed", "sent"]
    assert led.holders("held-bound") == frozenset()
    assert led.ids_of("k3") == {"held-free"} and led.ids_of("k4") == frozenset()
    assert led.holders("elsewhere") == {"k5"}
    assert not led.owed and not led.sent
    # A late answer for "sent" changes nothing; the rest still works
    led.acknowledged(A2.worker, ["sent"])
    led.forget("k3")
    assert led.owed == {"held-free"}
    assert led.host_emptied(A.host) == ["held-free"]
    assert led.host_emptied(A.host) == []
    _indexes_match(led)
    led.forget("k5")
    assert led.assign(WORKERS) == {B.worker: ["elsewhere"]}
    _indexes_match(led)
    assert set(led._on_host) == {B.host} and set(led._sent_to) == {B.worker}


def test_shared_memory_goes_when_its_data_does_other_resources_when_forgotten():
    shared = Origin("10.0.0.1", "tcp://10.0.0.1:1", host_bound=True)
    led = Ledger()
    led.tie("seg", "k", shared)
    led.tie("seg", "other", shared)
    led.tie("file", "k", A)
    led.data_gone("k")  # k released or erred: no worker holds its result
    assert not led.owed  # "other" still holds the segment
    assert led.holders("seg") == {"other"} and led.holders("file") == {"k"}
    led.data_gone("other")
    assert led.owed == {"seg"}
    led.data_gone("k")  # again: nothing more
    assert led.owed == {"seg"}
    led.forget("k")
    assert led.owed == {"seg", "file"}
    led.data_gone("unknown")


def test_an_orphans_failed_release_goes_to_another_worker_of_its_host():
    """Its own worker gone, a release whose call to one worker of the host
    failed (or hung) is handed to another one next, not to the same again:
    the first worker sorted may be one that has just joined and does not
    answer yet, and the others were never asked."""
    led = Ledger()
    led.tie("r", "k", A)
    led.forget("k")
    led.worker_left(A.worker)
    others = {w: h for w, h in WORKERS.items() if w != A.worker}
    others["tcp://10.0.0.1:3"] = A.host  # two live workers on A's host
    first = led.assign(others)
    ((to, ids),) = first.items()
    led.failed(to, ids)
    ((again, _),) = led.assign(others).items()
    assert again != to
