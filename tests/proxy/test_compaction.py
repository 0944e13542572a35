"""Codex compaction (issue 14): `POST /v1/responses/compact`, the `compaction_trigger` item of
remote_compaction_v2, and compaction items coming back in later `input`, driven with Codex's
captured turn 2 (codex-tool.jsonl.gz) against the scripted fake upstream."""
import copy
import gzip
import json
import pathlib

import pytest

from proxy import sse
from proxy.app import create_app
from proxy.dialects import responses_compact
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

CAPTURE = pathlib.Path(__file__).parents[1] / "fixtures" / "live-clients" / "codex-tool.jsonl.gz"
SUMMARY = "The user asked to run `echo tool-ran-ok`; it ran and printed tool-ran-ok. Nothing is left."


def make(tmp_path, *replies):
    fake = FakeUpstream(*replies)
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path))
    app.extensions["kimi"].upstream = fake.client()
    return app.test_client(), fake


def codex_turn2() -> tuple[dict, dict]:
    """Codex's second request (history with a tool call and its output): (headers, body)."""
    with gzip.open(CAPTURE, "rt") as fh:
        record = [r for r in map(json.loads, fh) if r["method"] == "POST"][-1]
    headers = {k: v for k, v in dict(record["headers"]).items()
               if k.lower() not in ("host", "content-length", "accept-encoding")}
    return headers, copy.deepcopy(record["body"])


def compact_body(body: dict) -> dict:
    """What Codex's remote compaction posts: the turn's model, input, instructions and tools."""
    return {k: body[k] for k in ("model", "input", "tools", "parallel_tool_calls", "reasoning") if k in body}


def asked_to_summarise(payload: dict) -> bool:
    last = payload["messages"][-1]
    return last["role"] == "user" and last["content"] == responses_compact.INSTRUCTION and "tools" not in payload


def test_compact_route_summarises_the_input(tmp_path):
    headers, body = codex_turn2()
    client, fake = make(tmp_path, Reply.text(SUMMARY, reasoning="Summarise it."))
    resp = client.post("/v1/responses/compact", json=compact_body(body), headers=headers)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    out = resp.get_json()
    assert out["object"] == "response.compaction" and out["id"].startswith("resp_")
    *kept, compacted = out["output"]
    assert kept == [i for i in body["input"] if i.get("type") == "message" and i["role"] == "user"]
    assert compacted["type"] == "compaction" and responses_compact.decode(compacted["encrypted_content"]) == SUMMARY
    assert out["usage"]["input_tokens"] == 7 and out["usage"]["output_tokens"] == 5
    payload = fake.requests[-1]
    assert asked_to_summarise(payload) and payload["stream"] is False
    assert "tool-ran-ok" in json.dumps(payload["messages"])  # the conversation itself was sent
    assert client.get(f"/v1/responses/{out['id']}").status_code == 404  # nothing stored


def test_compaction_items_in_later_input_become_context(tmp_path):
    headers, body = codex_turn2()
    client, fake = make(tmp_path, Reply.text(SUMMARY), Reply.text("Done."))
    output = client.post("/v1/responses/compact", json=compact_body(body), headers=headers).get_json()["output"]
    foreign = {"type": "compaction", "encrypted_content": "gAAAAABpZ3Vlc3NlZA=="}  # OpenAI's, unreadable
    later = {**body, "input": [*body["input"][:2], foreign, *output,
                               {"type": "message", "role": "user", "content": "And now?"}]}
    resp = client.post("/v1/responses", json=later, headers=headers)
    assert resp.status_code == 200
    sent = fake.requests[-1]["messages"]
    summaries = [m for m in sent if SUMMARY in json.dumps(m)]
    assert len(summaries) == 1 and summaries[0]["role"] == "user"
    assert summaries[0]["content"] == responses_compact.SUMMARY_HEADER + SUMMARY
    assert sent[-1] == {"role": "user", "content": "And now?"} and "gAAAAB" not in json.dumps(sent)
    alias = {**later, "stream": False, "input": [{"type": "compaction_summary", "encrypted_content":
                                                   responses_compact.encode("S2")}, later["input"][-1]]}
    assert client.post("/v1/responses", json=alias, headers=headers).status_code == 200
    assert fake.requests[-1]["messages"][0] == {"role": "user", "content": responses_compact.SUMMARY_HEADER + "S2"}


@pytest.mark.parametrize("stream", [True, False])
def test_compaction_trigger_answers_with_one_compaction_item(tmp_path, stream):
    headers, body = codex_turn2()
    client, fake = make(tmp_path, Reply.text(SUMMARY, reasoning="Summarise it."))
    triggered = {**body, "stream": stream, "store": False, "input": [*body["input"], {"type": "compaction_trigger"}]}
    resp = client.post("/v1/responses", json=triggered, headers=headers)
    assert resp.status_code == 200
    if stream:
        frames = [(e, json.loads(d)) for e, d in sse.parse_frames(resp.get_data())]
        assert [e for e, _d in frames] == ["response.created", "response.in_progress", "response.output_item.added",
                                           "response.output_item.done", "response.completed"]
        assert [d["sequence_number"] for _e, d in frames] == list(range(5))
        final = frames[-1][1]["response"]
    else:
        final = resp.get_json()
    assert final["status"] == "completed" and len(final["output"]) == 1
    item = final["output"][0]
    assert item["type"] == "compaction" and responses_compact.decode(item["encrypted_content"]) == SUMMARY
    assert asked_to_summarise(fake.requests[-1]) and fake.requests[-1]["stream"] is stream


def test_captured_codex_v2_compaction_round_trip(tmp_path):
    """codex-compact-v2.jsonl.gz: the trigger request, then the new window echoing the item."""
    with gzip.open(CAPTURE.with_name("codex-compact-v2.jsonl.gz"), "rt") as fh:
        _turn, trigger, window = [r for r in map(json.loads, fh) if r["method"] == "POST"]
    headers = {k: v for k, v in dict(trigger["headers"]).items()
               if k.lower() not in ("host", "content-length", "accept-encoding")}
    assert trigger["body"]["input"][-1] == {"type": "compaction_trigger"} and trigger["body"]["stream"] is True
    client, fake = make(tmp_path, Reply.text(SUMMARY), Reply.text("tool-ran-ok"))
    frames = [(e, json.loads(d)) for e, d in sse.parse_frames(
        client.post("/v1/responses", json=trigger["body"], headers=headers).get_data())]
    done = [d["item"] for e, d in frames if e == "response.output_item.done"]
    assert len(done) == 1 and done[0]["type"] == "compaction"  # Codex fails on anything else
    assert frames[-1][1]["response"]["output"] == done and asked_to_summarise(fake.requests[-1])
    body = copy.deepcopy(window["body"])
    stub_item = next(i for i in body["input"] if i["type"] == "compaction")
    assert client.post("/v1/responses", json=body, headers=headers).status_code == 200  # the stub's blob
    assert "stub-compaction-blob" not in json.dumps(fake.requests[-1])
    body["input"][body["input"].index(stub_item)] = done[0]  # what Codex echoes after talking to us
    assert client.post("/v1/responses", json=body, headers=headers).status_code == 200
    sent = fake.requests[-1]["messages"]
    assert sent[-1] == {"role": "user", "content": responses_compact.SUMMARY_HEADER + SUMMARY}
