"""The upstream client: the engine on a Unix socket, or any OpenAI-compatible server.

URLs: `unix:///path/engine.sock` (API under /v1, tokenizer at the root) or
`http(s)://host:port/v1`. Built on plain sockets (proxy.http11), so under the proxy's
gevent patching every socket call is cooperative. Keep-alive connections are pooled; streamed bodies
are forwarded per read (no coalescing); closing a stream closes its socket, which
cancels the engine request. TCP_NODELAY is set on every TCP socket.
"""
from __future__ import annotations

import json
import socket
import ssl
import threading
from urllib.parse import urlsplit

from proxy import sse
from proxy.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable
from proxy.upstream.http11 import Connection, Response


class Target:
    """A parsed upstream URL: how to connect, the API prefix and the server root."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.url = url
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
            except OSError:
                sock.close()
                raise
            return sock
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        return sock


class Stream:
    """An open streamed upstream response: iterate for chunk dicts; close() cancels."""

    def __init__(self, upstream: "Upstream", conn, resp):
        self._upstream, self._conn, self._resp = upstream, conn, resp
        self._done = False

    def __iter__(self):
        dec = sse.Decoder()
        pieces = self._resp.pieces()
        try:
            while True:
                try:
                    data = next(pieces, b"")
                except OSError as exc:
                    raise UpstreamError(f"upstream stream broke: {exc}") from exc
                frames = dec.feed(data) if data else dec.flush()
                for _event, payload in frames:
                    if payload.strip() == "[DONE]":
                        self._done = True
                        return
                    yield _decode_chunk(payload)
                if not data:
                    raise UpstreamError("upstream closed the stream before it finished")
        finally:
            self.close()

    def close(self):
        """Release a finished connection; abort an unfinished one (cancels the engine request)."""
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if self._done and not self._resp.will_close:
            try:  # drain the terminating chunk so the connection can be reused
                self._resp.read()
                self._upstream._release(conn)
                return
            except OSError:
                pass
        conn.close()


class ListStream(list):
    """Chunks already in hand, with the Stream interface."""

    def close(self):
        pass


def _decode_chunk(payload: str) -> dict:
    try:
        chunk = json.loads(payload)
    except ValueError as exc:
        raise UpstreamError(f"upstream sent a chunk that is not JSON: {payload[:200]!r}") from exc
    if not isinstance(chunk, dict):
        raise UpstreamError("upstream sent a chunk that is not a JSON object")
    if "error" in chunk and not chunk.get("choices"):
        err = chunk["error"]
        msg = err.get("message") if isinstance(err, dict) else str(err)
        raise UpstreamError(f"upstream error mid-stream: {msg}")
    return chunk


class Upstream:
    """A pooled client for one upstream. Thread- and greenlet-safe."""

    def __init__(self, url: str, *, timeout_s: float = 600.0, connect_timeout_s: float = 10.0,
                 api_key: str | None = None, pool_size: int = 64):
        self.target = Target(url)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.api_key = api_key
        self.pool_size = pool_size
        self._idle: list = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.target.url

    # -- connections -------------------------------------------------------------------
    def _acquire(self) -> tuple[Connection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return Connection(lambda: self.target.connect(self.connect_timeout_s), self.timeout_s), False

    def _release(self, conn: Connection) -> None:
        with self._lock:
            if len(self._idle) < self.pool_size and not conn.buf:
                self._idle.append(conn)
                return
        conn.close()

    def _send(self, method: str, path: str, body: bytes | None, headers: dict) -> tuple[Connection, Response]:
        """Send one request; retry once on a stale pooled connection."""
        for attempt in (0, 1):
            conn, reused = self._acquire()
            try:
                conn.open()
                conn.send_request(method, path, headers, body)
                return conn, conn.read_response()
            except (ConnectionRefusedError, FileNotFoundError) as exc:
                conn.close()
                raise UpstreamUnavailable(f"cannot reach the upstream at {self.url}: {exc}") from exc
            except TimeoutError as exc:
                conn.close()
                raise UpstreamTimeout(f"upstream at {self.url} timed out: {exc}") from exc
            except OSError as exc:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise UpstreamUnavailable(f"cannot reach the upstream at {self.url}: {exc}") from exc
        raise AssertionError("unreachable")

    def _headers(self, extra: dict | None, stream: bool = False) -> dict:
        headers = {"Content-Type": "application/json",
                   "Accept": "text/event-stream" if stream else "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        headers.update(extra or {})
        return headers

    # -- calls -------------------------------------------------------------------------
    def request_json(self, method: str, path: str, body: dict | None = None,
                     headers: dict | None = None) -> tuple[int, object]:
        raw = None if body is None else json.dumps(body).encode()
        conn, resp = self._send(method, path, raw, self._headers(headers))
        try:
            data = resp.read()
        except OSError as exc:
            conn.close()
            raise UpstreamError(f"upstream broke while answering: {exc}") from exc
        if resp.will_close:
            conn.close()
        else:
            self._release(conn)
        try:
            return resp.status, json.loads(data) if data else None
        except ValueError:
            return resp.status, data.decode("utf-8", "replace")

    def chat(self, payload: dict, headers: dict | None = None) -> dict:
        status, body = self.request_json("POST", self.target.api_prefix + "/chat/completions",
                                         payload, headers)
        if status >= 400:
            raise _status_error(status, body)
        if not isinstance(body, dict):
            raise UpstreamError("upstream answered with a body that is not a JSON object")
        return body

    def open_stream(self, payload: dict, headers: dict | None = None) -> Stream:
        """POST a streaming request; returns once the upstream sent its status line."""
        raw = json.dumps(payload).encode()
        conn, resp = self._send("POST", self.target.api_prefix + "/chat/completions", raw,
                                self._headers(headers, stream=True))
        if resp.status >= 400:
            try:
                data = resp.read()
            except OSError:
                data = b""
            conn.close()
            try:
                body = json.loads(data)
            except ValueError:
                body = data.decode("utf-8", "replace")
            raise _status_error(resp.status, body)
        if (resp.getheader("Content-Type") or "").startswith("application/json"):
            return self._json_as_stream(conn, resp)  # a server that ignored stream:true
        return Stream(self, conn, resp)

    def _json_as_stream(self, conn, resp) -> "ListStream":
        from proxy.pipeline import chunks_from_json
        try:
            body = json.loads(resp.read())
        except (ValueError, OSError) as exc:
            conn.close()
            raise UpstreamError(f"upstream sent a bad JSON body: {exc}") from exc
        self._release(conn) if not resp.will_close else conn.close()
        if not isinstance(body, dict):
            raise UpstreamError("upstream answered with a body that is not a JSON object")
        return ListStream(chunks_from_json(body))

    def tokenize(self, messages: list, tools: list | None, model: str) -> int | None:
        """The upstream's real token count via root /tokenize, or None if it has none."""
        body = {"model": model, "messages": messages}
        if tools:
            body["tools"] = tools
        status, data = self.request_json("POST", self.target.root_prefix + "/tokenize", body)
        if status >= 400 or not isinstance(data, dict):
            return None
        if isinstance(data.get("count"), int):
            return data["count"]
        tokens = data.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    def served_model(self) -> str | None:
        """The upstream's own model name (first of GET /v1/models), or None."""
        return self.served_info().get("id")

    def served_info(self) -> dict:
        """{"id", "max_model_len"} of the upstream's first model (vLLM's shape); {} if unknown."""
        try:
            status, body = self.request_json("GET", self.target.api_prefix + "/models")
        except Exception:  # noqa: BLE001 - no answer: the caller keeps the client's name
            return {}
        data = body.get("data") if isinstance(body, dict) and status < 400 else None
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        return {k: first[k] for k, kind in (("id", str), ("max_model_len", int))
                if isinstance(first.get(k), kind)}

    def health(self) -> tuple[bool, str]:
        try:
            status, _ = self.request_json("GET", self.target.api_prefix + "/models")
        except Exception as exc:  # noqa: BLE001 - health reports every failure as text
            return False, str(exc)
        return status < 400, f"HTTP {status}"

    def close(self):
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _status_error(status: int, body) -> UpstreamError:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        detail = body["error"].get("message") or json.dumps(body["error"])
    else:
        detail = body if isinstance(body, str) else json.dumps(body)
    err = UpstreamError(f"upstream returned {status}: {str(detail)[:500]}", status=status)
    if status == 400:
        err.type = "invalid_request_error"
    elif status in (502, 503, 504):
        return UpstreamUnavailable(f"upstream returned {status}: {str(detail)[:500]}")
    return err
