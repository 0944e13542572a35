"""The real kimi-proxy started in front of a test's engine daemon (tests/support/engine.py)."""
import contextlib
import pathlib
import socket
import subprocess
import sys
import time

from tests.support.engine import Daemon, stop_process

ROOT = pathlib.Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def proxy_in_front(engine: Daemon, state_dir: pathlib.Path):
    """The real kimi-proxy (`python -m proxy serve`, its ledger in state_dir) on a free
    loopback port in front of a started engine: yields the port once it accepts connections,
    and stops the proxy after (the engine is the caller's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proxy = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port),
                              "--upstream", "unix://" + engine.sock,
                              "--ledger", str(state_dir / "ledger.sqlite")],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proxy.poll() is None and time.monotonic() < deadline, proxy.stderr.read()
                time.sleep(0.1)
        yield port
    finally:
        stop_process(proxy, 15)
