"""The gevent WSGI server around the app (TCP_NODELAY on every accepted socket).

SIGTERM/SIGINT drain: stop accepting, close kept-alive connections that wait for their next
request, and give open streams up to drain-timeout-s to finish (under the unit's
TimeoutStopSec=30s). A stream still open then gets its protocol's in-stream error (503,
"shutting down") and a clean end, never a cut connection.

At most max-connections client connections are served at once (a gevent pool; more wait in
the listen backlog), and a connection that sends no complete request head within
idle-timeout-s, kept alive between requests or not, is closed.

Each request may watch its client: `environ["kimi.watch_hangup"](on_hangup)` calls
on_hangup once if the client closes its connection, and returns the function that stops
watching. After an answer with `Connection: close` (a 413), the rest of the body is
drained for at most DRAIN_MAX_BYTES / DRAIN_MAX_S, so the client reads the answer
instead of a reset, and a 1 GiB body is not read to its end.
"""
from __future__ import annotations

import signal
import socket
import sys

import gevent
from gevent.event import Event
from gevent.pool import Pool
from gevent.pywsgi import Input, WSGIHandler, WSGIServer

from kimi_common.notify import sd_notify
from proxy import __version__, request_headers
from proxy.errors import UpstreamUnavailable


SHUTDOWN_GRACE_S = 2.0  # for the error events to be written once a stream is interrupted
DRAIN_MAX_BYTES = 64 * 1024 * 1024  # of a body left unread by a Connection: close answer
DRAIN_MAX_S = 5.0


class NoDelayServer(WSGIServer):
    def __init__(self, *args, max_connections: int = 256, idle_timeout_s: float = 60.0, **kwargs):
        super().__init__(*args, spawn=Pool(max_connections), **kwargs)  # drain waits for the pool
        self.idle_timeout_s = idle_timeout_s
        self.is_draining = False
        self.idle: set[QuietHandler] = set()  # connections waiting for their next request

    def handle(self, sock, address):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        return super().handle(sock, address)

    def drain(self, timeout_s: float) -> None:
        """Stop accepting; idle connections close now, requests in progress get timeout_s;
        then what still runs is interrupted with ShuttingDown, which streams render."""
        self.is_draining = True
        self.close()
        for handler in list(self.idle):
            handler.hang_up()
        if self.pool.join(timeout=timeout_s):
            return
        message = f"kimi-proxy is shutting down: the stream did not finish within {timeout_s:g} s"
        self.pool.kill(ShuttingDown(message), block=True, timeout=SHUTDOWN_GRACE_S)
        self.pool.kill(block=True, timeout=1)


class ShuttingDown(UpstreamUnavailable):
    """Raised inside a request still running when the drain time is up."""


class BoundedDrainInput(Input):
    """gevent reads a body left unread to its end, to keep the connection; once the answer
    said Connection: close, only a bounded part of it."""
    __slots__ = ("handler",)

    def _discard(self):
        if not self.handler.close_connection:
            return super()._discard()
        with gevent.Timeout(DRAIN_MAX_S, False):
            num_read = 0
            while num_read < DRAIN_MAX_BYTES and (data := self.read(65536)):
                num_read += len(data)


class QuietHandler(WSGIHandler):
    _idle_timer: gevent.Timeout | None = None

    def log_request(self):  # the app logs one line per request itself
        pass

    def MessageClass(self, *args):  # noqa: N802 - pywsgi's name: the request's header block
        return request_headers.read(*args)

    def read_requestline(self):
        """An empty line ends the connection: so it goes when the server drains, or when no
        request comes within idle-timeout-s (its pool slot is then free for another)."""
        if self.server.is_draining:
            return ""
        self.server.idle.add(self)
        try:
            line = self._within_idle_timeout(super().read_requestline)
            return "" if line is None else line
        finally:
            self.server.idle.discard(self)

    def read_request(self, raw_requestline):
        """Headers slower than idle-timeout-s: 400 and close (False tells gevent so)."""
        is_read = self._within_idle_timeout(super().read_request, raw_requestline)
        if is_read is None:
            self.close_connection = True
            return False
        return is_read

    def _within_idle_timeout(self, read, *args):
        """read(*args), or None if it takes more than idle-timeout-s. One timer per connection,
        restarted for each read: a new gevent.Timeout cost 4 us, twice a request."""
        timer = self._idle_timer
        if timer is None:
            timer = self._idle_timer = gevent.Timeout(self.server.idle_timeout_s)
        timer.start()
        try:
            return read(*args)
        except gevent.Timeout as exc:
            if exc is not timer:
                raise
            return None
        finally:
            timer.cancel()

    def get_environ(self):
        environ = super().get_environ()
        environ["kimi.watch_hangup"] = self.watch_hangup
        body = self.wsgi_input
        self.wsgi_input = BoundedDrainInput(body.rfile, body.content_length, socket=body.socket,
                                            chunked_input=body.chunked_input)
        self.wsgi_input.handler = self
        if environ["wsgi.input"] is body:
            environ["wsgi.input"] = self.wsgi_input
        return environ

    def watch_hangup(self, on_hangup):
        """Call on_hangup once if the client closes its connection; returns stop(). A bare
        io watcher (a few microseconds); a greenlet is spawned only once the socket reads."""
        sock = self.socket
        watcher = gevent.get_hub().loop.io(sock.fileno(), 1)

        def check():
            try:
                is_gone = sock.recv(1, socket.MSG_PEEK) == b""  # else: the client's next request
            except OSError:
                is_gone = True
            if is_gone:
                on_hangup()

        def readable():
            watcher.stop()
            gevent.spawn(check)

        watcher.start(readable)
        return watcher.close

    def hang_up(self) -> None:
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except (AttributeError, OSError):
            pass  # already closed

    def _write_with_headers(self, data):
        """Headers and the first body piece in one write (gevent sends two): one wake-up
        of the client instead of two, for every JSON answer and every stream's first frame."""
        self.headers_sent = True
        self.finalize_headers()
        towrite = bytearray(b"HTTP/1.1 ") + self.status + b"\r\n"
        for header, value in self.response_headers:
            towrite += header + b": " + value + b"\r\n"
        towrite += b"\r\n"
        if data and self.response_use_chunked:
            towrite += b"%x\r\n" % len(data) + data + b"\r\n"
        elif data:
            towrite += data
        self._sendall(towrite)


def base_url(host: str, port: int) -> str:
    shown = "localhost" if host in ("0.0.0.0", "127.0.0.1", "::", "localhost") else host
    return f"http://{shown}:{port}"


def banner(cfg: dict) -> str:
    from proxy.clients.presets import setup_text
    base = base_url(cfg["HOST"], cfg["PORT"])
    model = cfg["MODEL"] or "kimi-local"
    lines = [f"kimi-proxy {__version__} serving on {base}", f"  upstream {cfg['UPSTREAM']}",
             f"  client   {cfg['CLIENT']}", ""]
    if cfg.get("RECORD"):
        lines.insert(3, f"  record   {cfg['RECORD']}")
    token = "local"
    if cfg.get("API_KEY"):  # never printed: the banner lands in the journal
        lines.insert(3, "  api key  set (not shown); the lines below read it from $KIMI_API_KEY")
        token = "$KIMI_API_KEY"
    lines.append("Set up a client (copy and paste):")
    lines.extend("  " + line for line in setup_text(base, model, token).splitlines())
    return "\n".join(lines)


def make_server(cfg: dict, app=None) -> NoDelayServer:
    from proxy.app import create_app
    app = app or create_app(cfg)
    return NoDelayServer((cfg["HOST"], cfg["PORT"]), app, handler_class=QuietHandler, log=None,
                         max_connections=cfg["MAX_CONNECTIONS"], idle_timeout_s=cfg["IDLE_TIMEOUT_S"])


def serve_forever(cfg: dict) -> int:
    try:
        server = make_server(cfg)
        server.init_socket()
    except OSError as exc:
        print(f"kimi-proxy: cannot listen on {cfg['HOST']}:{cfg['PORT']}: {exc.strerror}", file=sys.stderr)
        return 1
    print(banner(cfg), flush=True)
    stopping = Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # run in a greenlet of their own, not mid-request
        gevent.signal_handler(sig, stopping.set)
    server.start()
    sd_notify("READY=1")
    stopping.wait()
    sd_notify("STOPPING=1")
    server.drain(cfg["DRAIN_TIMEOUT_S"])
    server.application.extensions["kimi"].close()
    return 0
