"""Issue 25 item 4: stored Responses, ledger rows and signatures belong to the API key that
made them (a hash of it, or "no key"); another key's reads as unknown. Signatures and
`encrypted_content` are sealed (AES-GCM), so the reasoning is not readable from them."""
import base64
import json
import sqlite3
import zlib

from proxy.app import create_app
from proxy.state.reasoning import Ledger
from proxy.state.store import Database, ResponseStore, owner_of
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

REASONING = "Plan: the password in ~/.netrc is hunter2; do not repeat it."
ALICE, BOB = {"Authorization": "Bearer alice-key"}, {"x-api-key": "bob-key"}
ANTH = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
OMITTED = {"type": "enabled", "budget_tokens": 2048, "display": "omitted"}


def make(tmp_path, *replies, **config):
    fake = FakeUpstream(*replies)
    app = create_app({**proxy_config("http://127.0.0.1:9/v1", tmp_path), **config})
    app.extensions["kimi"].upstream = fake.client()
    return app.test_client(), fake


def store_response(client, headers) -> str:
    resp = client.post("/v1/responses", json={"model": "m", "input": "hi"}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["id"]


def test_another_keys_response_reads_and_deletes_as_unknown(tmp_path):
    client, _ = make(tmp_path, Reply.text("Hello!", reasoning=REASONING))
    rid = store_response(client, ALICE)
    assert client.get(f"/v1/responses/{rid}", headers=ALICE).get_json()["id"] == rid
    assert client.get(f"/v1/responses/{rid}", headers={"x-api-key": "alice-key"}).status_code == 200  # same key
    refused = [client.get(f"/v1/responses/{rid}", headers=h) for h in (BOB, {})]
    refused.append(client.delete(f"/v1/responses/{rid}", headers=BOB))
    assert [r.status_code for r in refused] == [404, 404, 404]
    assert client.get(f"/v1/responses/{rid}", headers=ALICE).status_code == 200  # Bob's DELETE did nothing
    assert client.delete(f"/v1/responses/{rid}", headers=ALICE).get_json()["deleted"] is True
    unknown = client.get(f"/v1/responses/{rid}", headers=ALICE)
    assert unknown.status_code == 404
    assert [r.get_json() for r in refused] == [unknown.get_json()] * 3  # the Responses shape of an unknown id


def test_previous_response_id_of_another_key_is_not_found(tmp_path):
    client, fake = make(tmp_path, Reply.text("Hello!", reasoning=REASONING), Reply.text("again"))
    rid = store_response(client, ALICE)
    resp = client.post("/v1/responses", json={"model": "m", "input": "more", "previous_response_id": rid},
                       headers=BOB)
    assert resp.status_code == 404 and resp.get_json()["error"]["param"] == "previous_response_id"
    assert len(fake.requests) == 1  # nothing of Alice's went upstream for Bob
    chained = client.post("/v1/responses", json={"model": "m", "input": "more", "previous_response_id": rid},
                          headers=ALICE)
    assert chained.status_code == 200 and "Hello!" in json.dumps(fake.requests[-1]["messages"])


def test_a_configured_key_binds_too_and_no_key_rows_stay_apart(tmp_path):
    client, _ = make(tmp_path, Reply.text("one"), Reply.text("two"), API_KEY="alice-key")
    rid = store_response(client, ALICE)
    assert client.get(f"/v1/responses/{rid}", headers=ALICE).status_code == 200
    open_client, _ = make(tmp_path, Reply.text("three"))  # the same ledger file, no key required
    assert open_client.get(f"/v1/responses/{rid}").status_code == 404
    mine = store_response(open_client, {})
    assert open_client.get(f"/v1/responses/{mine}").status_code == 200
    assert open_client.get(f"/v1/responses/{mine}", headers=BOB).status_code == 404


def chat(client, messages, headers):
    resp = client.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers=headers)
    assert resp.status_code == 200, resp.get_json()


def test_ledger_fingerprints_restore_only_for_the_key_that_made_them(tmp_path):
    client, fake = make(tmp_path, Reply.text("Hello!", reasoning=REASONING), Reply.text("ok"), Reply.text("ok"))
    first = [{"role": "user", "content": "hi"}]
    chat(client, first, ALICE)
    echoed = [*first, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "and?"}]
    chat(client, echoed, BOB)  # the same conversation, word for word, from another key
    assert "reasoning_content" not in fake.requests[-1]["messages"][1]
    chat(client, echoed, ALICE)
    assert fake.requests[-1]["messages"][1]["reasoning_content"] == REASONING


def test_a_signature_restores_only_for_the_key_that_got_it(tmp_path):
    client, fake = make(tmp_path, Reply.text("Hello!", reasoning=REASONING), Reply.text("a"), Reply.text("b"))
    out = client.post("/v1/messages", json={**ANTH, "thinking": OMITTED}, headers=ALICE).get_json()
    thinking = out["content"][0]
    assert thinking["thinking"] == "" and thinking["signature"]
    body = {**ANTH, "thinking": OMITTED, "messages": [
        {"role": "user", "content": "Tell me."}, {"role": "assistant", "content": [thinking]},
        {"role": "user", "content": "again"}]}  # another conversation: no fingerprint can help
    assert client.post("/v1/messages", json=body, headers=BOB).status_code == 200
    assert "reasoning_content" not in fake.requests[-1]["messages"][1]
    assert client.post("/v1/messages", json=body, headers=ALICE).status_code == 200
    assert fake.requests[-1]["messages"][1]["reasoning_content"] == REASONING


def every_inflation(data: bytes) -> list[bytes]:
    """Whatever zlib, raw deflate or gzip can inflate starting at any offset of data."""
    found = []
    for start in range(len(data)):
        for wbits in (15, -15, 31):
            try:
                found.append(zlib.decompressobj(wbits).decompress(data[start:]))
            except zlib.error:
                continue
    return found


def test_signatures_and_encrypted_content_do_not_carry_readable_reasoning(tmp_path):
    client, _ = make(tmp_path, Reply.text("Hello!", reasoning=REASONING), Reply.text("Hello!", reasoning=REASONING))
    anthropic = client.post("/v1/messages", json={**ANTH, "thinking": OMITTED}).get_json()["content"][0]["signature"]
    responses = client.post("/v1/responses", json={"model": "m", "input": "hi"}).get_json()
    encrypted = responses["output"][0]["encrypted_content"]
    for segment in [s for payload in (anthropic, encrypted) for s in payload.split(".")]:
        decoded = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        assert b"hunter2" not in decoded
        assert not [out for out in every_inflation(decoded) if b"hunter2" in out or b"Plan" in out]
    assert anthropic != encrypted


def test_ledger_and_store_rows_are_bound_to_their_owner(tmp_path):
    db = Database(tmp_path / "ledger.sqlite")
    ledger, store = Ledger(db), ResponseStore(db)
    alice, bob = owner_of("alice-key"), owner_of("bob-key")
    assert owner_of(None) == owner_of("") == "" and alice not in ("", bob) and "alice-key" not in alice
    sig = ledger.record("turn", reasoning=REASONING, text="Hello!", message={"content": "Hello!"}, owner=alice)
    assert ledger.decode(sig, alice) == (REASONING, "turn") and ledger.decode(sig, bob) == (None, None)
    assert ledger.restore(signatures=[sig], text="Hello!", owner=bob) is None
    assert ledger.restore(signatures=[sig], text="Hello!", owner="") is None
    assert ledger.restore(signatures=[sig], owner=alice).source == "ledger"
    store.put("resp_a", input_items=[1], output_items=[2], owner=alice)
    store.put("resp_b", input_items=[3], output_items=[4], previous_id="resp_a", owner=bob)
    assert store.get("resp_a", bob) is None and store.history("resp_a", "") is None
    assert store.history("resp_b", bob) == [3, 4]  # the chain stops where Bob's rows end
    assert not store.delete("resp_a", bob) and store.get("resp_a", alice).output_items == [2]


OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE ledger (id TEXT PRIMARY KEY, created REAL NOT NULL, used REAL NOT NULL,
    reasoning TEXT NOT NULL, message TEXT, fingerprint TEXT);
CREATE TABLE responses (id TEXT PRIMARY KEY, created REAL NOT NULL, previous_id TEXT,
    input_items TEXT NOT NULL, output_items TEXT NOT NULL, response TEXT);
INSERT INTO ledger VALUES ('old', 1e12, 1e12, 'old reasoning', NULL, 'fp');
INSERT INTO responses VALUES ('resp_old', 1e12, NULL, '[]', '[]', '{"id": "resp_old"}');
"""


def test_rows_from_before_owners_are_dropped_on_open(tmp_path, caplog):
    path = tmp_path / "ledger.sqlite"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    old.close()
    with caplog.at_level("WARNING", logger="kimi.proxy"):
        db = Database(path, clock=lambda: 1e12)
    assert db.count("ledger") == 0 and db.count("responses") == 0
    assert "dropped 1 ledger rows" in caplog.text and "dropped 1 responses rows" in caplog.text
    assert ResponseStore(db).get("resp_old", "") is None
    Ledger(db).record("new", reasoning="r", text="t", owner=owner_of("k"))
    db.close()
    assert Database(path).count("ledger") == 1  # an upgraded file is left alone
