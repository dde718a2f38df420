"""Groups (dask_coro.group) against plain Dask (worker_client + as_completed /
wait) and Ray (ray.wait + ray.cancel, where Ray is installed) on four dynamic
programs: a crawl of unknown shape with 8 fetches in flight, a race of two
strategies under a deadline, branch-and-bound knapsack (every call a task),
successive halving, and the knapsack as docs/groups.md writes it (``tiny``:
30 items, each expansion microseconds of work, a plain ``def`` and an
``async def`` variant). Time to answer, tasks run, peak threads of the
worker processes.

Run: python benchmarks/bench_groups.py [--only crawl,race,knapsack,halving,tiny] [--no-ray]
                                       [--race-runs 20] [--repeat 3]

A LocalCluster of 2 worker processes x 2 threads for the dask_coro programs,
and a fresh one for the plain Dask programs (Ray: num_cpus=4). The crawl and
the knapsack show the median of ``--repeat`` runs after a warm-up run.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import _bench as B
import dask
from _bench import worker_sampler
from distributed import Client, LocalCluster, SchedulerPlugin, as_completed, wait, worker_client

import dask_coro
from dask_coro import coroutine

# -- the crawl ---------------------------------------------------------------------


def digest(url: str) -> int:
    return int(hashlib.blake2b(url.encode(), digest_size=4).hexdigest(), 16)


def links_of(url: str) -> list[str]:
    depth = url.count("/")
    n = 0 if depth >= 4 else digest(url + "#") % 6  # 0-5 links, 4 levels
    return [f"{url}/{i}" for i in range(n)]


def fetch_time(url: str) -> float:
    return 0.01 + digest(url) % 41 / 1000  # 10-50 ms


def site(root: str) -> list[str]:
    out, todo = [], [root]
    while todo:
        u = todo.pop()
        out.append(u)
        todo += links_of(u)
    return out


@coroutine
async def fetch(url: str) -> list[str]:
    """A fetch as a dask_coro user writes it: I/O awaited, no thread held."""
    await asyncio.sleep(fetch_time(url))
    return links_of(url)


def fetch_sync(url: str) -> list[str]:
    """The same fetch as a plain task (a thread sleeps)."""
    time.sleep(fetch_time(url))
    return links_of(url)


def schedule_floor(root: str, limit: int = 8) -> float:
    """The crawl's time with no overhead at all: ``limit`` fetches in flight,
    each started the instant a slot frees (oldest link first), each taking
    exactly its ``fetch_time``. Above the ideal (sum / limit) where the
    tree's frontier is narrower than ``limit``: no system can beat it."""
    t, queue, running = 0.0, [root], []
    while queue or running:
        while queue and len(running) < limit:
            u = queue.pop(0)
            heapq.heappush(running, (t + fetch_time(u), u))
        t, u = heapq.heappop(running)
        queue += links_of(u)
    return t


@coroutine
def crawl_group(root: str) -> int:
    n = 0
    with dask_coro.group(limit=8) as g:
        g.spawn(fetch(root))
        for _, links in g:
            n += 1
            for link in links:
                g.spawn(fetch(link))
    return n


def crawl_plain(root: str) -> int:
    """worker_client + as_completed(...).add(), at most 8 in flight."""
    n = 0
    with worker_client() as client:
        queue = [root]
        ac = as_completed()
        inflight = 0
        while queue and inflight < 8:
            ac.add(client.submit(fetch_sync, queue.pop(0), pure=False))
            inflight += 1
        for fut in ac:
            inflight -= 1
            n += 1
            queue += fut.result()
            while queue and inflight < 8:
                ac.add(client.submit(fetch_sync, queue.pop(0), pure=False))
                inflight += 1
    return n


# -- the race --------------------------------------------------------------------------


@coroutine
def work(seconds: float) -> int:
    time.sleep(seconds)
    return 1


@coroutine
def strategy(depth: int, seconds: float) -> int:
    """A tree of 2**depth tasks of ``seconds`` each, level by level."""
    if depth == 0:
        return (yield work(seconds))
    return sum((yield [strategy(depth - 1, seconds), strategy(depth - 1, seconds)]))


@coroutine
def race_group(deadline_s: float):
    t0 = time.time()
    with dask_coro.group(timeout=deadline_s) as g:
        g.spawn(strategy(3, 0.8))  # 4 levels: > 3 s on 4 threads
        g.spawn(strategy(4, 0.5))
        try:
            _, value = yield g.next()
            return "won", value, time.time() - t0
        except TimeoutError:
            return "deadline", None, time.time() - t0


def strategy_plain(depth: int, seconds: float) -> int:
    if depth == 0:
        time.sleep(seconds)
        return 1
    with worker_client() as client:
        futs = client.map(strategy_plain, [depth - 1] * 2, [seconds] * 2, pure=False)
        return sum(client.gather(futs))


def race_plain(deadline_s: float):
    t0 = time.time()
    with worker_client() as client:
        futs = [client.submit(strategy_plain, 3, 0.8, pure=False), client.submit(strategy_plain, 4, 0.5, pure=False)]
        try:
            done, _ = wait(futs, timeout=deadline_s, return_when="FIRST_COMPLETED")
            answer = "won", next(iter(done)).result(), time.time() - t0
        except TimeoutError:
            answer = "deadline", None, time.time() - t0
        client.cancel(futs)
    return answer


# -- knapsack ----------------------------------------------------------------------------

RNG = random.Random(3)
ITEMS = sorted(((RNG.randint(10, 60), RNG.randint(5, 30)) for _ in range(24)), key=lambda vw: -vw[0] / vw[1])
CAPACITY = 150


def bound(level: int, value: int, room: int) -> float:
    for v, w in ITEMS[level:]:
        if w > room:
            return value + v * room / w
        value, room = value + v, room - w
    return value


def expand_plain(level: int, value: int, room: int) -> list:
    v, w = ITEMS[level]
    take = [(level + 1, value + v, room - w)] if w <= room else []
    return [*take, (level + 1, value, room)]


expand = coroutine(inline=False)(expand_plain)


def _push(heap: list, node: tuple) -> None:
    heapq.heappush(heap, (-bound(*node), node))


def _pop_promising(heap: list, best: int) -> tuple | None:
    """The open node of highest bound that can still beat ``best`` (bounds
    checked against the best found so far, when the node is taken)."""
    while heap:
        neg, node = heapq.heappop(heap)
        if -neg > best:
            return node
    return None


@coroutine
def knapsack_group():
    """Best-first: the best value updated as each node finishes, 8 in flight."""
    best, expanded, heap = 0, 0, []
    with dask_coro.group() as g:
        g.spawn(expand(0, 0, CAPACITY))
        while g:
            _, nodes = yield g.next()
            expanded += 1
            for level, value, room in nodes:
                best = max(best, value)
                if level < len(ITEMS):
                    _push(heap, (level, value, room))
            while len(g) < 8 and (node := _pop_promising(heap, best)) is not None:
                g.spawn(expand(*node))
    return best, expanded


@coroutine
def knapsack_waves():
    """What the docs allowed before groups: waves of 8 best-first nodes, the
    best value updated between waves."""
    best, expanded, heap = 0, 0, [(-bound(0, 0, CAPACITY), (0, 0, CAPACITY))]
    while True:
        wave = []
        while len(wave) < 8 and (node := _pop_promising(heap, best)) is not None:
            wave.append(node)
        if not wave:
            break
        results = yield [expand(*n) for n in wave]
        expanded += len(wave)
        for nodes in results:
            for level, value, room in nodes:
                best = max(best, value)
                if level < len(ITEMS):
                    _push(heap, (level, value, room))
    return best, expanded


def knapsack_plain():
    best, expanded, heap = 0, 0, []
    with worker_client() as client:
        ac = as_completed([client.submit(expand_plain, 0, 0, CAPACITY, pure=False)])
        inflight = 1
        for fut in ac:
            inflight -= 1
            expanded += 1
            for level, value, room in fut.result():
                best = max(best, value)
                if level < len(ITEMS):
                    _push(heap, (level, value, room))
            while inflight < 8 and (node := _pop_promising(heap, best)) is not None:
                ac.add(client.submit(expand_plain, *node, pure=False))
                inflight += 1
    return best, expanded


def knapsack_exact() -> int:
    table = [0] * (CAPACITY + 1)
    for v, w in ITEMS:
        for room in range(CAPACITY, w - 1, -1):
            table[room] = max(table[room], table[room - w] + v)
    return table[CAPACITY]


# -- the knapsack as docs/groups.md writes it: tiny children ---------------------------

TINY_RNG = random.Random(1)
TINY_ITEMS = sorted(((TINY_RNG.randint(10, 60), TINY_RNG.randint(5, 30)) for _ in range(30)), key=lambda vw: -vw[0] / vw[1])
TINY_CAPACITY = 158  # about 1,350 expansions


def tiny_bound(level: int, value: int, room: int) -> float:
    for v, w in TINY_ITEMS[level:]:
        if w > room:
            return value + v * room / w
        value, room = value + v, room - w
    return value


def tiny_expand_plain(level: int, value: int, room: int) -> list:
    v, w = TINY_ITEMS[level]
    take = [(level + 1, value + v, room - w)] if w <= room else []
    return [*take, (level + 1, value, room)]


tiny_expand = coroutine(tiny_expand_plain)  # a plain def made a coroutine, as the docs write it


@coroutine
async def tiny_expand_async(level: int, value: int, room: int) -> list:
    return tiny_expand_plain(level, value, room)


@coroutine
def knapsack_tiny(kind: str):
    """docs/groups.md's branch-and-bound: every promising child spawned,
    8 in flight, the best value updated on every completion."""
    expand = tiny_expand if kind == "plain" else tiny_expand_async
    best, expanded = 0, 0
    with dask_coro.group(limit=8) as g:
        g.spawn(expand(0, 0, TINY_CAPACITY))
        while g:
            _, nodes = yield g.next()
            expanded += 1
            for level, value, room in nodes:
                best = max(best, value)
                if level < len(TINY_ITEMS) and tiny_bound(level, value, room) > best:
                    g.spawn(expand(level, value, room))
    return best, expanded


def knapsack_tiny_plain():
    """The same with worker_client + as_completed, 8 in flight, the rest queued."""
    best, expanded = 0, 0
    with worker_client() as client:
        queue: list = []
        ac = as_completed([client.submit(tiny_expand_plain, 0, 0, TINY_CAPACITY, pure=False)])
        inflight = 1
        for fut in ac:
            inflight -= 1
            expanded += 1
            for level, value, room in fut.result():
                best = max(best, value)
                if level < len(TINY_ITEMS) and tiny_bound(level, value, room) > best:
                    queue.append((level, value, room))
            while queue and inflight < 8:
                ac.add(client.submit(tiny_expand_plain, *queue.pop(0), pure=False))
                inflight += 1
    return best, expanded


def tiny_exact() -> int:
    table = [0] * (TINY_CAPACITY + 1)
    for v, w in TINY_ITEMS:
        for room in range(TINY_CAPACITY, w - 1, -1):
            table[room] = max(table[room], table[room - w] + v)
    return table[TINY_CAPACITY]


# -- successive halving ------------------------------------------------------------------


def score_plain(config: int, budget: int) -> float:
    time.sleep(0.002 * budget)
    noise = ((config * 7919 + budget * 104729) % 13 - 6) / budget
    return -((config - 21) ** 2) + noise


score = coroutine(inline=False)(score_plain)


@coroutine
def halving_group(configs: list, budget: int):
    while len(configs) > 1:
        with dask_coro.group(limit=8) as g:
            for c in configs:
                g.spawn(score(c, budget))
            scores = yield g.all()
        ranked = sorted(zip(scores, configs), reverse=True)
        configs = [c for _, c in ranked[: len(configs) // 2]]
        budget *= 2
    return configs[0]


def halving_plain(configs: list, budget: int):
    with worker_client() as client:
        while len(configs) > 1:
            scores = client.gather(client.map(score_plain, configs, [budget] * len(configs), pure=False))
            ranked = sorted(zip(scores, configs), reverse=True)
            configs = [c for _, c in ranked[: len(configs) // 2]]
            budget *= 2
    return configs[0]


# -- harness -------------------------------------------------------------------------------


def _tasks_done(dask_scheduler):
    return dask_scheduler.plugins["bench-groups-count"].done


class _Count(SchedulerPlugin):
    name = "bench-groups-count"

    def __init__(self):
        self.done = 0

    def transition(self, key, start, finish, *args, **kwargs):
        if finish == "memory":
            self.done += 1


def measure(client: Client, fn) -> tuple[float, object, int, int]:
    """(seconds, value, tasks that finished, peak OS threads of the busiest worker)."""
    before = client.run_on_scheduler(_tasks_done)
    with worker_sampler(client) as sampler:
        t = time.perf_counter()
        value = fn()
        elapsed = time.perf_counter() - t
    return elapsed, value, client.run_on_scheduler(_tasks_done) - before, sampler.peak["threads_max"]


def _keys_left(dask_scheduler, prefixes):
    return sum(1 for k in dask_scheduler.tasks if str(k).split("-")[0] in prefixes)


def gone_within(client: Client, prefixes: tuple, limit: float = 10.0) -> float:
    t = time.perf_counter()
    while client.run_on_scheduler(_keys_left, prefixes=prefixes):
        if time.perf_counter() - t > limit:
            return float("inf")
        time.sleep(0.01)
    return time.perf_counter() - t


def _median(runs: list[tuple]) -> tuple[tuple, str]:
    """The median run (by time) and the range of the times."""
    return sorted(runs)[len(runs) // 2], f"{min(r[0] for r in runs):.2f}-{max(r[0] for r in runs):.2f}"


def _race(client: Client, run, prefixes: tuple, n: int) -> tuple[list, list]:
    answers, gone = [], []
    for _ in range(n):
        _, _, elapsed = run()
        answers.append(elapsed)
        gone.append(gone_within(client, prefixes))
    return answers, gone


def _cluster():
    return LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0")


def coro_side(only: set, args, pages: list) -> dict:
    """The dask_coro programs, on a cluster of their own."""
    out: dict = {}
    with dask.config.set({"coro.inline.enabled": True}), _cluster() as lc, Client(lc) as client:
        client.register_plugin(_Count())
        client.submit(lambda: 0).result()
        if "crawl" in only:
            # Warm (the workers' clients, lanes and plugins are made on first use).
            client.compute(crawl_group("warm")).result()
            out["crawl"] = [measure(client, lambda: client.compute(crawl_group("site")).result()) for _ in range(args.repeat)]
            assert all(r[1] == len(pages) for r in out["crawl"])
        if "race" in only:
            out["race"] = _race(client, lambda: client.compute(race_group(1.0)).result(), ("strategy", "work"), args.race_runs)
        if "knapsack" in only:
            with dask.config.set({"coro.inline.enabled": False}):
                client.compute(knapsack_group()).result()
                out["knapsack"] = [measure(client, lambda: client.compute(knapsack_group()).result()) for _ in range(args.repeat)]
                out["waves"] = [measure(client, lambda: client.compute(knapsack_waves()).result()) for _ in range(args.repeat)]
        if "halving" in only:
            out["halving"] = measure(client, lambda: client.compute(halving_group(list(range(64)), 4)).result())
        if "tiny" in only:
            # The two variants' runs alternate: a busy machine's slow spell
            # falls on both.
            for kind in ("plain", "async"):
                client.compute(knapsack_tiny(kind)).result()
                out[f"tiny-{kind}"] = []
            for _ in range(args.repeat):
                for kind in ("plain", "async"):
                    out[f"tiny-{kind}"].append(measure(client, lambda k=kind: client.compute(knapsack_tiny(k)).result()))
    return out


def plain_side(only: set, args, pages: list) -> dict:
    """The plain Dask programs, on a fresh cluster: no coroutine has run on
    its workers (dask_coro sets the worker's own client to batch over 2 ms,
    ``coro.client-batch-interval``, which a worker_client task run after one
    would share; a user's plain program has distributed's 10 ms)."""
    out: dict = {}
    with _cluster() as lc, Client(lc) as client:
        client.register_plugin(_Count())
        client.submit(lambda: 0).result()
        if "crawl" in only:
            client.submit(crawl_plain, "warm", pure=False).result()
            out["crawl"] = [measure(client, lambda: client.submit(crawl_plain, "site", pure=False).result()) for _ in range(args.repeat)]
            assert all(r[1] == len(pages) for r in out["crawl"])
        if "race" in only:
            out["race"] = _race(client, lambda: client.submit(race_plain, 1.0, pure=False).result(), ("strategy_plain",), args.race_runs)
        if "knapsack" in only:
            client.submit(knapsack_plain, pure=False).result()
            out["knapsack"] = [measure(client, lambda: client.submit(knapsack_plain, pure=False).result()) for _ in range(args.repeat)]
        if "halving" in only:
            out["halving"] = measure(client, lambda: client.submit(halving_plain, list(range(64)), 4, pure=False).result())
        if "tiny" in only:
            client.submit(knapsack_tiny_plain, pure=False).result()
            out["tiny"] = [measure(client, lambda: client.submit(knapsack_tiny_plain, pure=False).result()) for _ in range(args.repeat)]
    return out


SCENARIOS = [  # its section of RESULTS.md, run by run_all.py
    B.Scenario("groups", "Groups: a crawl, a race, branch-and-bound and successive halving against "
               "plain Dask and Ray, run by run_all.py", ["--repeat", "1", "--race-runs", "5"], 420,
               json=False, quick=["--no-ray"]),
]


def main(argv: list[str] | None = None) -> None:
    p = B.parser(__doc__, repeat=None, json=False)
    p.add_argument("--only", default="crawl,race,knapsack,halving,tiny")
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--race-runs", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3, help="runs of the crawl and the knapsack (the median is shown)")
    args = B.parse(p, argv, {"repeat": 1, "race_runs": 1, "only": "race,halving"})
    only = set(args.only.split(","))
    rows: list[str] = []
    pages = site("site")
    ideal = sum(fetch_time(u) for u in pages) / 8
    co = coro_side(only, args, pages)
    pl = plain_side(only, args, pages)
    n = args.repeat
    if "crawl" in only:
        (t, _, tasks, threads), spread = _median(co["crawl"])
        (t2, _, tasks2, threads2), spread2 = _median(pl["crawl"])
        floor = schedule_floor("site")
        rows.append(f"| crawl ({len(pages)} pages, 8 in flight) | group | {t:.2f} s ({t / ideal:.2f} x ideal {ideal:.2f} s; group/plain {t / t2:.2f}; {n} runs {spread}) | {tasks} | {threads} |")
        rows.append(f"| | no overhead at all (the tree's schedule, 8 in flight) | {floor:.2f} s ({floor / ideal:.2f} x ideal; {floor / t2:.2f} x plain) | | |")
        rows.append(f"| | plain Dask (worker_client + as_completed.add) | {t2:.2f} s ({t2 / ideal:.2f} x ideal; {n} runs {spread2}) | {tasks2} | {threads2} |")
    if "race" in only:
        for name, (answers, gone) in (("group", co["race"]), ("plain Dask (wait FIRST_COMPLETED, timeout; cancel)", pl["race"])):
            within = sum(a <= 1.2 for a in answers)
            cleared = sum(g <= 1.0 for g in gone)
            rows.append(
                f"| race (deadline 1 s, {args.race_runs} runs) | {name} | answer at {min(answers):.2f}-{max(answers):.2f} s, "
                f"{within}/{len(answers)} by deadline + 0.2 s | trees gone within 1 s: {cleared}/{len(gone)} "
                f"(slowest {max(gone):.2f} s) | |"
            )
    if "knapsack" in only:
        exact = knapsack_exact()
        (t, (best, expanded), tasks, threads), spread = _median(co["knapsack"])
        (tw, (bestw, expandedw), tasksw, threadsw), spreadw = _median(co["waves"])
        (tp, (bestp, expandedp), tasksp, threadsp), spreadp = _median(pl["knapsack"])
        assert best == bestw == bestp == exact, (best, bestw, bestp, exact)
        rows.append(f"| knapsack (24 items, best-first, every call a task, 8 in flight) | group | {t:.2f} s (group/plain {t / tp:.2f}; {n} runs {spread}), {expanded} nodes | {tasks} | {threads} |")
        rows.append(f"| | waves of 8 (dask_coro without groups) | {tw:.2f} s ({n} runs {spreadw}), {expandedw} nodes | {tasksw} | {threadsw} |")
        rows.append(f"| | plain Dask (worker_client + as_completed.add) | {tp:.2f} s ({n} runs {spreadp}), {expandedp} nodes | {tasksp} | {threadsp} |")
    if "halving" in only:
        t, best, tasks, threads = co["halving"]
        tp, bestp, tasksp, threadsp = pl["halving"]
        assert best == bestp == 21, (best, bestp)
        rows.append(f"| successive halving (64 configs) | group | {t:.2f} s | {tasks} | {threads} |")
        rows.append(f"| | plain Dask (worker_client + gather) | {tp:.2f} s | {tasksp} | {threadsp} |")
    if "tiny" in only:
        exact = tiny_exact()
        (tp, (bestp, expandedp), tasksp, threadsp), spreadp = _median(pl["tiny"])
        ta = _median(co["tiny-async"])[0][0]
        for kind, label in (("plain", "group, `def expand`"), ("async", "group, `async def expand`")):
            (t, (best, expanded), tasks, threads), spread = _median(co[f"tiny-{kind}"])
            assert best == exact, (kind, best, exact)
            rows.append(
                f"| knapsack as docs/groups.md writes it (30 items, limit=8) | {label} | {t:.2f} s (group/plain {t / tp:.2f}; "
                f"/ async def {t / ta:.2f}; {n} runs {spread}), {expanded} nodes | {tasks} | {threads} |"
            )
        assert bestp == exact, (bestp, exact)
        rows.append(f"| | plain Dask (worker_client + as_completed.add) | {tp:.2f} s ({n} runs {spreadp}), {expandedp} nodes | {tasksp} | {threadsp} |")
    print("| program | system | time to answer | tasks run | peak threads (busiest worker) |")
    print("|---|---|---|---|---|")
    print("\n".join(rows), flush=True)
    if not args.no_ray:
        try:
            print("\n".join(ray_rows(only, pages, ideal, args.race_runs)))
        except Exception as e:  # Ray could not start (a loaded machine: its GCS times out)
            print(f"| (Ray) | did not start: {e!r} | | | |")


def ray_rows(only: set, pages: list, ideal: float, race_runs: int) -> list[str]:
    try:
        import ray
    except ImportError:
        return ["| (Ray) | not installed | | | |"]
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        @ray.remote
        def rfetch(url):
            time.sleep(fetch_time(url))
            return links_of(url)

        if "crawl" in only:
            t = time.perf_counter()
            queue, inflight, n = ["site"], [], 0
            while queue or inflight:
                while queue and len(inflight) < 8:
                    inflight.append(rfetch.remote(queue.pop(0)))
                ready, inflight = ray.wait(inflight, num_returns=1)
                n += 1
                queue += ray.get(ready[0])
            t = time.perf_counter() - t
            assert n == len(pages)
            rows.append(f"| crawl | Ray (ray.wait, 8 in flight) | {t:.2f} s ({t / ideal:.2f} x ideal) | {n} | |")

        @ray.remote
        def rstrategy(depth, seconds):
            if depth == 0:
                time.sleep(seconds)
                return 1
            return sum(ray.get([rstrategy.remote(depth - 1, seconds) for _ in range(2)]))

        if "race" in only:
            answers = []
            for _ in range(min(race_runs, 5)):
                t = time.perf_counter()
                refs = [rstrategy.remote(3, 0.8), rstrategy.remote(4, 0.5)]
                ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
                answers.append(time.perf_counter() - t)
                for r in refs:
                    ray.cancel(r, recursive=True, force=True)
                time.sleep(1)
            rows.append(f"| race | Ray (ray.wait timeout, ray.cancel recursive) | answer at {min(answers):.2f}-{max(answers):.2f} s ({len(answers)} runs) | | |")

        @ray.remote
        def rexpand(level, value, room):
            return expand_plain(level, value, room)

        if "knapsack" in only:
            t = time.perf_counter()
            best, expanded, heap = 0, 0, []
            inflight = [rexpand.remote(0, 0, CAPACITY)]
            while inflight:
                ready, inflight = ray.wait(inflight, num_returns=1)
                expanded += 1
                for level, value, room in ray.get(ready[0]):
                    best = max(best, value)
                    if level < len(ITEMS):
                        _push(heap, (level, value, room))
                while len(inflight) < 8 and (node := _pop_promising(heap, best)) is not None:
                    inflight.append(rexpand.remote(*node))
            t = time.perf_counter() - t
            assert best == knapsack_exact()
            rows.append(f"| knapsack | Ray (ray.wait, 8 in flight) | {t:.2f} s, {expanded} nodes | {expanded} | |")

        @ray.remote
        def rscore(config, budget):
            return score_plain(config, budget)

        if "halving" in only:
            t = time.perf_counter()
            configs, budget = list(range(64)), 4
            while len(configs) > 1:
                scores = ray.get([rscore.remote(c, budget) for c in configs])
                ranked = sorted(zip(scores, configs), reverse=True)
                configs = [c for _, c in ranked[: len(configs) // 2]]
                budget *= 2
            t = time.perf_counter() - t
            assert configs[0] == 21
            rows.append(f"| successive halving | Ray (ray.get per round) | {t:.2f} s | | |")
    finally:
        ray.shutdown()
    return rows


if __name__ == "__main__":
    main()
