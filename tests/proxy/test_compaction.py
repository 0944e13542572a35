"""Codex compaction (issue 14): `POST /v1/responses/compact`, the `compaction_trigger` item of
remote_compaction_v2, and compaction items coming back in later `input`, driven with Codex's
captured turn 2 (codex-tool.jsonl.gz) against the scripted fake upstream."""
import base64
import copy
import gzip
import json
import logging
import pathlib
import zlib

import pytest

from proxy import sse
from proxy.app import create_app
from proxy.dialects import responses_compact
from proxy.guards import key_owner
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


def sealer(client):
    return client.application.extensions["kimi"].reasoning.sealer


def owner(client, headers: dict) -> str:
    """The owner a request with these headers gets (the hash of the key it presents)."""
    with client.application.test_request_context(headers=headers):
        return key_owner()


def opened(client, encrypted: str, headers: dict) -> str | None:
    return responses_compact.decode(encrypted, sealer(client), owner(client, headers))


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
    assert compacted["type"] == "compaction" and opened(client, compacted["encrypted_content"], headers) == SUMMARY
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
                                                   responses_compact.encode("S2", sealer(client), owner(client, headers))},
                                                  later["input"][-1]]}
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
    assert item["type"] == "compaction" and opened(client, item["encrypted_content"], headers) == SUMMARY
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


ALICE, BOB = {"Authorization": "Bearer alice-key"}, {"x-api-key": "bob-key"}


def compact_for(client, headers) -> dict:
    out = client.post("/v1/responses/compact", json={"model": "m", "input": "run it"}, headers=headers)
    assert out.status_code == 200, out.get_data(as_text=True)
    return out.get_json()["output"][-1]


def later_with(client, fake, item: dict, headers) -> str:
    """A later turn carrying `item`: the prompt the upstream got, as JSON text."""
    body = {"model": "m", "input": [item, {"type": "message", "role": "user", "content": "And now?"}]}
    assert client.post("/v1/responses", json=body, headers=headers).status_code == 200
    return json.dumps(fake.requests[-1]["messages"])


def test_the_summary_is_not_readable_from_the_item(tmp_path):
    """Issue 25 item 4: the item is sealed, not base64 of the summary (nor zlib of it)."""
    client, _ = make(tmp_path, Reply.text(SUMMARY))
    token = compact_for(client, ALICE)["encrypted_content"]
    assert token.startswith("kcmp2.") and "tool-ran-ok" not in token
    raw = base64.urlsafe_b64decode(token[6:] + "=" * (-len(token[6:]) % 4))
    assert b"tool-ran-ok" not in raw
    for offset in range(32):  # past any nonce or header: nothing inflates to the summary
        try:
            assert b"tool-ran-ok" not in zlib.decompressobj().decompress(raw[offset:])
        except zlib.error:
            pass
    assert opened(client, token, ALICE) == SUMMARY


def test_another_keys_item_does_not_open(tmp_path, caplog):
    client, fake = make(tmp_path, Reply.text(SUMMARY), Reply.text("no"), Reply.text("yes"))
    item = compact_for(client, ALICE)
    with caplog.at_level(logging.INFO, logger="kimi.proxy"):
        assert "tool-ran-ok" not in later_with(client, fake, item, BOB)  # left out, not an error
    assert "compaction item we cannot open" in caplog.text
    assert responses_compact.SUMMARY_HEADER + SUMMARY in json.loads(later_with(client, fake, item, ALICE))[0]["content"]


def test_an_old_readable_item_is_refused_like_a_forged_one(tmp_path):
    client, fake = make(tmp_path, Reply.text("a"), Reply.text("b"))
    old = {"type": "compaction", "encrypted_content": "kcmp1." + base64.urlsafe_b64encode(
        json.dumps({"summary": "S1 was readable"}).encode()).decode()}
    forged = {"type": "compaction", "encrypted_content": "kcmp2." + "A" * 80}
    for item in (old, forged):
        prompt = later_with(client, fake, item, ALICE)
        assert "S1 was readable" not in prompt and responses_compact.SUMMARY_HEADER.strip() not in prompt


def test_a_signature_and_a_compaction_item_do_not_open_as_each_other():
    from proxy.state.signatures import Sealer
    sealer = Sealer(b"k" * 32)
    signature = sealer.sign("the reasoning", "ledger-id")
    assert responses_compact.decode("kcmp2." + signature[len("klr2."):], sealer) is None
    token = responses_compact.encode("the summary", sealer)
    assert sealer.open("klr2." + token[len("kcmp2."):]) == (None, None)
    assert responses_compact.decode(token, sealer) == "the summary"
