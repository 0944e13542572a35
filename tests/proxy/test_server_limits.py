"""Issue 25: the proxy's gevent server serves at most max-connections clients at once, and
closes a connection that sends no complete request head within idle-timeout-s. The real
server (make_server, QuietHandler) runs on its own hub in a thread, around a tiny app."""
import contextlib
import socket
import threading
import time

import pytest

from tests.support.proxy_fakes import proxy_config


def hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


@contextlib.contextmanager
def gevent_server(tmp_path, **cfg):
    """make_server(cfg, hello) on a free port, served from a thread with its own gevent hub."""
    import gevent

    from proxy.server import make_server
    config = proxy_config("http://127.0.0.1:9/v1", tmp_path, **cfg)
    ready, stop, port = threading.Event(), threading.Event(), []

    def run():
        server = make_server({**config, "PORT": 0}, app=hello)
        server.start()
        port.append(server.server_port)
        ready.set()
        while not stop.is_set():
            gevent.sleep(0.02)
        server.stop(timeout=1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield port[0]
    finally:
        stop.set()
        thread.join(10)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def ask(sock: socket.socket) -> bytes:
    sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    return sock.recv(4096)


def test_at_most_max_connections_are_served_at_once(tmp_path):
    with gevent_server(tmp_path, MAX_CONNECTIONS=2, IDLE_TIMEOUT_S=30) as port:
        first, second, third = connect(port), connect(port), connect(port)
        assert ask(first).startswith(b"HTTP/1.1 200") and ask(second).startswith(b"HTTP/1.1 200")
        third.settimeout(0.5)  # two kept-alive connections fill the pool: no answer yet
        with pytest.raises(TimeoutError):
            ask(third)
        first.close()  # a slot frees: the third is accepted and answered
        third.settimeout(5)
        assert third.recv(4096).startswith(b"HTTP/1.1 200")
        second.close()
        third.close()


def test_an_idle_or_slow_connection_is_closed_after_idle_timeout(tmp_path):
    with gevent_server(tmp_path, IDLE_TIMEOUT_S=0.3) as port:
        kept = connect(port)
        assert ask(kept).startswith(b"HTTP/1.1 200")
        silent, slow = connect(port), connect(port)
        slow.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n")  # the head never ends
        start = time.monotonic()
        assert kept.recv(4096) == b"" and silent.recv(4096) == b""  # closed by the server
        assert slow.recv(4096).startswith(b"HTTP/1.1 400") and slow.recv(4096) == b""
        assert time.monotonic() - start < 3
        for sock in (kept, silent, slow):
            sock.close()


def test_limits_are_validated():
    from proxy import config
    for key in ("MAX_CONNECTIONS", "IDLE_TIMEOUT_S"):
        with pytest.raises(config.ConfigError, match="must be positive"):
            config.load({key: 0}, None, {})
