"""``python -m dask_coro`` (and the ``dask-coro`` script): the README's main job."""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from distributed import Client, LocalCluster
from helpers import dask_cli, free_port, start_worker

pytestmark = pytest.mark.inline  # the demo runs with the shipped defaults


def demo(*args: str, timeout: float = 110) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dask_coro", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def check_results(out: str) -> None:
    import dask_coro

    # which engine runs (docs/running.md), the one this interpreter imports
    assert re.search(rf"^engine: {dask_coro.engine} ", out, re.M), out
    assert re.search(r"^fib\(8\) +?= 21 +[0-9.]+ s$", out, re.M), out
    assert re.search(r"^afib\(8\) +?= 21 +[0-9.]+ s$", out, re.M), out
    # the README's process_all, which prints 55 there
    assert re.search(r"^process_all\(\) +?= 55 +[0-9.]+ s$", out, re.M), out
    assert re.search(r"^logical_task\(5\) \+ 1 +?= 101 +[0-9.]+ s$", out, re.M), out
    assert "shared_totals(80 MB, 4)      = [10000000.0, 10000000.0, 10000000.0, 10000000.0]" in out


def test_demo_on_an_embedded_cluster():
    out = demo("-n", "8", "--workers", "2", "--threads", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"on 2 workers, 2 threads; dashboard: http://\S+/status", out.stdout)
    check_results(out.stdout)
    assert "shared segments left         = 0" in out.stdout


def test_demo_against_an_existing_cluster():
    with LocalCluster(
        n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0"
    ) as cluster:
        out = demo("-n", "8", "--address", cluster.scheduler_address)
    assert out.returncode == 0, out.stderr[-3000:]
    # its dashboard (or, without bokeh, the page saying to install it) is at /status
    assert re.search(r"on 1 worker, 2 threads; dashboard: http://\S+/status$", out.stdout, re.M), out.stdout
    check_results(out.stdout)


def test_demo_of_a_base_install():
    """Without the extras (bokeh, NumPy: blocked in the demo's process, where
    its cluster's scheduler runs) the demo names the extra each would come
    from, and prints no dashboard link: there distributed serves only a page
    saying to install bokeh, and no Coroutines page."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    code = (
        "import sys; sys.modules['bokeh'] = None; sys.modules['numpy'] = None\n"
        "from dask_coro.__main__ import main\n"
        "sys.exit(main(['-n', '8', '--workers', '1', '--threads', '1']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ('on 1 worker, 1 thread; dashboard: none (it needs bokeh>=3.1.0 where the scheduler '
            'runs: pip install ".[dashboard]" in a clone of dask_coro') in out.stdout, out.stdout
    assert "http://" not in out.stdout
    assert re.search(r"^fib\(8\) +?= 21 +[0-9.]+ s$", out.stdout, re.M), out.stdout
    assert ('shared memory: skipped (it needs NumPy: pip install ".[shm]" in a clone of '
            'dask_coro, or pip install numpy)') in out.stdout
    # the extras named are the package's, and bring what is missing
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert extras["dashboard"] == ["bokeh>=3.1.0"] and extras["shm"] == ["numpy", "xxhash"]


@pytest.mark.parametrize("option", ["--workers", "--threads"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_demo_cluster_of_no_worker_or_thread(option, value, capsys):
    # as --address refuses a scheduler with no workers, rather than wait on fib
    # forever; in this process (the check comes before any cluster starts)
    from dask_coro.__main__ import main

    assert main([option, value]) == 2
    out = capsys.readouterr()
    assert out.err == f"error: {option} must be at least 1, not {value}\n" and out.out == ""


# -- addresses where no usable scheduler answers: one line, exit status 2 ------------


def failed(out: subprocess.CompletedProcess, address: str, *found: str) -> None:
    """``out`` is the CLI giving up on ``address``: status 2, one line on
    stderr naming the address and saying each of ``found``, no traceback."""
    lines = out.stderr.splitlines()
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    assert len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("error: ") and address in lines[0], lines[0]
    for text in found:
        assert text in lines[0], lines[0]
    assert out.stdout == ""


@contextlib.contextmanager
def serving(handle):
    """A TCP server on 127.0.0.1 that calls ``handle(conn)`` in a thread for
    each connection; yields its address."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=10)
        listener.close()


def test_closed_port():
    address = f"tcp://127.0.0.1:{free_port()}"
    failed(demo("--address", address, "--timeout", "1", timeout=60), address,
           "cannot reach a scheduler at", "nothing listens there (connection refused)")


def test_closed_port_is_known_at_once(monkeypatch):
    """A refused connection is the answer: distributed's connect, which
    retries it until its timeout, is not called."""
    import asyncio

    import distributed
    import distributed.comm

    from dask_coro._reach import Unreachable, reach

    async def retrying(address, timeout=None, **kwargs):
        raise AssertionError("distributed's connect was called")

    monkeypatch.setattr(distributed.comm, "connect", retrying)
    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(Unreachable, match=r"nothing listens there \(connection refused\)"):
        asyncio.run(reach(address, distributed.Security(), 30.0))


def test_closed_port_when_distributed_gives_up_with_a_timeout(monkeypatch):
    """On a loaded machine the first try may time out, and distributed's
    connect, retrying a refused port, give up on a timed-out try: the port is
    asked once more, plainly."""
    import asyncio

    import distributed
    import distributed.comm
    import distributed.comm.tcp

    from dask_coro._reach import Unreachable, reach

    async def slow(self, address, deserialize=True, **kwargs):
        raise asyncio.TimeoutError()

    async def timed_out(address, timeout=None, **kwargs):
        raise OSError(f"Timed out trying to connect to {address}") from TimeoutError()

    monkeypatch.setattr(distributed.comm.tcp.TCPConnector, "connect", slow)
    monkeypatch.setattr(distributed.comm, "connect", timed_out)
    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(Unreachable, match=r"nothing listens there \(connection refused\)"):
        asyncio.run(reach(address, distributed.Security(), 1.0))


def test_server_sending_garbage():
    # What it sends first is read as the length of a message: 0x6f6c6c6568 ...
    # bytes, exabytes, which distributed fails to allocate (a MemoryError).
    def garbage(conn):
        with conn:
            conn.sendall(b"hello, I am not a Dask scheduler\r\n" * 4)
            conn.recv(1024)

    with serving(garbage) as address:
        out = demo("--address", address, timeout=60)
    failed(out, address, "the server answers in another protocol", "it sends b'hello, I am not ")


def test_http_server():
    # http.server waits for a request line: distributed's handshake alone would wait forever.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *a: None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = f"tcp://127.0.0.1:{server.server_address[1]}"
    try:
        out = demo("--address", address, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    failed(out, address, "sent no Dask handshake in 4.0 s", "it is an HTTP server (it answers HTTP/1.0 501")


def test_address_syntax():
    failed(demo("--address", "nonsense://x"), "'nonsense://x'",
           "is not a scheduler address: unknown address scheme 'nonsense'")
    failed(demo("--address", "tcp://127.0.0.1"), "'tcp://127.0.0.1'", "missing port number")
    failed(demo("--address", "tcp://127.0.0.1:1", "--timeout", "0"), "--timeout must be a positive")


# -- real schedulers ------------------------------------------------------------


def _listening(port: int, proc: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


@contextlib.contextmanager
def scheduler(tmp_path, *args: str):
    """A ``dask scheduler`` process on 127.0.0.1; yields its port."""
    port = free_port()
    log = tmp_path / f"s{port}.log"
    proc = dask_cli("scheduler", "--host", "127.0.0.1", "--port", str(port), *args, log=log)
    try:
        _listening(port, proc, log)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def no_dashboard(tmp_path_factory):
    """A scheduler started with --no-dashboard (its HTTP server still runs, for
    /health and metrics: distributed lists it as the "dashboard" service) and
    one worker; yields (scheduler address, worker address)."""
    tmp_path = tmp_path_factory.mktemp("no-dashboard")
    with scheduler(tmp_path, "--no-dashboard", "--dashboard-address", "127.0.0.1:0") as port:
        address = f"tcp://127.0.0.1:{port}"
        worker = start_worker(address, tmp_path, "--no-nanny")
        try:
            with Client(address, timeout=60) as client:
                client.wait_for_workers(1, timeout=60)
                assert "dashboard" in client.scheduler_info()["services"]
                (worker_address,) = client.nthreads()
            yield address, worker_address
        finally:
            worker.terminate()
            worker.wait(timeout=30)


def test_demo_against_a_scheduler_without_dashboard(no_dashboard):
    address, _ = no_dashboard
    out = demo("-n", "8", "--address", address)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "on 1 worker, 1 thread; dashboard: none (the scheduler runs without one)" in out.stdout
    check_results(out.stdout)


def test_a_worker_is_not_a_scheduler(no_dashboard):
    _, worker = no_dashboard
    failed(demo("--address", worker), worker, "a Dask Worker answers there, not a scheduler")


def test_a_scheduler_without_workers(tmp_path):
    with scheduler(tmp_path, "--dashboard-address", "127.0.0.1:0") as port:
        address = f"tcp://127.0.0.1:{port}"
        out = demo("--address", address, "--timeout", "3")
    failed(out, address, "has no workers (none joined in 3 s, see --timeout)")


def test_a_dashboard_port(tmp_path):
    with scheduler(tmp_path, "--dashboard-address", "127.0.0.1:0") as port:
        with Client(f"tcp://127.0.0.1:{port}", timeout=60) as client:
            http_port = client.scheduler_info()["services"]["dashboard"]
        address = f"tcp://127.0.0.1:{http_port}"
        out = demo("--address", address)
    failed(out, address, "it is an HTTP server", "a dashboard's port?")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """Two self-signed CAs' certificates and keys (PEM files), as ``--tls-*``
    options: one the scheduler's, one another's."""
    pytest.importorskip("cryptography")
    from distributed.security import Security

    tmp_path = tmp_path_factory.mktemp("tls")
    options = []
    for name in ("ours", "other"):
        sec = Security.temporary()
        for part, pem in [("ca", sec.tls_ca_file), ("cert", sec.tls_client_cert), ("key", sec.tls_client_key)]:
            (tmp_path / f"{name}-{part}.pem").write_text(pem)
        options.append([f"--tls-{opt}={tmp_path / f'{name}-{part}.pem'}"
                        for opt, part in [("ca-file", "ca"), ("cert", "cert"), ("key", "key")]])
    return options


def test_tls_scheduler(tmp_path, tls_files):
    ours, other = tls_files
    with scheduler(tmp_path, "--protocol", "tls", "--dashboard-address", "127.0.0.1:0", *ours) as port:
        tls, tcp = f"tls://127.0.0.1:{port}", f"tcp://127.0.0.1:{port}"
        failed(demo("--address", tls), tls, "is a TLS address, and no TLS credentials are given")
        failed(demo("--address", tls, *other), tls,
               "the TLS handshake failed: self-signed certificate", "--tls-ca-file")
        failed(demo("--address", tcp), tcp,
               "closed the connection at Dask's handshake", "it is a TLS server: use a tls:// address")
        # the right credentials reach it; it has no worker
        failed(demo("--address", tls, "--timeout", "3", *ours), tls, "has no workers")


def test_bad_tls_options(tls_files, tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    failed(demo("--address", address, *tls_files[0]), address,
           "is not a TLS address, and encryption is required", "use tls://")
    tls = address.replace("tcp://", "tls://")
    ca_file, cert, _ = tls_files[0]
    failed(demo("--address", tls, ca_file), "", "TLS needs both a CA certificate (--tls-ca-file) and")
    missing = tmp_path / "missing.pem"
    failed(demo("--address", tls, ca_file, f"--tls-cert={missing}"), str(missing), "no such file")
    (tmp_path / "empty.pem").write_text("")
    failed(demo("--address", tls, f"--tls-ca-file={tmp_path / 'empty.pem'}", cert),
           "", "cannot use the TLS credentials given")


def test_tls_address_of_a_tcp_scheduler(no_dashboard, tls_files):
    address, _ = no_dashboard
    tls = address.replace("tcp://", "tls://")
    failed(demo("--address", tls, *tls_files[0]), tls,
           "it speaks Dask's protocol without TLS: use a tcp:// address")


def test_help_shows_the_defaults():
    out = demo("--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps lines
    assert "--timeout SECONDS" in text and "(default: 5.0)" in text
    assert "embedded cluster size" not in text and "(default: 2)" in text and "(default: 20)" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "dask-coro")
    out = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--address" in out.stdout and "--release-abandoned" in out.stdout
    # the usage line names the command as typed
    assert out.stdout.startswith("usage: dask-coro "), out.stdout
    assert demo("--help").stdout.startswith("usage: python -m dask_coro "), out.stdout
