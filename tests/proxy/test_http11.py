"""The proxy's small HTTP/1.1 client: framing under every split of the bytes."""
import socket
import threading

import pytest

from proxy.upstream.http11 import Connection, ProtocolError

CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
           b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n")
SIZED = b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody"
UNTIL_CLOSE = b"HTTP/1.0 200 OK\r\n\r\nall of it"


def respond(raw: bytes, cuts: list[int]):
    """A connection whose peer writes `raw` in pieces cut at `cuts`, then closes."""
    a, b = socket.socketpair()
    conn = Connection(lambda: a, timeout=5)
    conn.open()

    def write():
        edges = [0, *cuts, len(raw)]
        for lo, hi in zip(edges, edges[1:]):
            b.sendall(raw[lo:hi])
        b.close()
    thread = threading.Thread(target=write)
    thread.start()
    return conn, thread


@pytest.mark.parametrize("raw,status,body", [(CHUNKED, 200, b"hello, world"), (SIZED, 201, b"body"),
                                             (UNTIL_CLOSE, 200, b"all of it")])
def test_every_two_way_split(raw, status, body):
    for cut in range(len(raw) + 1):
        conn, thread = respond(raw, [cut])
        resp = conn.read_response()
        assert (resp.status, resp.read()) == (status, body), cut
        thread.join()
        conn.close()


def test_one_byte_at_a_time_and_keep_alive_state():
    conn, thread = respond(CHUNKED + b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
                           list(range(1, len(CHUNKED) + 10)))
    resp = conn.read_response()
    assert resp.getheader("Content-Type") == "text/event-stream" and not resp.will_close
    assert b"".join(resp.pieces()) == b"hello, world" and resp.is_complete
    second = conn.read_response()  # the same connection carries the next response
    assert second.status == 204 and second.read() == b""
    thread.join()


@pytest.mark.parametrize("raw", [b"SPDY/9 200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
                                 b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", b""])
def test_broken_framing_is_a_protocol_error(raw):
    conn, thread = respond(raw, [])
    with pytest.raises(ProtocolError):
        conn.read_response().read()
    thread.join()
