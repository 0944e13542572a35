"""The proxy learns each server's context and counts the prompt with its /tokenize, so a prompt
that cannot fit gets the client's overflow error before it is sent, and a max_tokens that cannot
fit is lowered (issue 28, item 1). Servers scripted over real HTTP, as their sources answer:

    vLLM       GET /v1/models -> max_model_len; POST /tokenize {model, messages} -> {count,
               max_model_len, tokens}; a prompt that does not fit: 400, BadRequestError with
               param input_tokens
    llama.cpp  GET /v1/models -> owned_by "llamacpp" and meta.n_ctx_train (not the served
               context); GET /props -> default_generation_settings.n_ctx; POST /apply-template
               {messages} -> {prompt}; POST /tokenize {content} -> {tokens}; a prompt that does
               not fit: 400, exceed_context_size_error
    SGLang     its /tokenize takes no messages (the count stays unknown); in a stream it already
               began, an overflow comes as a `data: {"error": ...}` event
"""
import contextlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from proxy import sse
from proxy.app import create_app
from tests.support.proxy_fakes import proxy_config

ANTH = {"model": "k3", "max_tokens": 32000, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "k3", "max_tokens": 32000, "messages": [{"role": "user", "content": "hi"}]}
RESP = {"model": "k3", "max_output_tokens": 32000, "input": "hi"}
ROUTES = {"/v1/messages": ANTH, "/v1/chat/completions": CHAT, "/v1/responses": RESP}
LATER = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def count(messages) -> int:
    """The fake's tokenizer: 1 token per 4 bytes of the messages, plus 10 for the template."""
    return len(json.dumps(messages)) // 4 + 10


class Server:
    """One scripted server of `kind` with a context of `n_ctx` tokens."""

    def __init__(self, kind: str, n_ctx: int):
        self.kind, self.n_ctx = kind, n_ctx
        self.chats: list[dict] = []
        self.paths: list[str] = []

    def get(self, path: str):
        if path == "/v1/models" and self.kind == "llama.cpp":
            return 200, {"object": "list", "data": [{"id": "k3.gguf", "object": "model", "owned_by": "llamacpp",
                                                     "meta": {"n_ctx_train": 131072, "n_vocab": 163840}}]}
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "k3", "object": "model", "max_model_len": self.n_ctx}]}
        if path == "/props" and self.kind == "llama.cpp":
            return 200, {"default_generation_settings": {"n_ctx": self.n_ctx, "params": {}}, "total_slots": 1}
        return 404, {"detail": "Not Found"}

    def post(self, path: str, body: dict):
        if path == "/tokenize" and self.kind == "vllm":
            n = count(body["messages"])
            return 200, {"count": n, "max_model_len": self.n_ctx, "tokens": [1] * n, "token_strs": None}
        if path == "/apply-template" and self.kind == "llama.cpp":
            return 200, {"prompt": json.dumps(body["messages"])}
        if path == "/tokenize" and self.kind == "llama.cpp":
            return 200, {"tokens": [1] * (len(body["content"]) // 4 + 10)}
        if path == "/tokenize":  # SGLang: {model, prompt} only
            return 400, {"object": "error", "message": "1 validation error: prompt Field required",
                         "type": "BadRequest", "param": None, "code": 400}
        if path != "/v1/chat/completions":
            return 404, {"detail": "Not Found"}
        self.chats.append(body)
        n = count(body["messages"])
        if n + 1 > self.n_ctx:
            return 400, self.overflow(n)
        return 200, None

    def overflow(self, n: int) -> dict:
        if self.kind == "vllm":
            return {"error": {"message": f"This model's maximum context length is {self.n_ctx} tokens. However, "
                                         f"your prompt contains at least {n} input tokens. Please reduce the length "
                                         f"of the input prompt. (parameter=input_tokens, value={n})",
                              "type": "BadRequestError", "param": "input_tokens", "code": 400}}
        if self.kind == "llama.cpp":
            return {"error": {"code": 400, "message": f"request ({n} tokens) exceeds the available context size "
                                                      f"({self.n_ctx} tokens), try increasing it",
                              "type": "exceed_context_size_error", "n_prompt_tokens": n, "n_ctx": self.n_ctx}}
        return {"object": "error", "message": f"The input ({n} tokens) is longer than the model's context "
                                              f"length ({self.n_ctx} tokens).",
                "type": "BadRequest", "param": None, "code": 400}


def _handler(server: Server):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status: int, body: dict | None, stream: bool = False) -> None:
            if stream:  # SGLang: the status line went out before the prompt was checked
                raw = b"data: %s\n\ndata: [DONE]\n\n" % json.dumps({"error": body}).encode()
            elif body is None:
                raw = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "k3",
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "ok"}}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
            else:
                raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            server.paths.append(self.path)
            self._send(*server.get(self.path))

        def do_POST(self):
            server.paths.append(self.path)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, answer = server.post(self.path, body)
            if server.kind == "sglang" and status == 400 and body.get("stream"):
                return self._send(200, answer, stream=True)
            self._send(status, answer)

    return Handler


@contextlib.contextmanager
def proxy_for(tmp_path, server: Server):
    http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{http.server_address[1]}/v1"
        yield create_app(proxy_config(url, tmp_path)).test_client()
    finally:
        http.shutdown()
        http.server_close()


def big(body: dict, route: str, n_bytes: int, later: bool = False) -> dict:
    text = "word " * (n_bytes // 5)
    if route == "/v1/responses":
        items = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}] if later else []
        return {**body, "input": [*items, {"role": "user", "content": text}]}
    return {**body, "messages": [*(LATER if later else []), {"role": "user", "content": text}]}


def error_of(resp, stream: bool) -> dict:
    if resp.status_code != 200:
        return resp.get_json()["error"]
    frames = [(e, json.loads(d)) for e, d in sse.parse_frames(resp.get_data()) if d != "[DONE]"]
    last = next(d for e, d in reversed(frames) if e in ("error", "response.failed") or "error" in d)
    return last["response"]["error"] if "response" in last else last["error"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("kind", ["vllm", "llama.cpp"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_prompt_that_cannot_fit_is_the_overflow_error_before_it_is_sent(tmp_path, kind, route, stream):
    server = Server(kind, n_ctx=4096)
    with proxy_for(tmp_path, server) as client:
        for later in (False, True):
            resp = client.post(route, json=big({**ROUTES[route], "stream": stream}, route, 40000, later))
            assert resp.status_code == 400, resp.get_data(as_text=True)
            error = resp.get_json()["error"]
            if route == "/v1/messages":  # the API's wording, which Claude Code compacts on, after a reply
                head = error["message"].split(". ", 1)[0]
                assert (re.fullmatch(r"prompt is too long: \d+ tokens > 4096 maximum", head) is not None) is later
            else:
                assert error["code"] == "context_length_exceeded", error
            assert "4096 tokens" in error["message"] and "Kimi-Linear" in error["message"]
    assert server.chats == []  # never sent


def test_llama_cpps_context_and_count_lower_a_max_tokens_that_cannot_fit(tmp_path):
    """Its context is in /props, not /v1/models; its /tokenize counts text: the template's."""
    server = Server("llama.cpp", n_ctx=4096)
    with proxy_for(tmp_path, server) as client:
        body = big(CHAT, "/v1/chat/completions", 8000)  # ~2000 tokens: fits, 32000 more does not
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        sent = server.chats[-1]
        assert sent["max_tokens"] == 4096 - count(sent["messages"])
        small = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 100})
        assert small.status_code == 200 and server.chats[-1]["max_tokens"] == 100
    assert server.paths.count("/v1/models") == server.paths.count("/props") == 1  # learnt once
    assert server.paths.count("/tokenize") == 1  # the small request was not counted


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_sglangs_own_overflow_reaches_the_client_as_its_overflow(tmp_path, route, stream):
    """SGLang cannot count messages for us: its own refusal (a flat body, or an event inside a
    stream it began) is the client's overflow error."""
    server = Server("sglang", n_ctx=4096)
    with proxy_for(tmp_path, server) as client:
        resp = client.post(route, json=big({**ROUTES[route], "stream": stream}, route, 40000, later=True))
        error = error_of(resp, stream)
    assert len(server.chats) == 1
    if route == "/v1/messages":
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("prompt is too long: "), error
        assert " tokens > 4096 maximum. " in error["message"]
    else:
        assert error["code"] == "context_length_exceeded", error
    assert "Kimi-Linear" in error["message"]
