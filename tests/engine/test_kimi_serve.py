"""The tiny Kimi-Linear checkpoint served by the real engine, App and HTTP server over a Unix
socket (in process): greedy output over HTTP equals the model's own greedy loop."""

import pytest
import torch

from tests.support import kimi_tiny  # noqa: E402
from tests.support.engine import InProcessEngine, post, stream  # noqa: E402

from engined.weights.kimi_checkpoint import load_kimi_linear  # noqa: E402

ASK = [{"role": "user", "content": "hello world, the weather in Paris?"}]
NEW = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("kimi") / "tiny")
    loaded = load_kimi_linear(path, progress=False)
    with InProcessEngine(loaded.model, loaded.tokenizer, loaded.chat) as engine:
        yield engine, loaded


def greedy_text(loaded) -> tuple[str, int]:
    """Direct greedy loop on the model: (text until a stop id or NEW tokens, prompt length)."""
    model, tok, chat = loaded.model, loaded.tokenizer, loaded.chat
    ids = tok.encode(chat.render(ASK))
    cache = model.new_cache(len(ids) + NEW + 1)
    logits, out = model.forward(torch.tensor(ids), cache, 0), []
    for i in range(NEW):
        nxt = int(logits[-1].argmax())
        if nxt in chat.stop_token_ids:
            break
        out.append(nxt)
        logits = model.forward(torch.tensor([nxt]), cache, len(ids) + i)
    return tok.decode(out), len(ids)


def test_chat_completion_equals_direct_greedy_decode(served):
    engine, loaded = served
    want, prompt_len = greedy_text(loaded)
    assert want                                  # the tiny model does generate before any stop id
    resp = post(engine.sock, "/v1/chat/completions",
                {"messages": ASK, "max_tokens": NEW, "temperature": 0}, timeout=60)
    assert resp.status == 200, resp.body
    body = resp.json()
    assert body["choices"][0]["message"]["content"] == want
    assert body["usage"]["prompt_tokens"] == prompt_len


def test_streamed_chat_equals_direct_greedy_decode(served):
    engine, loaded = served
    want, _ = greedy_text(loaded)
    events = stream(engine.sock, "/v1/chat/completions",
                    {"messages": ASK, "max_tokens": NEW, "temperature": 0, "stream": True}, timeout=60)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if isinstance(e, dict) and e.get("choices"))
    assert text == want


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get current weather",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
K2_CALL = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0'
           '<|tool_call_argument_begin|>{"city": "Rome"}<|tool_call_end|><|tool_calls_section_end|>')


@pytest.fixture()
def scripted_kimi(served):
    """The Kimi tokenizer and chat format around a scripted model: the server parses the
    output with the chat format's own parser (`chat.output_parser`, K2's markers)."""
    from tests.support.engine import ScriptedModel

    _, loaded = served
    model = ScriptedModel(loaded.tokenizer.vocab_size)
    model.script = loaded.tokenizer.encode(K2_CALL) + [loaded.tokenizer.token_to_id("<|im_end|>")]
    with InProcessEngine(model, loaded.tokenizer, loaded.chat) as engine:
        yield engine


def test_k2_tool_call_becomes_native_tool_calls(scripted_kimi):
    resp = post(scripted_kimi.sock, "/v1/chat/completions",
                {"messages": ASK, "tools": TOOLS, "max_tokens": 40}, timeout=60)
    assert resp.status == 200, resp.body
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [{"id": "functions.get_weather:0", "type": "function",
                                                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]


def test_k2_tool_call_streams_incrementally(scripted_kimi):
    events = stream(scripted_kimi.sock, "/v1/chat/completions",
                    {"messages": ASK, "tools": TOOLS, "max_tokens": 40, "stream": True}, timeout=60)
    calls = [c for e in events if isinstance(e, dict) and e.get("choices")
             for c in e["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["id"] == "functions.get_weather:0" and calls[0]["function"]["name"] == "get_weather"
    assert len(calls) > 2                                   # arguments arrive in several pieces
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Rome"}'
    last = [e for e in events if isinstance(e, dict) and e.get("choices")][-1]
    assert last["choices"][0]["finish_reason"] == "tool_calls"
