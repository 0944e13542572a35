"""Issue 14: what the official SDKs and Claude Code rely on, as the vendors document it.

Claude Code's billing block never reaches the upstream; `thinking.display: "omitted"`
withholds the thinking text but keeps the signature; `max_tokens` is required on Messages;
a Chat stream carries the `choices: []` usage chunk only when the client asks for it."""
import copy
import gzip
import json
import pathlib

import pytest

from proxy import sse
from proxy.app import create_app
from proxy.clients.detect import detect
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

CAPTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "live-clients"
ANTH = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
REASONING = "The user greets me; answer briefly."


def make(tmp_path, *replies):
    fake = FakeUpstream(*replies)
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path))
    app.extensions["kimi"].upstream = fake.client()
    return app.test_client(), fake


def claude_turn1() -> tuple[dict, dict]:
    """Claude Code's first request of claude-tool.jsonl.gz: (headers, body)."""
    with gzip.open(CAPTURES / "claude-tool.jsonl.gz", "rt") as fh:
        record = next(r for r in map(json.loads, fh) if r["method"] == "POST")
    headers = {k: v for k, v in dict(record["headers"]).items()
               if k.lower() not in ("host", "content-length", "accept-encoding")}
    return headers, copy.deepcopy(record["body"])


# ---- Claude Code's billing block ---------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_billing_block_never_reaches_the_upstream(tmp_path, stream):
    headers, body = claude_turn1()
    billing = body["system"][0]["text"]
    assert billing.startswith("x-anthropic-billing-header:")
    body["system"][0]["text"] = billing + " cch=3f9a1;"
    body.update(stream=stream, max_tokens=64)
    client, fake = make(tmp_path, Reply.text("ok"))
    resp = client.post("/v1/messages?beta=true", json=body, headers=headers)
    assert resp.status_code == 200
    system = fake.requests[-1]["messages"][0]
    assert system["role"] == "system" and "x-anthropic-billing-header" not in json.dumps(fake.requests[-1])
    assert system["content"].startswith(body["system"][1]["text"])  # the next block leads, bytes kept
    assert detect("/v1/messages", headers, body).client == "claude-code"
    if stream:
        assert resp.headers["X-Kimi-Preset"] == "claude-code"
    quoted = {**ANTH, "system": [{"type": "text", "text": "Quote: x-anthropic-billing-header: is a header."}]}
    assert client.post("/v1/messages", json=quoted).status_code == 200  # only a leading block goes
    assert fake.requests[-1]["messages"][0]["content"] == quoted["system"][0]["text"]


# ---- thinking.display: "omitted" ---------------------------------------------------------
OMITTED = {"type": "enabled", "budget_tokens": 2048, "display": "omitted"}


def _turn2(client, fake, thinking: dict) -> dict:
    """Echo the withheld thinking block with its signature; the upstream gets the reasoning back."""
    body = {**ANTH, "thinking": OMITTED, "messages": ANTH["messages"] + [
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": "again"}]}
    assert client.post("/v1/messages", json=body).status_code == 200
    return fake.requests[-1]["messages"][1]


def test_omitted_display_withholds_thinking_text_non_stream(tmp_path):
    client, fake = make(tmp_path, Reply.text("Hello!", reasoning=REASONING), Reply.text("Hi again."),
                        Reply.text("Hello!", reasoning=REASONING))
    out = client.post("/v1/messages", json={**ANTH, "thinking": OMITTED}).get_json()
    thinking = out["content"][0]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "" and thinking["signature"]
    assert REASONING not in json.dumps(out) and out["content"][1] == {"type": "text", "text": "Hello!"}
    assert _turn2(client, fake, thinking)["reasoning_content"] == REASONING
    shown = client.post("/v1/messages", json={**ANTH, "thinking": {**OMITTED, "display": "summarized"}})
    assert shown.get_json()["content"][0]["thinking"] == REASONING


def test_omitted_display_withholds_thinking_text_stream(tmp_path):
    client, fake = make(tmp_path, Reply.text("Hello!", reasoning=REASONING), Reply.text("Hi again."))
    raw = client.post("/v1/messages", json={**ANTH, "thinking": OMITTED, "stream": True}).get_data()
    frames = [(e, json.loads(d)) for e, d in sse.parse_frames(raw)]
    assert REASONING[:8].encode() not in raw
    deltas = [d["delta"] for e, d in frames if e == "content_block_delta"]
    assert not [x for x in deltas if x["type"] == "thinking_delta"]
    signature = next(x["signature"] for x in deltas if x["type"] == "signature_delta")
    starts = [d["content_block"] for e, d in frames if e == "content_block_start"]
    assert starts[0] == {"type": "thinking", "thinking": ""} and starts[1]["type"] == "text"
    assert signature and _turn2(client, fake, {"type": "thinking", "thinking": "",
                                               "signature": signature})["reasoning_content"] == REASONING


# ---- max_tokens is required on Messages --------------------------------------------------
def captured_max_tokens() -> list:
    """max_tokens of every /v1/messages request in the live captures."""
    found = []
    for path in sorted(CAPTURES.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as fh:
            found += [r["body"].get("max_tokens") for r in map(json.loads, fh)
                      if r["method"] == "POST" and r["path"].split("?")[0] == "/v1/messages"]
    return found


@pytest.mark.parametrize("stream", [False, True])
def test_messages_without_max_tokens_is_a_400(tmp_path, stream):
    client, fake = make(tmp_path)
    body = {k: v for k, v in ANTH.items() if k != "max_tokens"}
    resp = client.post("/v1/messages", json={**body, "stream": stream})
    assert resp.status_code == 400 and not fake.requests
    err = resp.get_json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in err["error"]["message"]
    sent = captured_max_tokens()  # no client we know of relies on a default
    assert len(sent) >= 10 and all(isinstance(n, int) and n > 0 for n in sent)
    assert client.post("/v1/messages/count_tokens", json=body).get_json() == {"input_tokens": 42}


# ---- the Chat usage chunk only when asked for --------------------------------------------
def _chunks(client, body) -> list:
    raw = client.post("/v1/chat/completions", json=body).get_data()
    assert raw.endswith(b"data: [DONE]\n\n")
    return [json.loads(d) for _e, d in sse.parse_frames(raw) if d != "[DONE]"]


@pytest.mark.parametrize("options", [None, {}])
def test_chat_stream_has_the_usage_chunk_only_when_asked(tmp_path, options):
    client, fake = make(tmp_path, Reply.text("Hello there!"))
    body = CHAT if options is None else {**CHAT, "stream_options": options}
    chunks = _chunks(client, body)
    assert all(ch["choices"] and ch["choices"][0]["index"] == 0 for ch in chunks)  # the cookbook's loop
    assert not any("usage" in ch for ch in chunks)
    assert fake.requests[-1]["stream_options"] == {"include_usage": True}  # the engine is still asked
    assert not any("usage" in ch for ch in _chunks(client, {**CHAT, "stream_options": {"include_usage": False}}))
    chunks = _chunks(client, {**CHAT, "stream_options": {"include_usage": True}})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
