"""Tool calls under their grammar, on real models: SmolLM2's hermes <tool_call> JSON and the tiny
Kimi-Linear checkpoint's K2 section tokens. Arguments are checked with jsonschema, not the grammar."""
import json

import jsonschema
import pytest
import torch

from tests.support import kimi_tiny
from tests.support.engine import InProcessEngine, post

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                    "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web",
     "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 40}},
                    "required": ["query"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a file",
     "parameters": {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 999}},
                    "required": ["path"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(message: dict, names) -> list[dict]:
    calls = message.get("tool_calls") or []
    assert calls, message
    for call in calls:
        assert call["function"]["name"] in names
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    return calls


@pytest.mark.parametrize("ask", ["What is the weather in Paris?", "Find cat pictures on the web.",
                                 "Show me README.md", "Hello!"])
def test_required_gives_a_valid_call(served, ask):
    resp = post(served.sock, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": ask}], "tools": TOOLS, "tool_choice": "required",
        "parallel_tool_calls": False, "max_tokens": 96, "temperature": 0}, timeout=120)
    assert resp.status == 200, resp.body
    choice = resp.json()["choices"][0]
    assert len(check_calls(choice["message"], SCHEMAS)) == 1
    assert choice["finish_reason"] == "tool_calls"


def test_a_named_function_is_the_one_called(served):
    resp = post(served.sock, "/v1/chat/completions", {
        "messages": ASK, "tools": TOOLS, "max_tokens": 128, "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "read_file"}}}, timeout=120)
    calls = check_calls(resp.json()["choices"][0]["message"], {"read_file"})
    assert {c["function"]["name"] for c in calls} == {"read_file"}


def test_allowed_tools_limit_the_call_to_the_listed_ones(served):
    """OpenAI's allowed_tools choice: the prompt offers only the listed tools and the mode
    applies; it was a 400 before (a tool_choice this engine did not read)."""
    listed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "search"}}]}}
    body = {"messages": ASK, "tools": TOOLS, "max_tokens": 96, "temperature": 0,
            "parallel_tool_calls": False, "tool_choice": listed}
    resp = post(served.sock, "/v1/chat/completions", body, timeout=120)
    assert resp.status == 200, resp.body
    assert [c["function"]["name"] for c in check_calls(resp.json()["choices"][0]["message"], SCHEMAS)] == ["search"]
    prompt = post(served.sock, "/tokenize", {"messages": ASK, "tools": TOOLS, "tool_choice": listed,
                                             "return_token_strs": True}).json()
    text = "".join(prompt["token_strs"])
    assert "search" in text and "get_weather" not in text and "read_file" not in text
    for bad in ({**listed["allowed_tools"], "mode": "always"}, {**listed["allowed_tools"], "tools": []},
                {**listed["allowed_tools"], "tools": [{"type": "function", "function": {"name": "nope"}}]}):
        resp = post(served.sock, "/v1/chat/completions", {**body, "tool_choice": {
            "type": "allowed_tools", "allowed_tools": bad}})
        assert resp.status == 400 and "allowed_tools" in resp.json()["error"]["message"], resp.body
    odd = [{"type": "function", "function": {"name": ["search"]}}, *TOOLS]  # a 400, not a 500
    resp = post(served.sock, "/v1/chat/completions", {**body, "tools": odd, "tool_choice": listed})
    assert resp.status == 400, resp.body


class OpenerAt:
    """The real model, except that from output token `at` on it strongly prefers the tokens of
    `opener`, one per step: free text is the model's own, then it opens a call at a known step."""

    def __init__(self, model, prompt_len: int, at: int, opener: list[int]):
        self.model, self.prompt_len, self.at, self.opener = model, prompt_len, at, opener
        self.kv_bytes_per_token, self.state_bytes = model.kv_bytes_per_token, model.state_bytes
        self.weight_bytes, self.decode_gemv, self.device = model.weight_bytes, model.decode_gemv, model.device
        self.verifies_drafts = False  # its logits depend on the output position it is fed

    def new_cache(self, max_tokens):
        return self.model.new_cache(max_tokens)

    def graph_step(self, rows, max_context):
        return None

    def forward(self, tokens, cache, start, last_only=True):
        logits = self.model.forward(tokens, cache, start, last_only)
        return self._push(logits, start + len(tokens) - self.prompt_len)

    def decode_batch(self, tokens, caches, positions):
        logits = self.model.decode_batch(tokens, caches, positions)
        return torch.cat([self._push(logits[i:i + 1], p + 1 - self.prompt_len)
                          for i, p in enumerate(positions)])

    def _push(self, logits, generated: int):
        k = generated - self.at
        if 0 <= k < len(self.opener):
            logits = logits.clone()
            logits[-1, self.opener[k]] += 100.0
        return logits


def test_auto_leaves_free_text_alone_until_the_opener_then_constrains(smol):
    tok, chat = smol.tokenizer, smol.chat
    prompt = chat.render(ASK, TOOLS, True, "auto")
    prompt_ids = tok.encode(prompt)
    opener = tok.encode("<tool_call>")
    model = OpenerAt(smol.model, len(prompt_ids), 6, opener)
    with InProcessEngine(model, tok, chat, max_context=2048) as engine:
        free = post(engine.sock, "/v1/completions", {"prompt": prompt_ids, "max_tokens": 60,
                                                     "temperature": 0, "return_token_ids": True}).json()
        lazy = post(engine.sock, "/v1/chat/completions", {
            "messages": ASK, "tools": TOOLS, "max_tokens": 60, "temperature": 0,
            "return_token_ids": True}, timeout=120).json()
    free_ids, lazy_ids = free["choices"][0]["token_ids"], lazy["choices"][0]["token_ids"]
    end = 6 + len(opener)
    assert lazy_ids[:end] == free_ids[:end]                 # the model's own text, token for token
    assert lazy_ids[6:end] == opener
    message = lazy["choices"][0]["message"]
    assert message["content"] == tok.decode(free_ids[:6]).strip()
    check_calls(message, SCHEMAS)                           # after the opener: a valid call
    assert tok.decode(free_ids[end:]) != tok.decode(lazy_ids[end:])  # the grammar steered it


@pytest.fixture(scope="module")
def kimi_served(tmp_path_factory):
    from engined.weights.kimi_checkpoint import load_kimi_linear
    path = kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("kimi") / "tiny")
    loaded = load_kimi_linear(path, progress=False)
    with InProcessEngine(loaded.model, loaded.tokenizer, loaded.chat) as engine:
        yield engine, loaded


KIMI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer",
    "minimum": 1, "maximum": 9}}, "required": ["city", "days"], "additionalProperties": False}}}]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_kimi_linear_calls_through_its_own_tokens(kimi_served, tool_choice):
    engine, loaded = kimi_served
    resp = post(engine.sock, "/v1/chat/completions", {
        "messages": ASK, "tools": KIMI_TOOLS, "tool_choice": tool_choice, "max_tokens": 48,
        "temperature": 0, "parallel_tool_calls": False, "return_token_ids": True}, timeout=120)
    assert resp.status == 200, resp.body
    choice = resp.json()["choices"][0]
    ids = choice["token_ids"]
    special = loaded.tokenizer.token_to_id
    assert ids[0] == special("<|tool_calls_section_begin|>") and ids[1] == special("<|tool_call_begin|>")
    assert special("<|tool_calls_section_end|>") in ids
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("functions.get_weather:")
    jsonschema.validate(json.loads(call["function"]["arguments"]), KIMI_TOOLS[0]["function"]["parameters"])
    assert choice["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("opener", ["<|tool_calls_section_begin|>", "<|tool_call_begin|>"])
def test_kimi_auto_wakes_at_its_section_or_a_bare_call(kimi_served, opener):
    _, loaded = kimi_served
    tok, chat = loaded.tokenizer, loaded.chat
    prompt_ids = tok.encode(chat.render(ASK, KIMI_TOOLS, True, "auto"))
    model = OpenerAt(loaded.model, len(prompt_ids), 3, [tok.token_to_id(opener)])
    with InProcessEngine(model, tok, chat) as engine:
        free = post(engine.sock, "/v1/completions", {"prompt": prompt_ids, "max_tokens": 80,
                                                     "temperature": 0, "return_token_ids": True}).json()
        lazy = post(engine.sock, "/v1/chat/completions", {
            "messages": ASK, "tools": KIMI_TOOLS, "max_tokens": 80, "temperature": 0,
            "parallel_tool_calls": False, "return_token_ids": True}, timeout=120).json()
    free_ids, lazy_ids = free["choices"][0]["token_ids"], lazy["choices"][0]["token_ids"]
    assert lazy_ids[:4] == free_ids[:4] and lazy_ids[3] == tok.token_to_id(opener)
    (call,) = lazy["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), KIMI_TOOLS[0]["function"]["parameters"])
