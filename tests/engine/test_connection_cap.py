"""Issue 25: the engine serves at most max-connections connections, each by a thread. At the
cap, idle kept-alive connections close to make room; a connection that still finds none gets
503 too_many_connections with Retry-After. The real UnixHTTPServer, around a tiny app."""
import contextlib
import json
import pathlib
import shutil
import socket
import threading

import pytest

from engined.config import ConfigError, EngineConfig
from engined.serving import connections
from engined.serving.http_server import UnixHTTPServer
from engined.serving.listen import Listener
from tests.support.engine import short_tmpdir


class App:
    """/slow holds its connection's thread until `release` is set; any other path answers."""

    def __init__(self):
        self.release = threading.Event()
        self.num_slow = threading.Semaphore(0)

    def handle(self, ex):
        if ex.path == "/slow":
            self.num_slow.release()
            self.release.wait(10)
        ex.send_json(200, {"ok": True})


@contextlib.contextmanager
def engine_server(max_connections: int):
    directory = short_tmpdir()
    listener = Listener(pathlib.Path(directory / "engine.sock"))
    app = App()
    server = UnixHTTPServer(listener.sock, app, max_connections)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield str(listener.path), app
    finally:
        app.release.set()
        server.is_draining = True
        server.shutdown()
        server.server_close()
        shutil.rmtree(directory, ignore_errors=True)


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    return sock


def send(sock: socket.socket, path: str = "/x") -> None:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: engine\r\n\r\n".encode())


def read_answer(sock: socket.socket) -> tuple[str, dict, bytes]:
    reader = sock.makefile("rb")
    status = reader.readline().decode()
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, reader.read(int(headers.get("content-length", 0)))


def is_closed(sock: socket.socket) -> bool:
    sock.settimeout(1)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_a_connection_past_the_cap_gets_503_when_none_is_idle(monkeypatch):
    monkeypatch.setattr(connections, "ROOM_WAIT_S", 0.3)
    with engine_server(max_connections=2) as (path, app):
        busy = [connect(path), connect(path)]
        for sock in busy:
            send(sock, "/slow")
        assert app.num_slow.acquire(timeout=5) and app.num_slow.acquire(timeout=5)
        late = connect(path)
        send(late)
        status, headers, body = read_answer(late)
        assert status.startswith("HTTP/1.1 503") and headers["retry-after"] == "1"
        assert headers["connection"] == "close" and late.recv(1) == b""
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        app.release.set()  # the held connections still get their answers
        assert all(read_answer(sock)[0].startswith("HTTP/1.1 200") for sock in busy)
        for sock in (*busy, late):
            sock.close()


def test_idle_kept_alive_connections_make_room():
    with engine_server(max_connections=2) as (path, _app):
        idle = [connect(path), connect(path)]
        for sock in idle:
            send(sock)
            assert read_answer(sock)[0].startswith("HTTP/1.1 200")  # kept alive, then idle
        new = connect(path)
        send(new)
        assert read_answer(new)[0].startswith("HTTP/1.1 200")
        assert any(is_closed(sock) for sock in idle)  # one or both closed to make room
        for sock in (*idle, new):
            sock.close()


def test_max_connections_is_validated_and_layered():
    assert EngineConfig().max_connections == 64
    assert EngineConfig.layered({}, {"KIMI_ENGINE_MAX_CONNECTIONS": "5"}).max_connections == 5
    with pytest.raises(ConfigError, match="max-connections"):
        EngineConfig(max_connections=0)
