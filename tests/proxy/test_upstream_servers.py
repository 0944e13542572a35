"""Kimi K3 behind the proxy: the stream shapes vLLM, SGLang and llama.cpp document for a
reasoning model with a tool-call parser, through all three dialects, streamed and not.

    vLLM (current)        reasoning in `reasoning`, tool calls parsed (--tool-call-parser
                          kimi_k3), `stop_reason` on the choice; during the rename (PR 27752,
                          "Interleaved thinking keeps compatibility with reasoning_content")
                          messages carried both `reasoning` and `reasoning_content`
    vLLM (older), SGLang  reasoning in `reasoning_content`; SGLang names the matched stop
                          `matched_stop`
    llama.cpp             reasoning in `reasoning_content`, tool calls parsed (--jinja)
"""
import json

import pytest

from proxy import sse
from proxy.app import create_app
from tests.support.proxy_fakes import proxy_config

REASONING = "The user wants the files listed; call bash with ls."
ARGS = '{"command":  "ls -la"}'  # the server's raw argument bytes
CALL_ID = "functions.bash:0"     # vLLM's kimi_k3 parser names calls as K2 did
SERVERS = {  # reasoning keys on the message/delta, the choice's stop field
    "vllm": (("reasoning",), "stop_reason"),
    "vllm-rename": (("reasoning", "reasoning_content"), "stop_reason"),
    "vllm-old": (("reasoning_content",), "stop_reason"),
    "sglang": (("reasoning_content",), "matched_stop"),
    "llama.cpp": (("reasoning_content",), None),
}
BASE = {"id": "chatcmpl-k3", "created": 1, "model": "moonshotai/Kimi-K3"}


class Server:
    """A scripted OpenAI-compatible server answering as `name` documents (stream or JSON)."""

    url = "scripted://k3"
    max_model_len = None  # it answers no GET /v1/models

    def served_info(self) -> dict:
        return {}

    def __init__(self, name: str, text: str = "", calls: bool = True, stop: str | None = None):
        self.keys, self.stop_key = SERVERS[name]
        self.text, self.calls, self.stop = text, calls, stop
        self.payloads: list[dict] = []

    def _finish(self) -> dict:
        choice = {"index": 0, "finish_reason": "tool_calls" if self.calls else "stop"}
        if self.stop_key:
            choice[self.stop_key] = self.stop
        return choice

    def chat(self, payload, headers=None, **_kw):  # **_kw: cancel, in newer handlers
        self.payloads.append(payload)
        msg = {"role": "assistant", "content": self.text or None, **{k: REASONING for k in self.keys}}
        if self.calls:
            msg["tool_calls"] = [{"id": CALL_ID, "type": "function", "function": {"name": "bash", "arguments": ARGS}}]
        return {**BASE, "object": "chat.completion", "choices": [{**self._finish(), "message": msg}],
                "usage": {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}}

    def open_stream(self, payload, headers=None, **_kw):
        self.payloads.append(payload)
        deltas = [{"role": "assistant", "content": ""}]
        deltas += [{k: REASONING[i:i + 9] for k in self.keys} for i in range(0, len(REASONING), 9)]
        deltas += [{"content": self.text[i:i + 5]} for i in range(0, len(self.text), 5)]
        if self.calls:
            deltas.append({"tool_calls": [{"id": CALL_ID, "type": "function", "index": 0,
                                           "function": {"name": "bash", "arguments": ""}}]})
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": part}}]} for part in (ARGS[:9], ARGS[9:])]
        chunks = [{**BASE, "object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        chunks.append({**BASE, "object": "chat.completion.chunk", "choices": [{**self._finish(), "delta": {}}]})
        chunks.append({**BASE, "object": "chat.completion.chunk", "choices": [],
                       "usage": {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}})
        return _Stream(chunks)

    def tokenize(self, messages, tools, model):
        return None

    def health(self):
        return True, "scripted"

    def close(self):
        pass


class _Stream(list):
    def close(self):
        pass


def client_for(tmp_path, server: Server, **cfg):
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path, **cfg))
    app.extensions["kimi"].upstream = server
    return app.test_client()


def post(client, path: str, body: dict):
    resp = client.post(path, json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    if not body.get("stream"):
        return resp.get_json()
    return [(e, d if d == "[DONE]" else json.loads(d)) for e, d in sse.parse_frames(resp.get_data())]


USER = [{"role": "user", "content": "List the files."}]
ANTH = {"model": "kimi-k3", "max_tokens": 256, "messages": USER,
        "tools": [{"name": "bash", "input_schema": {"type": "object"}}]}
CHAT = {"model": "kimi-k3", "messages": USER,
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}
RESP = {"model": "kimi-k3", "input": "List the files.",
        "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]}


def anthropic_view(out, stream: bool) -> dict:
    if not stream:
        return {"thinking": [b["thinking"] for b in out["content"] if b["type"] == "thinking"],
                "calls": [(b["id"], b["name"], b["input"]) for b in out["content"] if b["type"] == "tool_use"],
                "stop": out["stop_reason"]}
    thinking = "".join(d["delta"]["thinking"] for e, d in out if e == "content_block_delta"
                       and d["delta"]["type"] == "thinking_delta")
    starts = [d["content_block"] for e, d in out if e == "content_block_start"]
    args = "".join(d["delta"]["partial_json"] for e, d in out if e == "content_block_delta"
                   and d["delta"]["type"] == "input_json_delta")
    stop = next(d["delta"]["stop_reason"] for e, d in out if e == "message_delta")
    return {"thinking": [thinking] if thinking else [], "stop": stop,
            "calls": [(b["id"], b["name"], json.loads(args)) for b in starts if b["type"] == "tool_use"]}


def chat_view(out, stream: bool) -> dict:
    if not stream:
        msg = out["choices"][0]["message"]
        return {"reasoning": msg.get("reasoning_content"), "finish": out["choices"][0]["finish_reason"],
                "calls": [(t["id"], t["function"]["name"], t["function"]["arguments"]) for t in msg.get("tool_calls", [])]}
    deltas = [d["choices"][0] for _e, d in out[:-1] if d["choices"]]
    calls = [t for ch in deltas for t in ch["delta"].get("tool_calls", [])]
    return {"reasoning": "".join(ch["delta"].get("reasoning_content", "") for ch in deltas) or None,
            "finish": deltas[-1]["finish_reason"],
            "calls": [(calls[0]["id"], calls[0]["function"]["name"],
                       "".join(t["function"]["arguments"] for t in calls))] if calls else []}


def responses_view(out, stream: bool) -> dict:
    final = out if not stream else out[-1][1]["response"]
    if stream:
        assert out[-1][0] == "response.completed"
    items = final["output"]
    return {"reasoning": [s["text"] for i in items if i["type"] == "reasoning" for s in i["summary"]],
            "calls": [(i["call_id"], i["name"], i["arguments"]) for i in items if i["type"] == "function_call"],
            "status": final["status"]}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name", list(SERVERS))
def test_reasoning_and_parsed_tool_calls_reach_every_dialect(tmp_path, name, stream):
    server = Server(name)
    client = client_for(tmp_path, server)
    anth = anthropic_view(post(client, "/v1/messages", {**ANTH, "stream": stream}), stream)
    assert anth == {"thinking": [REASONING], "calls": [("toolu_" + CALL_ID, "bash", json.loads(ARGS))],
                    "stop": "tool_use"}
    chat = chat_view(post(client, "/v1/chat/completions", {**CHAT, "stream": stream}), stream)
    assert chat == {"reasoning": REASONING, "calls": [(CALL_ID, "bash", ARGS)], "finish": "tool_calls"}
    resp = responses_view(post(client, "/v1/responses", {**RESP, "stream": stream}), stream)
    assert resp == {"reasoning": [REASONING], "calls": [(CALL_ID, "bash", ARGS)], "status": "completed"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_the_servers_stop_field_names_the_stop_sequence(tmp_path, name, stream):
    client = client_for(tmp_path, Server(name, text="Here they are", calls=False, stop="END"))
    body = {**ANTH, "stream": stream, "stop_sequences": ["END"]}
    out = post(client, "/v1/messages", body)
    delta = out if not stream else next(d["delta"] for e, d in out if e == "message_delta")
    assert (delta["stop_reason"], delta["stop_sequence"]) == ("stop_sequence", "END")
    chat = post(client, "/v1/chat/completions", {**CHAT, "stream": stream, "stop": ["END"]})
    assert chat_view(chat, stream)["finish"] == "stop"


@pytest.mark.parametrize("field,expected", [("auto", "reasoning_content"), ("reasoning", "reasoning"),
                                            ("reasoning_content", "reasoning_content")])
def test_turn_two_sends_reasoning_back_under_the_configured_field(tmp_path, field, expected):
    """The reasoning goes back under the configured field: `reasoning` is vLLM's own name
    (vLLM 0.32 also takes `reasoning_content` and renames it), `auto` sends reasoning_content."""
    server = Server("vllm")
    client = client_for(tmp_path, server, REASONING_FIELD=field)
    first = post(client, "/v1/chat/completions", CHAT)["choices"][0]["message"]
    echoed = {"role": "assistant", "content": None, "tool_calls": first["tool_calls"]}  # reasoning dropped
    body = {**CHAT, "messages": [*USER, echoed, {"role": "tool", "tool_call_id": CALL_ID, "content": "a.txt"}]}
    post(client, "/v1/chat/completions", body)
    sent = server.payloads[-1]["messages"][1]
    other = ({"reasoning", "reasoning_content"} - {expected}).pop()
    assert sent[expected] == REASONING and other not in sent
    assert sent["tool_calls"][0]["function"]["arguments"] == ARGS and sent["tool_calls"][0]["id"] == CALL_ID
