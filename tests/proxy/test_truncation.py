"""Responses `truncation: "auto"` (Cline's OpenAI-native provider sends it with every request):
a conversation that outgrows the context loses its oldest turns, as OpenAI documents, instead
of the overflow error; it was consumed and ignored. Served by the scripted vLLM server of
test_upstream_context (its /tokenize and its own refusal of a prompt that does not fit)."""
import pytest

from tests.proxy.test_upstream_context import Server, count, proxy_for

N_CTX = 2048
TURN = "word " * 400  # ~500 tokens a message in the fake's count


def history(turns: int) -> list[dict]:
    items = []
    for i in range(turns):
        items += [{"role": "user", "content": f"question {i}: {TURN}"},
                  {"type": "function_call", "call_id": f"c{i}", "name": "ls", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"c{i}", "output": "a.txt"},
                  {"role": "assistant", "content": f"answer {i}: {TURN}"}]
    return items + [{"role": "user", "content": "the last question"}]


BODY = {"model": "k3", "instructions": "Be brief.", "input": history(6), "max_output_tokens": 256,
        "tools": [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]}


def test_auto_drops_the_oldest_turns_until_the_prompt_and_reply_fit(tmp_path):
    server = Server("vllm", N_CTX)
    with proxy_for(tmp_path, server) as client:
        resp = client.post("/v1/responses", json={**BODY, "truncation": "auto"})
        assert resp.status_code == 200, resp.get_data(as_text=True)
    sent = server.chats[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert sent[1]["role"] == "user" and sent[1]["content"].startswith("question ")  # a turn's start
    assert sent[-1]["content"] == "the last question"
    first = int(sent[1]["content"].split()[1].rstrip(":"))
    assert first > 0  # the oldest turns went, as few as leave the reply's room:
    turn = count(sent[1:5]) - count([])  # one whole turn's tokens (each is ~1,000)
    assert N_CTX - 256 - turn < count(sent) <= N_CTX - 256  # one more turn would not fit
    calls = [m for m in sent if m.get("tool_calls")]
    results = [m for m in sent if m["role"] == "tool"]
    assert len(calls) == len(results) == 6 - first  # no result without its call


@pytest.mark.parametrize("truncation", [None, "disabled"])
def test_without_auto_the_overflow_error_stands(tmp_path, truncation):
    server = Server("vllm", N_CTX)
    with proxy_for(tmp_path, server) as client:
        body = {**BODY, **({"truncation": truncation} if truncation else {})}
        resp = client.post("/v1/responses", json=body)
    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "context_length_exceeded"
    assert server.chats == []


def test_a_last_message_that_cannot_fit_alone_is_still_the_overflow(tmp_path):
    server = Server("vllm", N_CTX)
    body = {**BODY, "truncation": "auto", "input": [*history(1)[:-1], {"role": "user", "content": "w " * 6000}]}
    with proxy_for(tmp_path, server) as client:
        resp = client.post("/v1/responses", json=body)
        bad = client.post("/v1/responses", json={**BODY, "truncation": "sometimes"})
    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "context_length_exceeded"
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "truncation"
    assert server.chats == []
