"""Reasoning signatures, the persistent ledger, restore order, and the response store."""
import base64
import hashlib
import hmac
import os
import stat
import threading
import time
import tracemalloc
import zlib

import pytest

from proxy.state.reasoning import Ledger, apply_reasoning_field, fingerprint
from proxy.state.signatures import bounded_inflate
from proxy.state.store import Database, ResponseStore, default_db_path
from proxy.toolcalls import split_think


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "state" / "ledger.sqlite"


def make_ledger(db_path, clock, **kw):
    return Ledger(Database(db_path, clock=clock), **kw)


CALL = {"id": "functions.Bash:0", "type": "function",
        "function": {"name": "Bash", "arguments": '{"command":  "ls",\n "description": "list"}'}}
MESSAGE = {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]}


@pytest.mark.parametrize("text", ["", "héllo ✓ 中文", "a\r\nb\tc", "trailing  \n", '{"r": "x", "i": "y"}',
                                  "klr1.abc", "k3r1.eA=="])
def test_signature_round_trip(db_path, clock, text):
    ledger = make_ledger(db_path, clock)
    sig = ledger.sign(text, "id1")
    assert sig.startswith("klr2.") and ledger.decode(sig) == (text, "id1")


@pytest.mark.parametrize("sig", [None, "", "garbage", "klr2", "klr2.", "klr2.!!!!", "klr2.////", "klr2.AAAA", "kll1.",
                                 "sig_abc123==", "k3r1", "k3r1.", "k3r1.!!!!", "k3r1.////", "k3l1.", 42, "klr2.é"])
def test_bad_signatures_decode_to_nothing(db_path, clock, sig):
    assert make_ledger(db_path, clock).decode(sig) == (None, None)


def test_truncated_corrupted_or_foreign_signatures_are_rejected(db_path, clock, tmp_path):
    ledger = make_ledger(db_path, clock)
    sig = ledger.sign("some reasoning " * 20, "id1")
    for cut in (1, 3, 7, 13):
        assert ledger.decode(sig[:-cut]) == (None, None)
    middle = len(sig) // 2
    assert ledger.decode(sig[:middle] + ("A" if sig[middle] != "A" else "B") + sig[middle + 1:]) == (None, None)
    other = make_ledger(tmp_path / "other.sqlite", clock)
    assert other.decode(sig) == (None, None)
    shared = Ledger(Database(tmp_path / "third.sqlite"), secret=ledger.secret)
    assert shared.decode(sig)[1] == "id1"


def k3_signature(payload: bytes) -> str:
    return "k3r1." + base64.urlsafe_b64encode(zlib.compress(payload, 9)).decode()


def test_legacy_unsigned_and_readable_signatures_are_refused(db_path, clock):
    ledger = make_ledger(db_path, clock)
    ledger.record("abc", reasoning="someone's plan", text="x", message={"role": "assistant", "content": "x"})
    body = "klr1." + base64.urlsafe_b64encode(zlib.compress(b'{"r":"forged","i":"abc"}')).decode().rstrip("=")
    tag = base64.urlsafe_b64encode(hmac.new(ledger.secret, body.encode(), hashlib.sha256).digest()[:16]).decode()
    for sig in (k3_signature(b'{"r":"old proxy","i":"abc"}'), "k3l1.abc", body + "." + tag.rstrip("=")):
        assert ledger.decode(sig) == (None, None)
        assert ledger.restore(signatures=[sig]) is None
    assert ledger.misses == 3


def test_zlib_bombs_are_rejected_cheaply(db_path, clock):
    ledger = make_ledger(db_path, clock)
    big = zlib.compressobj(9)
    blob = b"".join(big.compress(b"\0" * (1 << 20)) for _ in range(256)) + big.flush()
    assert len(blob) > 64 * 1024
    small = zlib.compress(b'{"r":"' + b"a" * (56 << 20) + b'"}', 9)
    assert len(small) < 64 * 1024
    for payload, budget in ((blob, 4 << 20), (small, 24 << 20)):  # sealed with the right key, still refused
        sig = ledger.sealer.seal(payload)
        tracemalloc.start()
        started = time.monotonic()
        assert ledger.decode(sig) == (None, None)
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert elapsed < 1.0 and peak < budget + len(sig) * 2
    assert bounded_inflate(zlib.compress(b"x" * 100)[:-3]) is None


def test_large_reasoning_uses_ledger_signature_and_prose_stays_inline(db_path, clock):
    ledger = make_ledger(db_path, clock)
    noise = base64.b64encode(os.urandom(150 * 1024)).decode()
    sig = ledger.sign(noise, "big")
    assert len(sig) < 200 and ledger.decode(sig) == (None, "big")
    prose = ("The function reads the file, then parses each line into a record. " * 3200)[:200 * 1024]
    sig = ledger.sign(prose, "prose")
    assert ledger.decode(sig) == (prose, "prose")


def test_restore_by_ledger_returns_the_exact_message_as_a_copy(db_path, clock):
    ledger = make_ledger(db_path, clock)
    turn = ledger.new_id()
    sig = ledger.sign("I should list files.", turn)
    ledger.record(turn, reasoning="I should list files.", text="Let me look.", tool_calls=[CALL], message=MESSAGE)
    restored = ledger.restore(signatures=["sig_foreign==", sig], text="changed", tool_calls=[])
    assert (restored.source, restored.reasoning, restored.message) == ("ledger", "I should list files.", MESSAGE)
    restored.message["content"] = "mutated"
    assert ledger.restore(signatures=[sig]).message == MESSAGE
    assert ledger.stats.hits["ledger"] == 2 and ledger.misses == 0


def test_restore_by_signature_when_the_row_is_gone(db_path, clock):
    ledger = make_ledger(db_path, clock, ttl_seconds=60)
    first, second = ledger.sign("part one. ", "t"), ledger.sign("part two.", "t")
    ledger.record("t", reasoning="part one. part two.", text="x", message={"role": "assistant", "content": "x"})
    clock.now += 61
    restored = ledger.restore(signatures=[first, second], text="x")
    assert (restored.source, restored.reasoning, restored.message) == ("signature", "part one. part two.", None)


def test_restore_by_fingerprint_survives_reserialisation(db_path, clock):
    ledger = make_ledger(db_path, clock)
    ledger.record(reasoning="think", text="Let me look.", tool_calls=[CALL], message=MESSAGE)
    echoed = {"name": "Bash", "input": {"description": "list", "command": "ls"}}
    restored = ledger.restore(text="  Let me look.\n", tool_calls=[echoed])
    assert (restored.source, restored.reasoning, restored.message) == ("fingerprint", "think", MESSAGE)
    assert ledger.restore(text="Let me look.", tool_calls=[{"name": "Bash", "input": {"command": "rm"}}]) is None
    assert ledger.misses == 1


def test_echo_is_used_and_upgraded_to_exact_message_when_it_agrees(db_path, clock):
    ledger = make_ledger(db_path, clock)
    ledger.record(reasoning="same", text="hi", message={"role": "assistant", "content": "hi"})
    assert ledger.restore(echoed_reasoning="same", text="hi").source == "fingerprint"
    disagreeing = ledger.restore(echoed_reasoning="other", text="hi")
    assert (disagreeing.source, disagreeing.reasoning, disagreeing.message) == ("echo", "other", None)
    assert ledger.restore() is None and ledger.misses == 0


def test_restart_restores_from_the_same_file(db_path, clock):
    ledger = make_ledger(db_path, clock)
    turn = ledger.new_id()
    sig = ledger.sign("reasoning before restart", turn)
    ledger.record(turn, reasoning="reasoning before restart", text="answer", tool_calls=[CALL], message=MESSAGE)
    ledger.db.close()
    again = make_ledger(db_path, clock)
    assert again.restore(signatures=[sig]).message == MESSAGE
    assert again.restore(text="answer", tool_calls=[CALL]).source == "fingerprint"


def test_ttl_and_size_bounds_evict(db_path, clock):
    ledger = make_ledger(db_path, clock, max_entries=3, ttl_seconds=100)
    for n in range(3):
        clock.now += 1
        ledger.record(f"id{n}", reasoning=f"r{n}", text=f"t{n}", message={"content": f"t{n}"})
    clock.now += 1
    assert ledger.restore(text="t0").reasoning == "r0"          # touch id0: now most recent
    for n in (3, 4):
        clock.now += 1
        ledger.record(f"id{n}", reasoning=f"r{n}", text=f"t{n}", message={"content": f"t{n}"})
    assert ledger.count() == 3
    assert ledger.restore(text="t1") is None and ledger.restore(text="t2") is None
    assert ledger.restore(text="t0").reasoning == "r0"
    clock.now += 101
    assert ledger.restore(text="t4") is None
    ledger.record("id5", reasoning="r5", text="t5")
    assert ledger.count() == 1


def test_shared_fingerprint_belongs_to_the_newest_entry(db_path, clock):
    ledger = make_ledger(db_path, clock, max_entries=2)
    ledger.record("old", reasoning="old", text="same", message={"content": "same"})
    clock.now += 1
    ledger.record("new", reasoning="new", text="same", message={"content": "same"})
    clock.now += 1
    ledger.record("other", reasoning="o", text="different")         # evicts "old"
    assert ledger.restore(text="same").reasoning == "new"


def test_file_is_private_from_creation(tmp_path, clock):
    path = tmp_path / "fresh" / "ledger.sqlite"
    ledger = make_ledger(path, clock)
    ledger.record(reasoning="secret thoughts", text="t")
    side_files = [p for p in path.parent.iterdir() if p.name.startswith("ledger.sqlite-")]
    assert side_files, "WAL mode keeps -wal/-shm files beside the database"
    for p in [path] + side_files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    loose = tmp_path / "loose.sqlite"
    loose.touch(mode=0o644)
    Database(loose)
    assert stat.S_IMODE(loose.stat().st_mode) == 0o600


def test_inline_reasoning_field_restores_by_fingerprint(db_path, clock):
    ledger = make_ledger(db_path, clock)
    upstream_content = "<think>Plan: greet.</think>Hello there."
    reasoning, text = split_think(upstream_content)
    ledger.record(reasoning=reasoning, text=text, message={"role": "assistant", "content": text})
    for client_text in ("Hello there.", upstream_content):     # plain client, inline-tags client
        restored = ledger.restore(text=client_text)
        assert (restored.source, restored.reasoning) == ("fingerprint", "Plan: greet.")
        upstream = apply_reasoning_field(restored.message, restored.reasoning, "inline")
        assert upstream == {"role": "assistant", "content": upstream_content}


def test_apply_reasoning_field_sentinels_never_become_keys():
    message = {"role": "assistant", "content": None, "reasoning_content": "stale"}
    assert apply_reasoning_field(message, "R", "none") == {"role": "assistant", "content": None}
    assert apply_reasoning_field(message, "R", "inline")["content"] == "<think>R</think>"
    assert apply_reasoning_field(message, "R", "reasoning") == {"role": "assistant", "content": None, "reasoning": "R"}
    assert apply_reasoning_field(message, "R", "auto")["reasoning_content"] == "R"
    assert message["reasoning_content"] == "stale"


def test_fingerprint_is_stable_and_sensitive():
    a = fingerprint("hi ", [{"function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}])
    assert a == fingerprint("hi", [{"name": "f", "input": {"a": 2, "b": 1}}])
    assert a != fingerprint("hi", [{"name": "f", "input": {"a": 2, "b": 3}}])
    assert a != fingerprint("hi!", [{"name": "f", "input": {"a": 2, "b": 1}}])


def test_response_store_chain_get_delete_and_restart(db_path, clock):
    store = ResponseStore(Database(db_path, clock=clock), ttl_seconds=100)
    store.put("resp_1", input_items=[{"role": "user", "content": "a"}], output_items=[{"type": "message", "n": 1}],
              response={"id": "resp_1", "object": "response"})
    store.put("resp_2", input_items=[{"role": "user", "content": "b"}], output_items=[{"type": "message", "n": 2}],
              previous_id="resp_1")
    assert [i.get("content", i.get("n")) for i in store.history("resp_2")] == ["a", 1, "b", 2]
    assert store.get("resp_1").response == {"id": "resp_1", "object": "response"}
    assert store.history("missing") is None
    store.db.close()
    reopened = ResponseStore(Database(db_path, clock=clock), ttl_seconds=100)
    assert reopened.get("resp_2").previous_id == "resp_1"
    assert reopened.delete("resp_1") and not reopened.delete("resp_1")
    assert [i.get("content", i.get("n")) for i in reopened.history("resp_2")] == ["b", 2]
    clock.now += 101
    assert reopened.get("resp_2") is None


def test_response_store_survives_cycles_and_bounds_rows(db_path, clock):
    store = ResponseStore(Database(db_path, clock=clock), max_entries=2)
    store.put("a", input_items=[1], output_items=[], previous_id="b")
    store.put("b", input_items=[2], output_items=[], previous_id="a")
    assert sorted(store.history("a")) == [1, 2]
    store.put("c", input_items=[3], output_items=[])
    assert store.db.count("responses") == 2


def test_ledger_and_store_share_one_file_across_threads(db_path):
    db = Database(db_path)
    ledger, store = Ledger(db), ResponseStore(db)
    errors = []

    def work(n):
        try:
            for i in range(40):
                ledger.record(reasoning=f"r{n}.{i}", text=f"t{n}.{i}")
                store.put(f"resp_{n}_{i}", input_items=[], output_items=[])
                assert ledger.restore(text=f"t{n}.{i}").reasoning == f"r{n}.{i}"
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and ledger.count() == 160 and db.count("responses") == 160


def test_default_path_rules(tmp_path):
    assert str(default_db_path({"STATE_DIRECTORY": "/var/lib/kimi:/other"})) == "/var/lib/kimi/ledger.sqlite"
    assert str(default_db_path({"XDG_STATE_HOME": str(tmp_path)})) == str(tmp_path / "kimi" / "ledger.sqlite")
    assert str(default_db_path({})).endswith(".local/state/kimi/ledger.sqlite")
    with pytest.raises(ValueError):
        Ledger(Database(tmp_path / "x.sqlite"), max_entries=0)


def test_inline_mode_message_stored_with_think_is_not_doubled(db_path, clock):
    ledger = make_ledger(db_path, clock)
    stored = {"role": "assistant", "content": "<think>R</think>Hello", "tool_calls": [CALL]}
    ledger.record(reasoning="R", text="Hello", tool_calls=[CALL], message=stored)
    restored = ledger.restore(text="Hello", tool_calls=[CALL])
    assert apply_reasoning_field(restored.message, restored.reasoning, "inline")["content"] == "<think>R</think>Hello"
    plain = apply_reasoning_field(restored.message, restored.reasoning, "reasoning_content")
    assert (plain["content"], plain["reasoning_content"]) == ("Hello", "R")
