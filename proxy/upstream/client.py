"""The upstream client: the engine on a Unix socket, or any OpenAI-compatible server.

URLs: `unix:///path/engine.sock` (API under /v1, tokenizer at the root) or
`http(s)://host:port/v1`. Built on plain sockets (proxy.http11), so under the proxy's
gevent patching every socket call is cooperative. Keep-alive connections are pooled; streamed bodies
are forwarded per read (no coalescing); closing a stream closes its socket, which
cancels the engine request. TCP_NODELAY is set on every TCP socket; a Unix socket served by
another user is refused (proxy.upstream.peer).
"""
from __future__ import annotations

import socket
import ssl
import threading
from urllib.parse import urlsplit

from proxy import fastjson
from proxy.errors import ClientGone, ContextTooLong, ProxyError, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from proxy.upstream import context
from proxy.upstream.http11 import Connection, Response
from proxy.upstream.peer import UntrustedUpstream, check_peer
from proxy.upstream.status import mark_turn, status_error as _status_error
from proxy.upstream.stream import Cancel, ListStream, Stream

__all__ = ["Cancel", "ListStream", "Stream", "Target", "Upstream"]


class Target:
    """A parsed upstream URL: how to connect, the API prefix and the server root."""

    def __init__(self, url: str, engine_uid: int | None = None):
        parts = urlsplit(url)
        self.url = url
        self.engine_uid = engine_uid  # trusted behind a unix:// socket, besides ours and root
        self.scheme = parts.scheme
        if parts.scheme == "unix":
            self.unix_path = parts.path
            self.api_prefix = "/v1"
            self.root_prefix = ""
        elif parts.scheme in ("http", "https"):
            self.host = parts.hostname or "127.0.0.1"
            self.port = parts.port or (443 if parts.scheme == "https" else 80)
            self.api_prefix = parts.path.rstrip("/")
            self.root_prefix = self.api_prefix[:-3] if self.api_prefix.endswith("/v1") else ""
        else:
            raise ValueError(f"upstream URL must be unix:///path or http(s)://host:port/v1, got {url!r}")

    def connect(self, timeout: float) -> socket.socket:
        if self.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(self.unix_path)
                check_peer(sock, self.unix_path, self.engine_uid)
            except (OSError, UntrustedUpstream):
                sock.close()
                raise
            return sock
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        return sock


class Upstream:
    """A pooled client for one upstream. Thread- and greenlet-safe."""

    def __init__(self, url: str, *, timeout_s: float = 600.0, connect_timeout_s: float = 10.0,
                 api_key: str | None = None, pool_size: int = 64, engine_uid: int | None = None):
        self.target = Target(url, engine_uid)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.api_key = api_key
        self.pool_size = pool_size
        self._idle: list = []
        self._lock = threading.Lock()
        self.max_model_len: int | None = None  # learnt from served_info or an overflow error
        self.is_llama_cpp = False  # llama-server: its context in /props, its /tokenize takes text

    @property
    def url(self) -> str:
        return self.target.url

    # -- connections -------------------------------------------------------------------
    def _acquire(self) -> tuple[Connection, bool]:
        """A live idle connection, else a new one. An idle connection the upstream closed
        (it restarted, or timed it out) reads as EOF: it is dropped here, before any use."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._new_connection(), False
            if conn.is_idle_alive():
                return conn, True
            conn.close()

    def _new_connection(self) -> Connection:
        return Connection(lambda: self.target.connect(self.connect_timeout_s), self.timeout_s)

    def _drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _release(self, conn: Connection) -> None:
        with self._lock:
            if len(self._idle) < self.pool_size and not conn.buf:
                self._idle.append(conn)
                return
        conn.close()

    def _send(self, method: str, path: str, body: bytes | None, headers: dict,
              cancel: Cancel | None = None) -> tuple[Connection, Response]:
        """Send one request. A pooled connection that fails before the request can have
        reached the upstream (the write failed, or the upstream reset it unread) means the
        pool is stale: it is emptied and the request is sent once more, on a new connection."""
        conn, reused = self._acquire()
        for attempt in (0, 1):
            is_sent = False
            try:
                if cancel is not None:
                    cancel.attach(conn)
                conn.open()
                conn.send_request(method, path, headers, body)
                is_sent = True
                return conn, conn.read_response()
            except ProxyError:
                conn.close()
                raise
            except OSError as exc:
                conn.close()
                if cancel is not None and cancel.is_cancelled:
                    raise ClientGone("the client closed its connection") from exc
                if reused and attempt == 0 and (not is_sent or isinstance(exc, ConnectionResetError)):
                    self._drop_idle()
                    conn, reused = self._new_connection(), False
                    continue
                raise self._transport_error(exc) from exc
        raise AssertionError("unreachable")

    def _transport_error(self, exc: OSError) -> ProxyError:
        if isinstance(exc, TimeoutError):
            return UpstreamTimeout(f"upstream at {self.url} timed out: {exc}")
        return UpstreamUnavailable(f"cannot reach the upstream at {self.url}: {exc}")

    def _headers(self, extra: dict | None, stream: bool = False) -> dict:
        headers = {"Content-Type": "application/json",
                   "Accept": "text/event-stream" if stream else "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        headers.update(extra or {})
        return headers

    # -- calls -------------------------------------------------------------------------
    def request_json(self, method: str, path: str, body: dict | None = None,
                     headers: dict | None = None, cancel: Cancel | None = None) -> tuple[int, object]:
        status, data, _headers = self._request(method, path, body, headers, cancel)
        return status, data

    def _request(self, method: str, path: str, body: dict | None, headers: dict | None,
                 cancel: Cancel | None) -> tuple[int, object, dict]:
        raw = None if body is None else fastjson.dumps(body)
        conn, resp = self._send(method, path, raw, self._headers(headers), cancel)
        try:
            data = resp.read()
        except OSError as exc:
            conn.close()
            if cancel is not None and cancel.is_cancelled:
                raise ClientGone("the client closed its connection") from exc
            raise UpstreamError(f"upstream broke while answering: {exc}") from exc
        if cancel is not None:
            cancel.detach()
        if resp.will_close:
            conn.close()
        else:
            self._release(conn)
        try:
            return resp.status, fastjson.loads(data) if data else None, resp.headers
        except ValueError:
            return resp.status, data.decode("utf-8", "replace"), resp.headers

    def chat(self, payload: dict, headers: dict | None = None, cancel: Cancel | None = None) -> dict:
        status, body, resp_headers = self._request("POST", self.target.api_prefix + "/chat/completions",
                                                   payload, headers, cancel)
        if status >= 400:
            raise self.refused(status, body, resp_headers, payload)
        if not isinstance(body, dict):
            raise UpstreamError("upstream answered with a body that is not a JSON object")
        return body

    def open_stream(self, payload: dict, headers: dict | None = None, cancel: Cancel | None = None) -> Stream:
        """POST a streaming request; returns once the upstream sent its status line."""
        raw = fastjson.dumps(payload)
        conn, resp = self._send("POST", self.target.api_prefix + "/chat/completions", raw,
                                self._headers(headers, stream=True), cancel)
        if resp.status >= 400:
            try:
                data = resp.read()
            except OSError:
                data = b""
            conn.close()
            try:
                body = fastjson.loads(data)
            except ValueError:
                body = data.decode("utf-8", "replace")
            raise self.refused(resp.status, body, resp.headers, payload)
        if (resp.getheader("Content-Type") or "").startswith("application/json"):
            if cancel is not None:
                cancel.detach()
            return self._json_as_stream(conn, resp)  # a server that ignored stream:true
        return Stream(self, conn, resp, cancel, payload.get("messages"))

    def refused(self, status: int, body, headers: dict, payload: dict) -> ProxyError:
        """The upstream's error as a typed one; an overflow also teaches the context it names."""
        err = _status_error(status, body, headers, self.max_model_len)
        if isinstance(err, ContextTooLong):
            self.max_model_len = self.max_model_len or err.maximum
            mark_turn(err, payload.get("messages"))
        return err

    def _json_as_stream(self, conn, resp) -> "ListStream":
        from proxy.pipeline import chunks_from_json
        try:
            body = fastjson.loads(resp.read())
        except (ValueError, OSError) as exc:
            conn.close()
            raise UpstreamError(f"upstream sent a bad JSON body: {exc}") from exc
        self._release(conn) if not resp.will_close else conn.close()
        if not isinstance(body, dict):
            raise UpstreamError("upstream answered with a body that is not a JSON object")
        return ListStream(chunks_from_json(body))

    def tokenize(self, messages: list, tools: list | None, model: str) -> int | None:
        """The upstream's own count of the prompt (proxy.upstream.context), or None."""
        return context.count_prompt(self, messages, tools, model)

    def served_model(self) -> str | None:
        """The upstream's own model name (first of GET /v1/models), or None."""
        return self.served_info().get("id")

    def served_info(self) -> dict:
        """{"id", "max_model_len"} of the upstream's first model (vLLM's shape; llama-server's
        context from /props, and "is_llama_cpp": True); "text_only": True where the model reads
        no images (kimi-engine's card: input_modalities ["text"]; llama-server's /props:
        modalities.vision false); {} if unknown."""
        try:
            status, body = self.request_json("GET", self.target.api_prefix + "/models")
        except Exception:  # noqa: BLE001 - no answer: the caller keeps the client's name
            return {}
        data = body.get("data") if isinstance(body, dict) and status < 400 else None
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        info = {k: first[k] for k, kind in (("id", str), ("max_model_len", int))
                if isinstance(first.get(k), kind)}
        modalities = first.get("input_modalities")  # kimi-engine's: ["text"]
        if isinstance(modalities, list) and "image" not in modalities:
            info["text_only"] = True
        self.is_llama_cpp = context.is_llama_cpp(first)
        if self.is_llama_cpp:
            info["is_llama_cpp"] = True
            try:
                props = context.llama_cpp_props(self)
            except Exception:  # noqa: BLE001 - no context known: requests go as they are
                props = {}
            info = {**props, **info}
        self.max_model_len = info.get("max_model_len", self.max_model_len)
        return info

    def health(self) -> tuple[bool, str]:
        try:
            status, _ = self.request_json("GET", self.target.api_prefix + "/models")
        except Exception as exc:  # noqa: BLE001 - health reports every failure as text
            return False, str(exc)
        return status < 400, f"HTTP {status}"

    def close(self):
        self._drop_idle()
