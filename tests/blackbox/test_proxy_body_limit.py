"""Black-box: chunked bodies over the proxy's body limit get a 413 in the route's dialect,
with Connection: close and a bounded drain (issue 13, item 3)."""
import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.blackbox.test_proxy_cli import ROOT, free_port, wait_port
from tests.support.proxy_fakes import FakeUpstream

MIB = 1024 * 1024
ROUTES = {"/v1/messages": "anthropic", "/v1/messages/count_tokens": "anthropic",
          "/v1/chat/completions": "openai", "/v1/responses": "openai"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    state = tmp_path_factory.mktemp("limit")
    with FakeUpstream().serve() as upstream:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream", upstream,
                                 "--ledger", str(state / "ledger.sqlite")],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_port(port, proc)
            yield port
        finally:
            proc.terminate()
            proc.wait(15)


def post_chunked(port: int, route: str, total: int) -> tuple[bytes, dict, bytes, int, float]:
    """Send a chunked JSON body of `total` bytes while reading the answer, as a client would.
    Returns (status line, headers, body, bytes the client got to send, seconds to EOF)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sent = [0]

    def send():
        try:
            sock.sendall(f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n".encode())
            piece = b'{"x":"' + b"a" * (MIB - 6)
            while sent[0] < total:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent[0] += len(piece)
                piece = b"a" * MIB
            sock.sendall(b'2\r\n"}\r\n0\r\n\r\n')
        except OSError:
            pass  # the proxy stopped reading: expected past the limit

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    start = time.monotonic()
    reader = sock.makefile("rb")
    status = reader.readline()
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = reader.read(int(headers.get("content-length", 0)))
    try:
        rest = reader.read()  # the proxy closes the connection
    except OSError:
        rest = b""
    elapsed = time.monotonic() - start
    sender.join(30)
    sock.close()
    assert rest == b""
    return status, headers, body, sent[0], elapsed


@pytest.mark.parametrize("route", ROUTES)
def test_a_40_mib_chunked_body_is_a_413_in_the_routes_dialect(proxy, route):
    status, headers, body, _sent, elapsed = post_chunked(proxy, route, 40 * MIB)
    assert status.startswith(b"HTTP/1.1 413"), (status, body)
    assert headers["connection"].lower() == "close"
    error = json.loads(body)
    if ROUTES[route] == "anthropic":
        assert error["type"] == "error" and error["error"]["type"] == "request_too_large"
    else:
        assert error["error"]["type"] == "invalid_request_error"
    assert "larger than" in json.dumps(error) and elapsed < 10


def test_a_1_gib_chunked_body_is_not_read_to_its_end(proxy):
    status, headers, _body, sent, elapsed = post_chunked(proxy, "/v1/messages", 1024 * MIB)
    assert status.startswith(b"HTTP/1.1 413") and headers["connection"].lower() == "close"
    assert sent < 200 * MIB and elapsed < 10  # a bounded drain, then the connection closes
