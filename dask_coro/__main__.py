"""``python -m dask_coro``: the demo of the README on an embedded LocalCluster."""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import time
from collections.abc import Sequence

import dask_coro
from dask_coro.core import accel
from dask_coro.examples import afib, fib, logical_task, process_all


def _timed(label: str, fn) -> None:
    start = time.perf_counter()
    value = fn()
    print(f"{label:<28} = {value!r:<8} {time.perf_counter() - start:7.2f} s", flush=True)


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in --help, except those that have none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def _connect(args: argparse.Namespace):
    """A client of the scheduler at ``args.address`` that has a worker, or
    None after one line on stderr saying why not."""
    import asyncio

    from distributed import Client
    from distributed.security import Security

    from dask_coro._reach import Unreachable, reach

    if not args.timeout > 0:
        _error(f"--timeout must be a positive number of seconds, not {args.timeout}")
        return None
    given = [
        ("--tls-ca-file", "tls_ca_file", args.tls_ca_file),
        ("--tls-cert", "tls_client_cert", args.tls_cert),
        ("--tls-key", "tls_client_key", args.tls_key),
    ]
    for option, _, path in given:
        if path and not os.path.isfile(path):
            _error(f"{option} {path}: no such file")
            return None
    tls = {name: path for _, name, path in given if path}
    try:
        security = Security(**tls)
        context = security.get_connection_args("client")["ssl_context"]  # reads the files
    except (OSError, ValueError, ssl.SSLError) as e:
        _error(f"cannot use the TLS credentials given: {e}")
        return None
    if tls and context is None:
        _error(
            "TLS needs both a CA certificate (--tls-ca-file) and this client's "
            "certificate (--tls-cert), given or in distributed.comm.tls"
        )
        return None
    try:
        asyncio.run(reach(args.address, security, args.timeout))
    except Unreachable as e:
        _error(str(e))
        return None
    try:  # reach() found a scheduler: what fails now is a scheduler going away
        client = Client(args.address, timeout=args.timeout, security=security)
    except OSError as e:
        _error(f"cannot connect to the scheduler at {args.address}: {e}")
        return None
    try:
        client.wait_for_workers(1, timeout=args.timeout)
    except TimeoutError:
        client.close()
        _error(
            f"the scheduler at {args.address} has no workers (none joined in "
            f"{args.timeout:g} s, see --timeout)"
        )
        return None
    return client


def _dashboard(client, timeout: float) -> str:
    """The scheduler's dashboard link, if it serves a dashboard there. Its
    HTTP server is listed as its "dashboard" service even when started with
    --no-dashboard (it serves /health and metrics), so ask the page. Without
    bokeh the scheduler serves a page saying to install it instead (and no
    Coroutines page): then no link, but the extra that brings bokeh."""
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    from distributed.versions import BOKEH_REQUIREMENT

    if "dashboard" not in client.scheduler_info().get("services", {}):
        return "none"
    try:
        link = client.dashboard_link
    except KeyError as e:  # distributed.dashboard.link names an unset variable
        return f"unknown (distributed.dashboard.link: no {e})"
    try:
        with urllib.request.urlopen(link, timeout=timeout):
            pass
        # The list of the dashboard's single plots, beside its status page: {}
        # when the scheduler has no Bokeh application (distributed.http.
        # scheduler.info.IndividualPlots), as without bokeh, where distributed
        # serves distributed.http.scheduler.missing_bokeh at the link instead.
        plots = urllib.parse.urljoin(link, "individual-plots.json")
        with urllib.request.urlopen(plots, timeout=timeout) as answer:
            bokeh = json.loads(answer.read()) != {}
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return "none (the scheduler runs without one)"
        return f"{link} (it answers HTTP {e.code})"
    except (OSError, ValueError) as e:
        return f"{link} (not reachable from here: {getattr(e, 'reason', e)})"
    if not bokeh:
        return (
            f"none (it needs {BOKEH_REQUIREMENT} where the scheduler runs: "
            f"pip install \".[dashboard]\" in a clone of dask_coro, or pip install \"{BOKEH_REQUIREMENT}\")"
        )
    return link


def _prog() -> str:
    """The command as it was typed: ``dask-coro`` for the console script,
    ``python -m dask_coro`` for the module (whose argv[0] is its file)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not name or name == "__main__.py":
        return "python -m dask_coro"
    return name


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _runs(argv: Sequence[str]) -> int:
    """``python -m dask_coro runs``: the durable runs of a store, or forget one."""
    parser = argparse.ArgumentParser(
        prog=f"{_prog()} runs",
        description="List the durable runs of a store (coro.durability.store), or forget one.",
        formatter_class=_Help,
    )
    parser.add_argument("--store", help="a directory or an fsspec URL (default: coro.durability.store)")
    parser.add_argument("--forget", metavar="KEY", help="delete the run of this root key instead")
    args = parser.parse_args(argv)
    try:
        if args.forget is not None:
            there = dask_coro.forget_run(args.forget, store=args.store)
            print(f"forgot {args.forget!r}" if there else f"no run {args.forget!r} in the store")
            return 0 if there else 1
        found = dask_coro.runs(store=args.store)
    except ValueError as e:
        _error(str(e))
        return 2
    print(f"{'key':<40} {'state':<9} {'started':<19} {'children':>8} {'bytes':>12}")
    for run in found:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started))
        print(f"{run.key!s:<40} {run.state:<9} {started:<19} {run.children:>8} {run.bytes:>12}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["runs"]:
        return _runs(argv[1:])
    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="Run the dask_coro demo (fib, async fib, process_all, a "
        "promise, shared memory). 'runs' instead lists (or forgets) durable runs: "
        "see its --help.",
        formatter_class=_Help,
    )
    parser.add_argument(
        "--address",
        help="scheduler address of an existing cluster, e.g. tcp://127.0.0.1:8786 "
        "(not its dashboard's port); without it, the demo starts a cluster of its own",
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, metavar="SECONDS",
        help="for --address: how long to try to reach the scheduler, and then to "
        "wait for it to have a worker",
    )
    parser.add_argument(
        "--tls-ca-file", help="for a tls:// address: the CA certificate (PEM) "
        "(default: distributed.comm.tls.ca-file of the Dask configuration)",
    )
    parser.add_argument(
        "--tls-cert", help="for a tls:// address: this client's certificate (PEM) "
        "(default: distributed.comm.tls.client.cert)",
    )
    parser.add_argument(
        "--tls-key", help="for a tls:// address: this client's key (PEM), if not in "
        "--tls-cert (default: distributed.comm.tls.client.key)",
    )
    parser.add_argument("--workers", type=int, default=2, help="size of the demo's own cluster")
    parser.add_argument("--threads", type=int, default=1, help="threads per worker of the demo's own cluster")
    parser.add_argument("-n", type=int, default=20, help="fib(n) to compute")
    parser.add_argument(
        "--release-abandoned",
        action="store_true",
        help="instead of the demo: run the releases this host recorded for "
        "clusters that are gone (after a crash), and exit",
    )
    args = parser.parse_args(argv)
    if args.release_abandoned:
        released = dask_coro.release_abandoned()
        print(f"released {len(released)} resources of clusters that are gone")
        for rid in released:
            print(f"  {rid}")
        return 0

    from distributed import Client, LocalCluster

    if not args.address:  # the demo's own cluster
        for option, value in (("--workers", args.workers), ("--threads", args.threads)):
            if value < 1:
                # a cluster with no worker (or thread) would wait forever on fib
                _error(f"{option} must be at least 1, not {value}")
                return 2
    if args.address:
        client = _connect(args)
        if client is None:
            return 2
        cluster = None
    else:
        cluster = LocalCluster(
            n_workers=args.workers,
            threads_per_worker=args.threads,
            processes=True,
            dashboard_address=":0",
        )
        client = Client(cluster)
    with client:
        nthreads = client.nthreads()
        print(f"dask_coro {dask_coro.__version__} on {_plural(len(nthreads), 'worker')}, "
              f"{_plural(sum(nthreads.values()), 'thread')}; "
              f"dashboard: {_dashboard(client, args.timeout)}", flush=True)
        print(accel.describe(), flush=True)
        _timed(f"fib({args.n})", lambda: fib(args.n).compute())
        _timed(f"afib({args.n})", lambda: client.compute(afib(args.n)).result())
        _timed("process_all()", lambda: process_all().compute())
        _timed("logical_task(5) + 1", lambda: (logical_task(5) + 1).compute())
        try:
            from dask_coro import shm
        except ImportError:
            # dask_coro is installed from its clone (it is not on PyPI)
            print('shared memory: skipped (it needs NumPy: pip install ".[shm]" in a clone '
                  "of dask_coro, or pip install numpy)")
        else:
            from dask_coro.examples import shared_totals

            n = 10_000_000  # 80 MB
            _timed("shared_totals(80 MB, 4)", lambda: shared_totals(n, 4).compute())
            if not args.address:  # the segments of this host
                deadline = time.monotonic() + 10
                while shm.segments() and time.monotonic() < deadline:
                    time.sleep(0.05)
                print(f"{'shared segments left':<28} = {len(shm.segments())}")
    if cluster is not None:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
