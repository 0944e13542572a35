"""A scripted OpenAI-Chat fake upstream for the proxy tests (and the overhead bench).

    fake = FakeUpstream()
    fake.push(Reply.text("Hello", reasoning="thinking..."))
    with fake.serve() as url:            # a real loopback HTTP/1.1 server thread
        cfg = proxy_config(url, tmp_path)
    services.upstream = fake.client()    # or in-process, no socket at all

Replies are scripted in order (the last one repeats). Every request is kept in
`fake.requests` (payload and headers). Streams use chunked HTTP/1.1 and keep-alive;
`fake.completed` counts streams whose every chunk went out (finish_reason included; what
follows, [DONE] and the chunked terminator, may meet a client already gone), `fake.cancelled`
those whose client went away before.
"""
from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from proxy.errors import UpstreamError, UpstreamUnavailable


@dataclass
class Reply:
    deltas: list = field(default_factory=list)     # delta dicts, one per chunk
    finish: str = "stop"
    usage: dict | None = field(default_factory=lambda: {"prompt_tokens": 7, "completion_tokens": 5,
                                                        "total_tokens": 12})
    status: int = 200                               # >= 400: answer with an error body
    die_after: int | None = None                    # stream: drop the connection after N chunks
    delay_s: float = 0.0                            # pause before each chunk
    extra_choice: dict = field(default_factory=dict)  # e.g. {"stop_reason": "</x>"}
    has_done: bool = True                           # stream: end with `data: [DONE]`
    error_code: str | None = None                   # status >= 400: the error body's `code`
    error_message: str = "scripted failure"         # status >= 400: the error body's `message`
    error_param: str | None = None                  # status >= 400: the error body's `param`
    retry_after: str | None = None                  # status >= 400: a Retry-After header

    @staticmethod
    def text(text: str, reasoning: str = "", size: int = 8, **kw) -> "Reply":
        deltas = [{"reasoning_content": reasoning[i:i + size]} for i in range(0, len(reasoning), size)]
        deltas += [{"content": text[i:i + size]} for i in range(0, len(text), size)]
        return Reply(deltas, **kw)

    @staticmethod
    def tools(calls: list[tuple[str, str, str]], interleave: bool = False, text: str = "", **kw) -> "Reply":
        """calls: (id, name, raw arguments); arguments stream in 2 fragments per call."""
        deltas = [{"content": text}] if text else []
        heads = [{"tool_calls": [{"index": i, "id": cid, "type": "function",
                                  "function": {"name": name, "arguments": ""}}]}
                 for i, (cid, name, _args) in enumerate(calls)]
        halves = [[args[:len(args) // 2], args[len(args) // 2:]] for _c, _n, args in calls]
        frag = lambda i, k: {"tool_calls": [{"index": i, "function": {"arguments": halves[i][k]}}]}  # noqa: E731
        if interleave:
            deltas += heads + [frag(i, 0) for i in range(len(calls))] + [frag(i, 1) for i in range(len(calls))]
        else:
            for i in range(len(calls)):
                deltas += [heads[i], frag(i, 0), frag(i, 1)]
        return Reply(deltas, finish="tool_calls", **kw)

    def chunks(self, model: str) -> list[dict]:
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}
        out = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}]}]
        out += [{**base, "choices": [_streamed(d)], **({"usage": d[USAGE]} if USAGE in d else {})}
                for d in self.deltas]
        out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": self.finish,
                                         **self.extra_choice}]})
        if self.usage:
            out.append({**base, "choices": [], "usage": self.usage})
        return out

    def completion(self, model: str) -> dict:
        msg: dict = {"role": "assistant", "content": None}
        calls: dict[int, dict] = {}
        logprobs = [entry for d in self.deltas for entry in d.get(LOGPROBS, ())]
        for d in self.deltas:
            for key in ("content", "reasoning_content"):
                if key in d:
                    msg[key] = (msg.get(key) or "") + d[key]
            for tc in d.get("tool_calls", []):
                call = calls.setdefault(tc["index"], {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                call["id"] = tc.get("id") or call["id"]
                call["function"]["name"] += tc.get("function", {}).get("name", "")
                call["function"]["arguments"] += tc.get("function", {}).get("arguments", "")
        if calls:
            msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": msg, "finish_reason": self.finish, **self.extra_choice,
                             **({"logprobs": {"content": logprobs}} if logprobs else {})}],
                "usage": self.usage}


LOGPROBS = "_logprobs"  # a delta's key for its tokens' logprobs.content entries (the choice's)
USAGE = "_usage"  # a delta's key for the usage its chunk carries (vLLM's continuous_usage_stats)


def _streamed(delta: dict) -> dict:
    """A stream chunk's choice for one scripted delta."""
    logprobs = delta.get(LOGPROBS)
    choice = {"index": 0, "delta": {k: v for k, v in delta.items() if k not in (LOGPROBS, USAGE)},
              "finish_reason": None}
    return {**choice, "logprobs": {"content": logprobs}} if logprobs else choice


class FakeUpstream:
    def __init__(self, *replies: Reply, tokenize: bool = True):
        self.script = list(replies) or [Reply.text("Hello from the fake.")]
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.cancelled = 0
        self.completed = 0
        self.has_tokenize = tokenize
        self.is_json_only = False  # answer streaming requests with JSON, as some servers do
        self.max_model_len: int | None = None  # GET /v1/models reports it when set
        self.input_modalities: list | None = None  # and this (kimi-engine's ["text"])
        self._lock = threading.Lock()

    def count(self, outcome: str) -> None:
        """Streams end on server threads: count under the lock ("completed" or "cancelled")."""
        with self._lock:
            setattr(self, outcome, getattr(self, outcome) + 1)

    def push(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def next_reply(self, payload: dict, headers: dict) -> Reply:
        with self._lock:
            self.requests.append(payload)
            self.headers.append(headers)
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    @contextlib.contextmanager
    def serve(self):
        server = _Server(("127.0.0.1", 0), _handler_for(self))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/v1"
        finally:
            server.shutdown()
            server.server_close()

    @contextlib.contextmanager
    def serve_unix(self, path: str):
        """The same server on a Unix socket (like the engine); yields the unix:// URL."""
        server = _UnixServer(path, _handler_for(self))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"unix://{path}"
        finally:
            server.shutdown()
            server.server_close()

    def client(self) -> "InProcessClient":
        return InProcessClient(self)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def get_request(self):
        sock, addr = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, addr


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):
        sock, _addr = super().get_request()
        return sock, ("unix", 0)


def _handler_for(fake: FakeUpstream):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send_json(self, status: int, body, headers: dict | None = None) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            model = {"id": "fake", "object": "model"}
            if fake.max_model_len:
                model["max_model_len"] = fake.max_model_len
            if fake.input_modalities is not None:
                model["input_modalities"] = fake.input_modalities
            self._send_json(200, {"object": "list", "data": [model]})

        def do_POST(self):
            payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/tokenize":
                if not fake.has_tokenize:
                    return self._send_json(404, {"error": "not found"})
                return self._send_json(200, {"count": 42, "max_model_len": 8192})
            reply = fake.next_reply(payload, dict(self.headers))
            model = payload.get("model", "fake")
            if reply.status >= 400:
                error = {"message": reply.error_message, "type": "x", "param": reply.error_param,
                         "code": reply.error_code}
                headers = {"Retry-After": reply.retry_after} if reply.retry_after else None
                return self._send_json(reply.status, {"error": error}, headers)
            if not payload.get("stream") or fake.is_json_only:
                return self._send_json(200, reply.completion(model))
            self._stream(reply, model)

        def _stream(self, reply: Reply, model: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for i, chunk in enumerate(reply.chunks(model)):
                    if reply.die_after is not None and i >= reply.die_after:
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    if reply.delay_s:
                        time.sleep(reply.delay_s)
                    self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
            except (BrokenPipeError, ConnectionResetError):
                fake.count("cancelled")
                self.close_connection = True
                return
            # Every chunk is out, finish_reason included: the stream is complete. A client
            # that stops reading now (the proxy relays the end once it has the finish, and a
            # proxy draining on SIGTERM may exit before [DONE]) cancelled nothing.
            fake.count("completed")
            try:
                if reply.has_done:
                    self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


class InProcessClient:
    """Duck-types proxy.upstream.client.Upstream without any socket. It answers no GET
    /v1/models (served_info {}, no max_model_len), so requests keep the client's model name;
    FakeUpstream.serve's socket server answers it."""

    max_model_len = None

    def served_info(self) -> dict:
        return {}

    def __init__(self, fake: FakeUpstream):
        self.fake = fake
        self.url = "fake://in-process"
        self.is_down = False

    def chat(self, payload: dict, headers: dict | None = None, cancel=None) -> dict:
        reply = self._reply(payload, headers)
        return reply.completion(payload.get("model", "fake"))

    def open_stream(self, payload: dict, headers: dict | None = None, cancel=None):
        reply = self._reply(payload, headers)
        return _InProcessStream(self.fake, reply, payload.get("model", "fake"))

    def _reply(self, payload, headers) -> Reply:
        if self.is_down:
            raise UpstreamUnavailable("cannot reach the upstream at fake://: refused")
        reply = self.fake.next_reply(json.loads(json.dumps(payload)), dict(headers or {}))
        if reply.status >= 400:
            raise UpstreamError(f"upstream returned {reply.status}: scripted failure", status=reply.status)
        return reply

    def tokenize(self, messages, tools, model):
        return 42 if self.fake.has_tokenize else None

    def health(self):
        return (not self.is_down), "in-process"

    def close(self):
        pass


class _InProcessStream:
    def __init__(self, fake, reply: Reply, model: str):
        self.fake, self.reply, self.model = fake, reply, model
        self.is_closed = False
        self.is_finished = False

    def __iter__(self):
        try:
            for i, chunk in enumerate(self.reply.chunks(self.model)):
                if self.reply.die_after is not None and i >= self.reply.die_after:
                    raise UpstreamError("upstream closed the stream before it finished")
                yield chunk
            self.is_finished = True
            self.fake.count("completed")
        finally:
            self.close()

    def close(self):
        if not self.is_closed and not self.is_finished:
            self.fake.count("cancelled")
        self.is_closed = True


def proxy_config(upstream_url: str, tmp_path, **overrides) -> dict:
    """A validated proxy config for tests: temp ledger, no env, no config file."""
    from proxy import config
    cli = {"UPSTREAM": upstream_url, "LEDGER": str(tmp_path / "ledger.sqlite"), **overrides}
    return config.load(cli, environ={})


@contextlib.contextmanager
def serve_app(app):
    """Serve a WSGI app on a real loopback port from a thread; yields the base URL."""
    from werkzeug.serving import make_server
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
