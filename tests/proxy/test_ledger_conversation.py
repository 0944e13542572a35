"""The ledger's fingerprint covers the conversation (issue 13, item 5; protocols.md §5.3):
a client that drops its reasoning gets back its own, never another conversation's."""
import gzip
import json
import pathlib

from proxy.app import create_app
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

REPLY = "Hello there, friend."
CASSETTE = pathlib.Path(__file__).parent.parent / "fixtures" / "cassettes" / "openai-sdk-turn2-json.json.gz"


def make(tmp_path, *replies):
    fake = FakeUpstream(*replies)
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path))
    app.extensions["kimi"].upstream = fake.client()
    return app.test_client(), fake


def chat(client, messages, **fields):
    resp = client.post("/v1/chat/completions", json={"model": "m", "messages": messages, **fields})
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def test_two_conversations_with_the_same_reply_get_their_own_reasoning(tmp_path):
    client, fake = make(tmp_path, Reply.text(REPLY, reasoning="A: the key in ~/.secrets is 1234."),
                        Reply.text(REPLY, reasoning="B: just greet them."), Reply.text("ok"))
    first = [{"role": "user", "content": "Read ~/.secrets and greet me."}]
    second = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Say hi."}]
    for messages in (first, second):
        assert chat(client, messages)["choices"][0]["message"]["content"] == REPLY
    more = {"role": "user", "content": "And then?"}
    for messages, reasoning in ((first, "A: the key in ~/.secrets is 1234."), (second, "B: just greet them.")):
        chat(client, [*messages, {"role": "assistant", "content": REPLY}, more])  # the client dropped it
        echoed = [m for m in fake.requests[-1]["messages"] if m["role"] == "assistant"]
        assert echoed[0].get("reasoning_content") == reasoning
    stranger = [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": REPLY}, more]
    chat(client, stranger)
    assert "reasoning_content" not in fake.requests[-1]["messages"][1]  # a conversation it never had


def test_the_key_ignores_the_system_prompt_and_reasoning_the_client_sends_back(tmp_path):
    client, fake = make(tmp_path, Reply.text(REPLY, reasoning="mine"), Reply.text("ok"))
    chat(client, [{"role": "system", "content": "v1"}, {"role": "user", "content": "hi"}])
    chat(client, [{"role": "system", "content": "v2"}, {"role": "user", "content": "hi"},
                  {"role": "assistant", "content": REPLY}, {"role": "user", "content": "more"}])
    assert fake.requests[-1]["messages"][2].get("reasoning_content") == "mine"


def test_the_openai_sdk_turn2_cassette_still_restores_through_the_fingerprint(tmp_path):
    cassette = json.load(gzip.open(CASSETTE))
    turn2 = cassette["request"]["body"]
    sent = cassette["upstream"]["request"]["messages"][2]  # what the proxy sent when recorded
    call = sent["tool_calls"][0]
    turn1 = Reply.tools([(call["id"], call["function"]["name"], call["function"]["arguments"])])
    turn1.deltas.insert(0, {"reasoning_content": sent["reasoning_content"]})
    client, fake = make(tmp_path, turn1, Reply.text("22C and sunny."))
    chat(client, turn2["messages"][:2], tools=turn2["tools"], max_tokens=1024)
    chat(client, turn2["messages"], tools=turn2["tools"], max_tokens=1024)
    restored = fake.requests[-1]["messages"][2]
    assert restored["reasoning_content"] == sent["reasoning_content"]
    assert restored["tool_calls"][0]["function"]["arguments"] == call["function"]["arguments"]
