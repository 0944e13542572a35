"""A small HTTP/1.1 client connection: one write per request, bodies read as they arrive.

    conn = Connection(connect=lambda: socket.create_connection(...), timeout=600)
    conn.send_request("POST", "/v1/chat/completions", headers, body)
    resp = conn.read_response()        # status, headers (lower-case), body reader
    for piece in resp.pieces(): ...    # raw body bytes as they arrive (chunked decoded)
    data = resp.read()                 # or the whole body

Why not http.client: it parses headers through the email package and sends headers and
body in two writes; this is the proxy's hot path. Only what an OpenAI-compatible
upstream needs is supported: Content-Length, chunked, or read-until-close bodies.
"""
from __future__ import annotations

import select
import socket
from typing import Callable, Iterator

MAX_HEAD = 64 * 1024
READ_SIZE = 65536


def _poll():
    """The system's poll: gevent's patching removes select.poll, and a zero-timeout poll of
    one descriptor never blocks, so the original is safe under gevent."""
    try:
        from gevent.monkey import get_original
    except ImportError:  # pragma: no cover - the proxy depends on gevent
        return select.poll()
    return get_original("select", "poll")()


class ProtocolError(OSError):
    """The upstream broke the HTTP framing or closed the connection early."""


class Connection:
    def __init__(self, connect: Callable[[], socket.socket], timeout: float):
        self._connect = connect
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self._poller = None  # polls self.sock once opened (is_idle_alive)
        self.buf = bytearray()

    def open(self) -> None:
        if self.sock is None:
            self.sock = self._connect()
            self.buf.clear()
            self._poller = _poll()
            self._poller.register(self.sock.fileno(), select.POLLIN)
        self.sock.settimeout(self.timeout)

    def is_idle_alive(self) -> bool:
        """For a pooled connection: the upstream has not closed it and sent nothing unasked.
        An idle connection with anything to read (EOF, a reset, stray bytes) must not carry
        another request. A zero-timeout poll: well under a microsecond, never blocks."""
        if self.sock is None:
            return not self.buf  # never opened: open() connects afresh
        return not self.buf and not self._poller.poll(0)

    def send_request(self, method: str, path: str, headers: dict, body: bytes | None) -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: localhost", *(f"{k}: {v}" for k, v in headers.items())]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        self.sock.sendall("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + (body or b""))

    def _fill(self) -> bool:
        data = self.sock.recv(READ_SIZE)
        if data:
            self.buf += data
        return bool(data)

    def read_response(self) -> "Response":
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > MAX_HEAD:
                raise ProtocolError("upstream response head is too large")
            if not self._fill():
                raise ProtocolError("upstream closed the connection before answering")
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[:end + 4]
        parts = head[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"upstream sent a bad status line: {head[0][:80]!r}")
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return Response(self, int(parts[1]), headers, http10=parts[0] == "HTTP/1.0")

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked on another thread
            except OSError:
                pass
            sock.close()


class Response:
    def __init__(self, conn: Connection, status: int, headers: dict, http10: bool = False):
        self.conn, self.status, self.headers = conn, status, headers
        self.is_chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self.remaining = int(length) if length and length.isdigit() and not self.is_chunked else None
        self.will_close = headers.get("connection", "").lower() == "close" or http10 or (
            self.remaining is None and not self.is_chunked)
        self.is_complete = self.remaining == 0

    def getheader(self, name: str, default=None):
        return self.headers.get(name.lower(), default)

    def pieces(self) -> Iterator[bytes]:
        """Body bytes as they arrive; ends when the body is complete."""
        if self.is_chunked:
            yield from self._chunked()
        elif self.remaining is not None:
            yield from self._sized()
        else:
            yield from self._until_close()
        self.is_complete = True

    def read(self) -> bytes:
        return b"".join(self.pieces())

    def _take(self, n: int | None = None) -> bytes:
        buf = self.conn.buf
        n = len(buf) if n is None else min(n, len(buf))
        data = bytes(buf[:n])
        del buf[:n]
        return data

    def _need(self) -> None:
        if not self.conn._fill():
            raise ProtocolError("upstream closed the connection in the middle of a response")

    def _sized(self) -> Iterator[bytes]:
        while self.remaining:
            if not self.conn.buf:
                self._need()
            data = self._take(self.remaining)
            self.remaining -= len(data)
            yield data

    def _until_close(self) -> Iterator[bytes]:
        while True:
            if self.conn.buf:
                yield self._take()
            if not self.conn._fill():
                return

    def _chunked(self) -> Iterator[bytes]:
        buf = self.conn.buf
        while True:
            while (nl := buf.find(b"\r\n")) < 0:
                self._need()
            size_text = bytes(buf[:nl]).split(b";")[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
            del buf[:nl + 2]
            if size == 0:
                while True:  # optional trailer lines, then an empty line
                    while (nl := buf.find(b"\r\n")) < 0:
                        self._need()
                    is_last = nl == 0
                    del buf[:nl + 2]
                    if is_last:
                        return
            while size:
                if not buf:
                    self._need()
                data = self._take(size)
                size -= len(data)
                yield data
            while len(buf) < 2:
                self._need()
            del buf[:2]
