"""A cluster of several simulated hosts on one machine.

The scheduler runs on 127.0.0.1. Each host is a mount namespace of its own
(``unshare --mount``, held by a sleeping process) with a private ``/dev/shm``
(a fresh tmpfs), in which a ``dask worker --nworkers N`` runs with its own
temporary directory (where the lifetimes registry lives), listening on its
own loopback address: 127.0.0.2, 127.0.0.3, ... So distributed sees workers
on different hosts (``WorkerState.host`` differs), and shared-memory
segments of one host do not exist on another, as on separate machines. Each
process started here leads a process group; ``close`` kills the groups, and
a namespace goes with its last process.

Needs root and util-linux's ``unshare``; ``available()`` says why not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from distributed import Client
from helpers import workers_now


def available() -> str | None:
    """None if hosts can be simulated here, else the reason why not."""
    if not sys.platform.startswith("linux"):
        return "simulated hosts need Linux mount namespaces"
    if os.geteuid() != 0:
        return "simulated hosts need root (unshare --mount, mount -t tmpfs)"
    if shutil.which("unshare") is None:
        return "simulated hosts need util-linux's unshare"
    probe = subprocess.run(
        ["unshare", "--mount", "--fork", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
        capture_output=True,
    )
    if probe.returncode != 0:
        return f"unshare --mount failed here: {probe.stderr.decode().strip()}"
    return None


def _dask() -> str:
    return os.path.join(os.path.dirname(sys.executable), "dask")


class Hosts:
    """``Hosts(tmp_path, [2, 2])``: a scheduler and two hosts of two workers.

    ``hosts[i]`` is the loopback address of host ``i``; ``workers_of(i)``
    its workers' addresses; ``run_on_host(i, argv)`` runs a command inside
    host ``i``'s namespace (seeing its ``/dev/shm``).
    """

    def __init__(
        self, tmp_path: Any, workers_per_host: list[int], *, extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None, host_extra: dict[int, tuple[str, ...]] | None = None,
    ):
        self.tmp = tmp_path
        self.env = {**os.environ, **(env or {})}
        self.procs: list[subprocess.Popen] = []
        self.hosts = [f"127.0.0.{i + 2}" for i in range(len(workers_per_host))]
        self.pids: list[int] = []  # a process in each host's namespace
        self.worker_groups: list[subprocess.Popen] = []
        try:
            sched_file = tmp_path / "scheduler.json"
            self._spawn(
                "scheduler",
                [_dask(), "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
                 "--scheduler-file", str(sched_file)],
                env=self.env,
            )
            self.address = self._address(sched_file)
            for i, (host, n) in enumerate(zip(self.hosts, workers_per_host)):
                self._start_host(host, n, extra + (host_extra or {}).get(i, ()))
            self.client = Client(self.address, timeout="20s")
            self.client.wait_for_workers(sum(workers_per_host), timeout=60)
        except BaseException:
            self.close()
            raise

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.procs.append(p)
        return p

    def _address(self, sched_file: Any) -> str:
        import json

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if sched_file.exists():
                try:
                    return json.loads(sched_file.read_text())["address"]
                except (ValueError, KeyError):
                    pass
            time.sleep(0.05)
        raise TimeoutError("the scheduler did not start: " + (self.tmp / "scheduler.log").read_text())

    def _start_host(self, host: str, n: int, extra: tuple[str, ...]) -> None:
        # The host: a process that holds a mount namespace with a private
        # /dev/shm (unshare without --fork: the shell itself is in it).
        ready = self.tmp / f"host-{host}.ready"
        keeper = self._spawn(
            f"host-{host}-namespace",
            ["unshare", "--mount", "sh", "-c", f"mount -t tmpfs tmpfs /dev/shm && touch {ready} && exec sleep infinity"],
        )
        deadline = time.monotonic() + 10
        while not ready.exists():
            if keeper.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"host {host}: " + (self.tmp / f"host-{host}-namespace.log").read_text())
            time.sleep(0.02)
        self.pids.append(keeper.pid)
        tmp = self.tmp / f"host-{host}"  # the host's own temporary directory
        tmp.mkdir(exist_ok=True)
        env = {**self.env, "DASK_TEMPORARY_DIRECTORY": str(tmp)}
        argv = [_dask(), "worker", self.address, "--host", host, "--nworkers", str(n), "--nthreads", "1",
                "--no-dashboard", "--local-directory", str(self.tmp / f"host-{host}-local"), *extra]
        # nsenter execs the worker: it leads the group of the host's processes.
        self.worker_groups.append(
            self._spawn(f"host-{host}", ["nsenter", "--target", str(keeper.pid), "--mount", "--", *argv], env=env)
        )

    def workers_of(self, i: int) -> list[str]:
        host = self.hosts[i]
        return sorted(a for a, w in workers_now(self.client).items() if w["host"] == host)

    def run_on_host(self, i: int, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``i`` (in its mount namespace: its /dev/shm)."""
        return subprocess.run(["nsenter", "--target", str(self.pids[i]), "--mount", "--", *argv], **kwargs)

    def signal_host(self, i: int, sig: int) -> None:
        """Send ``sig`` to every worker process of host ``i`` (SIGSTOP: a
        host that is there but does nothing)."""
        os.killpg(self.worker_groups[i].pid, sig)

    def kill_scheduler(self) -> None:
        os.killpg(self.procs[0].pid, signal.SIGKILL)
        self.procs[0].wait()

    def shm_of(self, i: int) -> list[str]:
        """dask_coro's segments in host ``i``'s /dev/shm."""
        out = self.run_on_host(i, ["ls", "/dev/shm"], capture_output=True, text=True, check=True)
        return sorted(n for n in out.stdout.split() if n.startswith("dask-coro-"))

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGCONT)  # a stopped host hears SIGTERM
            except ProcessLookupError:
                pass
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
