"""Responses `truncation: "auto"` (Cline's OpenAI-native provider sends it with every request):
a conversation that outgrows the context loses turns from its middle, as OpenAI documents,
instead of the overflow error; it was consumed and ignored. Served by the scripted vLLM server
of test_upstream_context (its /tokenize and its own refusal of a prompt that does not fit)."""
import pytest

from tests.proxy.test_upstream_context import Server, count, proxy_for

N_CTX = 2048
TEXT = "word " * 400  # ~500 tokens a message in the fake's count


def turns(n: int, agent: bool = False) -> list[dict]:
    """A task, then n turns: each a question (or, for an agent, only the model's call and its
    result), a call, its result and an answer; an agent's conversation ends on a result."""
    items = [{"role": "user", "content": f"the task: {TEXT}"}]
    for i in range(n):
        if not agent:
            items.append({"role": "user", "content": f"question {i}: {TEXT}"})
        items += [{"type": "function_call", "call_id": f"c{i}", "name": "ls", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"c{i}", "output": f"out {i}: {TEXT}"}]
        if not agent:
            items.append({"role": "assistant", "content": f"answer {i}: {TEXT}"})
    return items + ([] if agent else [{"role": "user", "content": "the last question"}])


BODY = {"model": "k3", "instructions": "Be brief.", "max_output_tokens": 256, "truncation": "auto",
        "tools": [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]}


def sent_for(tmp_path, body: dict) -> list[dict]:
    server = Server("vllm", N_CTX)
    with proxy_for(tmp_path, server) as client:
        resp = client.post("/v1/responses", json=body)
        assert resp.status_code == 200, resp.get_data(as_text=True)
    return server.chats[-1]["messages"]


def check_pairs(sent: list[dict]):
    """Every tool result follows the call it answers; the tail starts at no result."""
    called = set()
    for m in sent:
        called |= {c["id"] for c in m.get("tool_calls") or ()}
        if m["role"] == "tool":
            assert m["tool_call_id"] in called, sent
    assert sent[2]["role"] in ("user", "assistant")


def test_what_sets_the_task_stays_and_so_does_the_last_question(tmp_path):
    """Codex's layout (its environment, then the task, both before the first reply), and a
    conversation whose input ends on an assistant message: the latest user message stays."""
    env = {"role": "user", "content": "<environment_context>cwd</environment_context>"}
    items = [env, *turns(6)[:-1], {"role": "user", "content": "the last question"},
             {"role": "assistant", "content": "Sure"}]
    sent = sent_for(tmp_path, {**BODY, "input": items})
    assert [m["content"][:12] for m in sent[1:3]] == ["<environment", "the task: wo"]
    assert [m.get("content") for m in sent[-2:]] == ["the last question", "Sure"]
    check_pairs(sent)


@pytest.mark.parametrize("agent", [False, True], ids=["chat", "agent"])
def test_auto_drops_middle_turns_until_the_prompt_and_reply_fit(tmp_path, agent):
    items = turns(6, agent)
    sent = sent_for(tmp_path, {**BODY, "input": items})
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert sent[1]["content"].startswith("the task: ")  # the first user message stays
    last = sent[-1]
    assert (last["role"], last.get("content")) == (("tool", f"out 5: {TEXT}") if agent else ("user", "the last question"))
    check_pairs(sent)
    dropped = count(sent[2:4]) - count([])  # about one turn's tokens: as few went as let it fit
    assert N_CTX - 256 - 2 * dropped < count(sent) <= N_CTX - 256


@pytest.mark.parametrize("truncation", [None, "disabled"])
def test_without_auto_the_overflow_error_stands(tmp_path, truncation):
    server = Server("vllm", N_CTX)
    body = {k: v for k, v in {**BODY, "input": turns(6), "truncation": truncation}.items() if v is not None}
    with proxy_for(tmp_path, server) as client:
        resp = client.post("/v1/responses", json=body)
    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "context_length_exceeded"
    assert server.chats == []


def test_what_cannot_fit_even_so_is_still_the_overflow(tmp_path):
    server = Server("vllm", N_CTX)
    body = {**BODY, "input": [*turns(1), {"role": "user", "content": "w " * 6000}]}
    with proxy_for(tmp_path, server) as client:
        resp = client.post("/v1/responses", json=body)
        bad = client.post("/v1/responses", json={**BODY, "input": "hi", "truncation": "sometimes"})
    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "context_length_exceeded"
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "truncation"
    assert server.chats == []
