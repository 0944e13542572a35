"""HTTP/1.1 over a Unix stream socket, in threads, with full control of every write.

- Headers and a small body leave in one write; SSE events leave one chunked-encoding
  chunk per write, as soon as they exist.
- Keep-alive connections wait for their next request with select(), so a draining
  server closes idle connections at once and `Exchange.is_client_alive` can peek for EOF.
- Bodies are capped before they are read (Content-Length, or while decoding chunks).
- At most max_connections connections have a thread (connections.ConnectionCap).
"""
import http.server
import json
import re
import select
import socket
import socketserver
import time
import uuid
from typing import Any

from engined.errors import EngineError, InvalidRequest, PayloadTooLarge
from engined.serving.connections import ConnectionCap

MAX_BODY_BYTES = 32 * 1024 * 1024
DISCARD_LIMIT = 256 * 1024 * 1024  # read and drop this much of a refused body, then close
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class UnixHTTPServer(ConnectionCap, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """`app.handle(exchange)` answers every request; `is_draining` closes idle connections,
    and so does `is_pressed` (a new connection waits for a thread)."""
    daemon_threads = False  # server_close() joins in-flight handlers: that is the drain
    block_on_close = True
    allow_reuse_address = False

    def __init__(self, listening: socket.socket, app, max_connections: int = 64):
        super().__init__(listening.getsockname(), Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = listening
        self.app = app
        self.is_draining = False
        self.cap_connections(max_connections)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    rbufsize = 0  # unbuffered, so select() on the socket tells the truth
    timeout = 120  # a stalled partial read or a client that stops reading
    server_version = "kimi-engine"

    def handle(self):
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection and self._wait_for_next_request():
            self.handle_one_request()

    def _wait_for_next_request(self) -> bool:
        while not self.server.is_draining and not self.server.is_pressed:
            if _is_readable(self.connection, 0.2):
                return True
        return False

    def send_error(self, code, message=None, explain=None):
        """Malformed HTTP (before any route runs): an OpenAI-shaped error, then close."""
        self.close_connection = True
        status = http.HTTPStatus(code)
        body = json.dumps({"error": {"message": message or status.phrase,
                                     "type": "invalid_request_error", "param": None,
                                     "code": None}}).encode()
        head = (f"HTTP/1.1 {code} {status.phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        try:
            self.wfile.write(head + body)
            _drop_pending_input(self.connection)  # unread input at close would reset the reply
        except OSError:
            pass

    def _dispatch(self):
        self.server.app.handle(Exchange(self))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch

    def log_message(self, format, *args):  # the app writes its own one line per request
        pass


class Exchange:
    """One request and its response on a connection."""

    def __init__(self, handler: Handler):
        self._handler = handler
        self._sock: socket.socket = handler.connection
        self.method = handler.command
        self.path = handler.path.split("?", 1)[0]
        self.headers = handler.headers
        incoming = self.headers.get("x-request-id", "")
        self.request_id = incoming if _REQUEST_ID.fullmatch(incoming) else uuid.uuid4().hex
        self.status: int | None = None
        self.is_streaming = False
        self.start_time = time.monotonic()
        self.stats: dict[str, Any] = {}
        self._is_body_read = False

    # -- request ---------------------------------------------------------------------------
    def read_body(self) -> bytes:
        body = self._read_body()
        self._is_body_read = True
        return body

    def _has_body(self) -> bool:
        return ("chunked" in self.headers.get("transfer-encoding", "").lower()
                or self.headers.get("content-length", "0").strip() not in ("", "0"))

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            return self._read_chunked()
        length = self.headers.get("content-length")
        if length is None:
            return b""
        if not length.strip().isdigit():
            self._handler.close_connection = True
            raise InvalidRequest(f"bad Content-Length {length!r}")
        size = int(length)
        if size > MAX_BODY_BYTES:
            self._discard_after_response = size
            raise PayloadTooLarge(f"request body of {size} bytes exceeds the "
                                  f"{MAX_BODY_BYTES} byte limit")
        return self._read_exact(size)

    def json_body(self) -> Any:
        body = self.read_body()
        if not body.strip():
            raise InvalidRequest("the request body is empty; expected a JSON object")
        try:
            obj = json.loads(body)
            if _SURROGATE_ESCAPE.search(body):  # only escapes can carry one: UTF-8 cannot
                _check_unicode(obj, "")
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an over-long integer
            raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise InvalidRequest("the request body is nested too deeply") from None
        return obj

    def _read_exact(self, size: int) -> bytes:
        parts, remaining = [], size
        while remaining:
            part = self._handler.rfile.read(min(remaining, 1 << 20))
            if not part:
                self._handler.close_connection = True
                raise InvalidRequest("the request body ended early")
            parts.append(part)
            remaining -= len(part)
        return b"".join(parts)

    def _read_chunked(self) -> bytes:
        body = bytearray()
        while True:
            line = self._handler.rfile.readline(1024).split(b";", 1)[0].strip()
            try:
                size = int(line, 16)
            except ValueError:
                self._handler.close_connection = True
                raise InvalidRequest("malformed chunked request body") from None
            if size == 0:
                while self._handler.rfile.readline(1024).strip():  # trailers
                    pass
                return bytes(body)
            if len(body) + size > MAX_BODY_BYTES:
                self._handler.close_connection = True
                raise PayloadTooLarge(f"chunked request body exceeds the {MAX_BODY_BYTES} "
                                      "byte limit")
            body += self._read_exact(size)
            self._read_exact(2)  # CRLF after each chunk

    _discard_after_response = 0

    def finish_refused_request(self):
        """After an error answer, read and drop the body the route never read: left
        unread it would be parsed as the next request, and closing early would break
        the client's send before it reads the answer. Over DISCARD_LIMIT (or 413), close."""
        if self._is_body_read or not self._has_body():
            return
        try:
            if "chunked" in self.headers.get("transfer-encoding", "").lower():
                self._read_chunked()
                return
            size = int(self.headers.get("content-length", "0").strip())
            if size > DISCARD_LIMIT:
                self._handler.close_connection = True
                return
            while size > 0:
                part = self._handler.rfile.read(min(size, 1 << 20))
                if not part:
                    break
                size -= len(part)
        except (OSError, ValueError, EngineError):
            self._handler.close_connection = True
        if self._discard_after_response:
            self._handler.close_connection = True

    # -- response --------------------------------------------------------------------------
    def _head(self, status: int, content_type: str, extra: dict[str, str]) -> bytes:
        self.status = status
        reason = http.HTTPStatus(status).phrase
        lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}",
                 f"x-request-id: {self.request_id}"]
        lines += [f"{k}: {v}" for k, v in extra.items()]
        if self.server_is_draining or self._discard_after_response:
            lines.append("Connection: close")
            self._handler.close_connection = True
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    @property
    def server_is_draining(self) -> bool:
        return self._handler.server.is_draining

    def send_bytes(self, status: int, body: bytes, content_type: str,
                   headers: dict[str, str] | None = None):
        head = self._head(status, content_type,
                          {**(headers or {}), "Content-Length": str(len(body))})
        self._sock.sendall(head + (b"" if self.method == "HEAD" else body))

    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None):
        self.send_bytes(status, json.dumps(obj, ensure_ascii=False).encode(),
                        "application/json", headers)

    def start_stream(self, first_event: str):
        """Headers and the first SSE event in one write."""
        self.is_streaming = True
        head = self._head(200, "text/event-stream",
                          {"Cache-Control": "no-cache", "Transfer-Encoding": "chunked"})
        self._sock.sendall(head + _chunk(first_event))

    def send_event(self, event: str):
        self._sock.sendall(_chunk(event))

    def end_stream(self, last_event: str):
        self._sock.sendall(_chunk(last_event) + b"0\r\n\r\n")

    def is_client_alive(self) -> bool:
        """False once the client closed its end (EOF or an error on the socket)."""
        try:
            if not _is_readable(self._sock, 0):
                return True
            return self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False


def _is_readable(sock: socket.socket, timeout_s: float) -> bool:
    """poll(), not select(): descriptors above FD_SETSIZE are fine. EOF and errors count
    as readable, so the caller's next read sees them."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(timeout_s * 1000))


def _drop_pending_input(sock: socket.socket, limit: int = 1 << 16):
    """Read what has already arrived (a socket timeout would make recv wait, so poll)."""
    while limit > 0 and _is_readable(sock, 0):
        data = sock.recv(min(limit, 4096))
        if not data:
            return
        limit -= len(data)


def _check_unicode(value: Any, where: str):
    """Valid JSON may still hold an unpaired surrogate escape ("\\ud800"): no UTF-8 text,
    no tokens, so refuse it here, naming the field, before any route sees it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRequest(f"{where or 'the body'}: an unpaired surrogate "
                                 f"(\\u{ord(value[exc.start]):04x}) is not valid Unicode text",
                                 param=where or None) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key, where or "a key")
            _check_unicode(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_unicode(item, f"{where}[{i}]")


def _chunk(data: str) -> bytes:
    payload = data.encode()
    return b"%x\r\n%s\r\n" % (len(payload), payload)
