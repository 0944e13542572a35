"""The engine's response shaping with a scripted model (real tokenizer and chat template):
tool calls, reasoning, stop strings, logprobs and model failures, exactly."""
import json

import pytest

from tests.support.engine import InProcessEngine, ScriptedModel, get, post, stream

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def text_side(default_gguf, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "engine-cache"))
        from engined.chat import load_text

        return load_text(default_gguf)


@pytest.fixture(scope="module")
def scripted(text_side):
    tokenizer, chat = text_side
    model = ScriptedModel(tokenizer.vocab_size)
    with InProcessEngine(model, tokenizer, chat) as engine:
        engine.model, engine.tokenizer = model, tokenizer
        yield engine


def script(engine, text: str, end: bool = True, fail_at=None):
    end_id = engine.tokenizer.token_to_id("<|im_end|>")
    engine.model.script = engine.tokenizer.encode(text, allow_special=False) + ([end_id] if end else [])
    engine.model.fail_at = fail_at
    return len(engine.model.script)


def chat(engine, **fields):
    resp = post(engine.sock, "/v1/chat/completions", {"messages": ASK, **fields}, timeout=30)
    assert resp.status == 200, resp.body
    return resp.json()


def test_tool_call_becomes_native_tool_calls(scripted):
    script(scripted, CALL)
    body = chat(scripted, tools=TOOLS)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_streamed_tool_call(scripted):
    script(scripted, CALL)
    events = stream(scripted.sock, "/v1/chat/completions",
                    {"messages": ASK, "tools": TOOLS, "stream": True})
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Paris"}'
    assert not any(d.get("content") for d in deltas)  # no markup leaks as text
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_without_tools_the_markup_is_plain_content(scripted):
    script(scripted, CALL)
    choice = chat(scripted)["choices"][0]
    assert choice["message"]["content"] == CALL and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    script(scripted, CALL)
    choice = chat(scripted, tools=TOOLS, tool_choice="none")["choices"][0]
    assert choice["message"]["content"] == CALL and choice["finish_reason"] == "stop"


def test_reasoning_goes_to_reasoning_content(scripted):
    script(scripted, "<think>Paris is in France.</think>It is sunny.")
    message = chat(scripted)["choices"][0]["message"]
    assert message["reasoning_content"] == "Paris is in France."
    assert message["content"] == "It is sunny."
    script(scripted, "<think>Paris is in France.</think>It is sunny.")
    events = stream(scripted.sock, "/v1/chat/completions", {"messages": ASK, "stream": True})
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Paris is in France."
    assert "".join(d.get("content", "") for d in deltas) == "It is sunny."


def test_stop_string_is_trimmed_and_stops_generation(scripted):
    num_script = script(scripted, "Hello there END and much more text here")
    body = chat(scripted, stop=["END"])
    assert body["choices"][0]["message"]["content"] == "Hello there "
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["stop_reason"] == "END"  # vLLM's field; the proxy reads it
    assert body["usage"]["completion_tokens"] < num_script - 4
    script(scripted, "Hello there END and much more text here")
    events = stream(scripted.sock, "/v1/chat/completions",
                    {"messages": ASK, "stop": ["STOP", "END"], "stream": True})
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == "Hello there "
    assert [e["choices"][0].get("stop_reason") for e in events[:-1]
            if e["choices"][0]["finish_reason"]] == ["END"]


def test_stop_reason_is_null_when_the_template_end_stops(scripted):
    script(scripted, "Just this.")
    assert chat(scripted, stop=["END"])["choices"][0]["stop_reason"] is None


def test_length_and_usage(scripted):
    script(scripted, "one two three four five six seven eight", end=False)
    body = chat(scripted, max_tokens=3)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3
    counted = post(scripted.sock, "/tokenize", {"messages": ASK}).json()["count"]
    assert body["usage"]["prompt_tokens"] == counted


def test_chat_logprobs(scripted):
    num_script = script(scripted, "Sunny and warm.")
    body = chat(scripted, logprobs=True, top_logprobs=2)
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == num_script - 1  # every token but the end-of-turn
    assert "".join(e["token"] for e in entries) == "Sunny and warm."
    for e in entries:
        assert e["logprob"] == pytest.approx(0.0, abs=1e-3)
        assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"]
        assert bytes(e["bytes"]).decode() == e["token"]


def test_model_failure_is_an_error_and_the_engine_keeps_serving(scripted):
    script(scripted, "Hello there friend", fail_at=2)
    resp = post(scripted.sock, "/v1/chat/completions", {"messages": ASK}, timeout=30)
    assert resp.status == 500 and resp.json()["error"]["type"] == "server_error"
    script(scripted, "Hello there friend", fail_at=2)
    events = stream(scripted.sock, "/v1/chat/completions", {"messages": ASK, "stream": True})
    assert events[-1] == "[DONE]" and "error" in events[-2]
    assert events[-2]["error"]["type"] == "server_error"
    script(scripted, "Fine again.")
    assert chat(scripted)["choices"][0]["message"]["content"] == "Fine again."
    assert get(scripted.sock, "/health").status == 200


def test_a_refused_cache_fails_only_that_request(scripted):
    script(scripted, "Fine.")
    scripted.model.cache_limit = 10
    try:
        resp = post(scripted.sock, "/v1/chat/completions", {"messages": ASK}, timeout=30)
    finally:
        scripted.model.cache_limit = None
    assert resp.status == 500 and "cannot allocate the KV cache" in resp.json()["error"]["message"]
    assert chat(scripted)["choices"][0]["message"]["content"] == "Fine."


def test_legacy_completion_echo_and_logprobs(scripted):
    script(scripted, " Paris.", end=True)
    body = post(scripted.sock, "/v1/completions", {
        "prompt": "The capital of France is", "echo": True, "logprobs": 1,
        "max_tokens": 5}).json()
    choice = body["choices"][0]
    assert choice["text"] == "The capital of France is Paris."
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["text_offset"][0] == 0
    assert all(b > a for a, b in zip(logprobs["text_offset"], logprobs["text_offset"][1:]))
    assert body["usage"]["prompt_tokens"] == post(scripted.sock, "/tokenize", {
        "prompt": "The capital of France is"}).json()["count"]


def test_detokenize_round_trip(scripted):
    ids = post(scripted.sock, "/tokenize", {"prompt": "héllo wörld"}).json()["tokens"]
    assert post(scripted.sock, "/detokenize", {"tokens": ids}).json() == {"prompt": "héllo wörld"}
    bad = post(scripted.sock, "/detokenize", {"tokens": [10**9]})
    assert bad.status == 400 and bad.json()["error"]["param"] == "tokens"
    assert json.loads(get(scripted.sock, "/v1/models").body)["data"][0]["id"] == "scripted-model"


def test_requests_beyond_the_kv_budget_queue_then_complete(scripted):
    """Two requests of 300 + prompt tokens each cannot share a 512-token KV budget: the
    second waits (queue_depth 1) until the first finishes, then completes too."""
    import threading
    import time

    from tests.support.engine import metric

    script(scripted, "word " * 10, end=False)
    scripted.model.delay_s = 0.002
    results = [None, None]

    def ask(i):
        results[i] = chat(scripted, max_tokens=300)

    try:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        deadline, depths = time.monotonic() + 30, set()
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            depths.add(metric(scripted.sock, "kimi_engine_queue_depth"))
            time.sleep(0.05)
        for t in threads:
            t.join(60)
    finally:
        scripted.model.delay_s = 0.0
    assert 1.0 in depths
    assert [r["usage"]["completion_tokens"] for r in results] == [300, 300]
    assert metric(scripted.sock, "kimi_engine_queue_depth") == 0


def test_health_is_503_when_the_model_thread_stopped(text_side):
    tokenizer, chat = text_side
    with InProcessEngine(ScriptedModel(tokenizer.vocab_size), tokenizer, chat) as engine:
        assert get(engine.sock, "/health").status == 200
        engine.engine.stop()
        resp = get(engine.sock, "/health")
        assert resp.status == 503 and resp.json()["error"]["code"] == "unavailable"


def test_the_script_stands_under_default_sampling():
    """Requests here sample at temperature 1 (the API's default): the scripted token must take
    all the probability fp32 can hold, or a run now and then samples a stray token."""
    import torch

    model = ScriptedModel(49152, script=[7])
    logits = model.forward(torch.tensor([1, 2, 3]), model.new_cache(8), 0)  # [1, V]
    assert float(torch.log_softmax(logits[-1], -1)[7]) == 0.0
