"""The proxy's header block reader (proxy/request_headers.py) against gevent's own, which
runs http.client.parse_headers and the email package: the same headers, the same WSGI
environ, and a refused block answered 400 by the real server."""
import io

import pytest
from gevent.pywsgi import headers_factory

from proxy import request_headers
from tests.proxy.test_server_limits import connect, gevent_server

BLOCKS = [
    b"Host: 127.0.0.1:18080\r\nContent-Length: 93\r\nContent-Type: application/json\r\n\r\n",
    b"host: a\r\nX-Api-Key:   spaced  \r\nx-api-key: second\r\nAccept: */*\r\n\r\n",  # case, blanks, repeats
    b"Host: a\r\nX-Folded: one\r\n two\r\n\tthree\r\nX-After: z\r\n\r\n",             # obsolete folding
    b"Host: a\nUser-Agent: bare-lf\n\n",                                                 # LF line ends
    b"Host: a\r\nX-Empty:\r\nX-Colon: a:b:c\r\n\r\n",
    "Host: a\r\nX-Latin: caf\u00e9\r\n\r\n".encode("latin-1"),
    b"Host: a\r\n",                                                                      # cut short
]


@pytest.mark.parametrize("block", BLOCKS)
def test_headers_read_as_gevent_reads_them(block):
    ours, theirs = request_headers.read(io.BytesIO(block)), headers_factory(io.BytesIO(block))
    assert ours.status == theirs.status == ""
    assert list(ours.headers) == list(theirs.headers)
    for name in ("host", "HOST", "x-api-key", "Content-Type", "x-folded", "X-Empty", "missing"):
        assert ours.get(name) == theirs.get(name) and ours.getheader(name) == theirs.getheader(name)
    assert ours.typeheader == theirs.typeheader
    del ours["x-api-key"], theirs["x-api-key"]
    assert list(ours.headers) == list(theirs.headers)


def test_a_line_past_the_limit_is_refused_like_gevents():
    block = b"Host: a\r\nX-Big: " + b"x" * 70000 + b"\r\n\r\n"
    assert request_headers.read(io.BytesIO(block)).status == headers_factory(io.BytesIO(block)).status != ""


@pytest.mark.parametrize("block", [b"Host: a\r\nno colon here\r\n\r\n",
                                   b"".join(b"X-H%d: v\r\n" % i for i in range(101)) + b"\r\n",
                                   b"Host: a\r\nX-Big: " + b"x" * 70000 + b"\r\n\r\n"])
def test_a_refused_block_is_a_400_from_the_server(tmp_path, block):
    with gevent_server(tmp_path, IDLE_TIMEOUT_S=30) as port:
        sock = connect(port)
        sock.sendall(b"GET / HTTP/1.1\r\n" + block)
        assert sock.recv(4096).startswith(b"HTTP/1.1 400")
        good = connect(port)  # and the server goes on serving
        good.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert good.recv(4096).startswith(b"HTTP/1.1 200")


def test_every_line_counts_toward_the_limit_as_in_http_client():
    """99 headers and the blank line are the most http.client reads; folded lines count too,
    so endless continuation lines cannot grow one header without bound."""
    import http.client
    fits = b"".join(b"X-H%d: v\r\n" % i for i in range(99)) + b"\r\n"
    over = b"".join(b"X-H%d: v\r\n" % i for i in range(100)) + b"\r\n"
    folded = b"X-A: a\r\n" + b" more\r\n" * 200 + b"\r\n"
    assert request_headers.read(io.BytesIO(fits)).status == headers_factory(io.BytesIO(fits)).status == ""
    for block in (over, folded):
        assert request_headers.read(io.BytesIO(block)).status == "Too many headers"
        with pytest.raises(http.client.HTTPException):
            headers_factory(io.BytesIO(block))
