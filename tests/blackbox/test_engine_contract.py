"""docs/engine-api.md, checked against the real daemon on the default model."""
import json
import re
import shutil

import pytest

from tests.support.engine import Daemon, UnixConnection, eventually, get, post, stream

HI = [{"role": "user", "content": "Say hello."}]
METRICS = ["kimi_engine_time_to_first_token_seconds", "kimi_engine_decode_tokens_per_second",
           "kimi_engine_queue_depth", "kimi_engine_running_requests",
           "kimi_engine_load_time_seconds", "kimi_engine_requests_total",
           "kimi_engine_prompt_tokens_total", "kimi_engine_generated_tokens_total",
           "kimi_engine_cancelled_requests_total", "kimi_engine_tokens_after_cancel_total",
           "kimi_engine_resident_bytes", "kimi_engine_memory_reserved_bytes"]


@pytest.fixture(scope="module")
def sock(engine_cache):
    daemon = Daemon(engine_cache, "--max-context", "512").start()
    yield daemon.sock
    daemon.stop()
    shutil.rmtree(daemon.dir, ignore_errors=True)


def test_models_and_health(sock):
    models = get(sock, "/v1/models").json()
    (model,) = models["data"]
    assert models["object"] == "list"
    assert set(model) == {"id", "object", "created", "owned_by", "max_model_len", "input_modalities"}
    assert model["input_modalities"] == ["text"]  # kimi-proxy turns images into text for it
    assert model["id"] == "SmolLM2-135M-Instruct" and model["max_model_len"] == 512
    assert get(sock, "/health").json() == {"status": "ok", "model": model["id"]}


def test_non_stream_shape_has_no_foreign_fields(sock):
    resp = post(sock, "/v1/chat/completions", {"model": "gpt-4o", "messages": HI,
                                               "max_tokens": 4, "temperature": 0})
    body = resp.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", body["id"])
    assert re.fullmatch(r"[0-9a-f]{32}", resp.headers["x-request-id"])
    (choice,) = body["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason", "stop_reason"}
    assert choice["logprobs"] is None
    assert set(choice["message"]) == {"role", "content"}  # no reasoning / tool_calls keys
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


def test_stream_event_sequence(sock):
    events = stream(sock, "/v1/chat/completions", {
        "messages": HI, "max_tokens": 5, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    *chunks, usage, done = events
    assert done == "[DONE]"
    assert chunks[0]["choices"][0] == {"index": 0, "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None}
    for chunk in chunks:
        assert set(chunk) == {"id", "object", "created", "model", "choices"}
        assert (chunk["id"], chunk["created"], chunk["model"]) == (
            chunks[0]["id"], chunks[0]["created"], chunks[0]["model"])
        assert chunk["object"] == "chat.completion.chunk"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert usage["choices"] == [] and usage["id"] == chunks[0]["id"]
    without = stream(sock, "/v1/chat/completions",
                     {"messages": HI, "max_tokens": 3, "stream": True})
    assert all(e == "[DONE]" or "usage" not in e for e in without)


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", {"messages": HI}), ("/v1/completions", {"prompt": "One, two,", "echo": True})])
def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(sock, route, body):
    """vLLM's stream_options.continuous_usage_stats (with include_usage, as vLLM reads it) was
    ignored: the usage came in the last chunk only."""
    ask = {**body, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
           "speculative": False, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    *chunks, final, done = stream(sock, route, ask)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert done == "[DONE]" and final["usage"]["completion_tokens"] == 6 == counts[-1]
    assert counts[0] == 0 and counts == sorted(counts) and len(set(counts)) > 2
    assert all(c["usage"]["prompt_tokens"] == final["usage"]["prompt_tokens"] and
               c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
               for c in chunks)
    plain = stream(sock, route, {**ask, "stream_options": {"continuous_usage_stats": True}})
    assert all(e == "[DONE]" or "usage" not in e for e in plain)  # without include_usage: none
    *chunks, final, _ = stream(sock, route, {**ask, "ignore_eos": False, "max_tokens": 400})
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"  # its stop token counts too
    assert chunks[-1]["usage"] == final["usage"]


def test_max_completion_tokens_wins(sock):
    body = post(sock, "/v1/chat/completions", {
        "messages": HI, "max_tokens": 9, "max_completion_tokens": 2, "ignore_eos": True}).json()
    assert body["usage"]["completion_tokens"] == 2
    assert body["choices"][0]["finish_reason"] == "length"


def test_completions_defaults_and_token_id_prompts(sock):
    text = post(sock, "/v1/completions", {"prompt": "Once upon a time", "temperature": 0,
                                          "ignore_eos": True}).json()
    assert text["object"] == "text_completion" and re.fullmatch(r"cmpl-[0-9a-f]{24}", text["id"])
    assert text["usage"]["completion_tokens"] == 16  # the default max_tokens
    ids = post(sock, "/tokenize", {"prompt": "Once upon a time"}).json()["tokens"]
    by_ids = post(sock, "/v1/completions", {"prompt": ids, "temperature": 0,
                                            "ignore_eos": True}).json()
    assert by_ids["choices"][0]["text"] == text["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == len(ids)
    scored = post(sock, "/v1/completions", {"prompt": ids, "max_tokens": 0, "echo": True,
                                            "logprobs": 0}).json()
    logprobs = scored["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(ids) and logprobs["token_logprobs"][0] is None
    assert all(lp < 0 for lp in logprobs["token_logprobs"][1:])


def test_stream_completions(sock):
    events = stream(sock, "/v1/completions", {"prompt": "One, two,", "max_tokens": 6,
                                              "temperature": 0, "stream": True, "echo": True,
                                              "stream_options": {"include_usage": True}})
    *chunks, usage, done = events
    assert done == "[DONE]" and usage["usage"]["completion_tokens"] <= 6
    assert chunks[0]["choices"][0]["text"] == "One, two,"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    whole = post(sock, "/v1/completions", {"prompt": "One, two,", "max_tokens": 6,
                                           "temperature": 0, "echo": True}).json()
    assert streamed == whole["choices"][0]["text"]


def test_tokenize_shapes(sock):
    with_prompt = post(sock, "/tokenize", {"messages": HI}).json()
    without = post(sock, "/tokenize", {"messages": HI, "add_generation_prompt": False}).json()
    assert set(with_prompt) == {"count", "max_model_len", "tokens"}
    assert without["count"] < with_prompt["count"] and with_prompt["max_model_len"] == 512
    strs = post(sock, "/tokenize", {"prompt": "hello world", "return_token_strs": True}).json()
    assert "".join(strs["token_strs"]) == "hello world"
    assert post(sock, "/detokenize", {"tokens": strs["tokens"]}).json() == {
        "prompt": "hello world"}


@pytest.mark.parametrize("method,path,body,status,code", [
    ("GET", "/nowhere", None, 404, "not_found"),
    ("POST", "/v1/models", {}, 405, "method_not_allowed"),
    ("POST", "/v1/chat/completions", {"messages": HI, "max_tokens": 600}, 400,
     "context_length_exceeded"),
    ("POST", "/v1/completions", {"prompt": [999999999]}, 400, None),
])
def test_error_table(sock, method, path, body, status, code):
    conn = UnixConnection(sock, 30)
    conn.request(method, path, json.dumps(body) if body is not None else None)
    resp = conn.getresponse()
    error = json.loads(resp.read())["error"]
    conn.close()
    assert resp.status == status and error["code"] == code
    assert set(error) == {"message", "type", "param", "code"}


def test_keep_alive_and_chunked_request_body(sock):
    conn = UnixConnection(sock, 60)
    try:
        for _ in range(2):  # two requests on one connection
            conn.request("GET", "/health")
            assert conn.getresponse().read() and conn.sock is not None
        body = json.dumps({"prompt": "hello world"}).encode()
        conn.request("POST", "/tokenize", body=iter([body[:5], body[5:]]),
                     headers={"Transfer-Encoding": "chunked"}, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["count"] > 0
    finally:
        conn.close()


def test_metrics_names(sock):
    get(sock, "/v1/models")
    sample = 'kimi_engine_requests_total{route="GET /v1/models",status="200"}'
    assert eventually(lambda: sample in get(sock, "/metrics").text)  # counted after the reply
    text = get(sock, "/metrics").text
    for name in METRICS:
        assert re.search(rf"^{name}(\{{|_bucket|_count| )", text, re.M), name
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if line and not line.startswith("#")}
    assert 50e6 < values["kimi_engine_resident_bytes"] < 2e9
    # idle: only the weights are reserved (the plan's weight bytes: SmolLM2's are 97 MB with
    # the Q8_0 head a CPU with the helper keeps, 124 MB with an fp16 one)
    assert 90e6 < values["kimi_engine_memory_reserved_bytes"] < 200e6


def test_malformed_http_gets_a_json_error(sock):
    import socket as socket_module

    with socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(sock)
        s.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    assert get(sock, "/health").status == 200
