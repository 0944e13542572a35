"""The official openai and anthropic SDKs drive the proxy over real loopback sockets,
with a scripted fake upstream behind it: stream and non-stream, tools, two-turn loops."""
import json

import anthropic
import openai
import pytest

from proxy.app import create_app
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config, serve_app

ARGS = '{"command":  "ls -la"}'  # non-canonical spacing: must reach the client byte for byte
TOOLS_CHAT = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                                "parameters": {"type": "object",
                                                               "properties": {"command": {"type": "string"}}}}}]


@pytest.fixture
def stack(tmp_path):
    fake = FakeUpstream()
    with fake.serve() as upstream_url:
        app = create_app(proxy_config(upstream_url, tmp_path))
        with serve_app(app) as base:
            yield fake, base


def oa(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=10)


def an(base):
    return anthropic.Anthropic(base_url=base, api_key="x", max_retries=0, timeout=10)


def test_chat_non_stream_and_stream(stack):
    fake, base = stack
    fake.script = [Reply.text("Hello there!", reasoning="Greeting.")]
    out = oa(base).chat.completions.create(model="kimi", messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "Hello there!"
    assert out.choices[0].finish_reason == "stop" and out.usage.prompt_tokens == 7
    chunks = list(oa(base).chat.completions.create(model="kimi", stream=True, stream_options={"include_usage": True},
                                                   messages=[{"role": "user", "content": "hi"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there!"
    assert chunks[-1].usage.completion_tokens == 5
    assert fake.requests[-1]["stream"] is True and fake.requests[-1]["model"] == "fake"  # the upstream's own
    assert out.model == "kimi" and chunks[0].model == "kimi"  # the client sees the name it asked for


def test_chat_two_turn_tool_loop_restores_reasoning(stack):
    fake, base = stack
    fake.script = [Reply.tools([("call_1", "bash", ARGS)]), Reply.text("done")]
    fake.script[0].deltas.insert(0, {"reasoning_content": "I should list files."})
    client = oa(base)
    msgs = [{"role": "user", "content": "list"}]
    chunks = list(client.chat.completions.create(model="kimi", stream=True, messages=msgs, tools=TOOLS_CHAT))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].id == "call_1" and calls[0].function.name == "bash"
    assert "".join(tc.function.arguments or "" for tc in calls) == ARGS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # The SDK user re-serialises arguments and drops reasoning; the ledger restores both.
    msgs += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "bash", "arguments": json.dumps(json.loads(ARGS))}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}]
    out = client.chat.completions.create(model="kimi", messages=msgs, tools=TOOLS_CHAT)
    assert out.choices[0].message.content == "done"
    sent = fake.requests[-1]["messages"][1]
    assert sent["reasoning_content"] == "I should list files."
    assert sent["tool_calls"][0]["function"]["arguments"] == ARGS
    assert fake.requests[-1]["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}


def test_anthropic_non_stream_and_stream(stack):
    fake, base = stack
    fake.script = [Reply.text("Hi!", reasoning="Think.")]
    msg = an(base).messages.create(model="claude-x", max_tokens=100, messages=[{"role": "user", "content": "hi"}],
                                   thinking={"type": "enabled", "budget_tokens": 2048})
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "Think." and msg.content[0].signature
    assert msg.content[1].text == "Hi!" and msg.stop_reason == "end_turn"
    with an(base).messages.stream(model="claude-x", max_tokens=100,
                                  messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == "Hi!"
    assert final.usage.output_tokens == 5
    assert fake.requests[0]["reasoning_effort"] == "low"


def test_anthropic_two_turn_tool_loop(stack):
    fake, base = stack
    fake.script = [Reply.tools([("call_9", "bash", ARGS)]), Reply.text("ok")]
    fake.script[0].deltas.insert(0, {"reasoning_content": "Use bash."})
    tools = [{"name": "bash", "description": "run", "input_schema": {"type": "object",
                                                                    "properties": {"command": {"type": "string"}}}}]
    client = an(base)
    msgs = [{"role": "user", "content": "list"}]
    with client.messages.stream(model="c", max_tokens=100, messages=msgs, tools=tools) as s:
        first = s.get_final_message()
    assert first.stop_reason == "tool_use"
    use = first.content[-1]
    assert use.type == "tool_use" and use.input == {"command": "ls -la"} and use.name == "bash"
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "boom",
                                           "is_error": True}]}]
    second = client.messages.create(model="c", max_tokens=100, messages=msgs, tools=tools)
    assert second.content[0].text == "ok"
    sent = fake.requests[-1]["messages"]
    assert sent[1]["reasoning_content"] == "Use bash."
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == ARGS and sent[1]["tool_calls"][0]["id"] == "call_9"
    assert sent[2]["role"] == "tool" and sent[2]["tool_call_id"] == "call_9" and "boom" in sent[2]["content"]


def test_responses_stream_tool_loop_and_previous_response_id(stack):
    fake, base = stack
    fake.script = [Reply.tools([("call_5", "exec_command", ARGS)]), Reply.text("all done"), Reply.text("again")]
    fake.script[0].deltas.insert(0, {"reasoning_content": "Run it."})
    client = oa(base)
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}]
    with client.responses.stream(model="gpt-x", input="go", tools=tools) as s:
        first = s.get_final_response()
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "function_call"]
    assert first.output[0].encrypted_content and first.output[1].arguments == ARGS
    call = first.output[1]
    second = client.responses.create(model="gpt-x", tools=tools, store=False, input=[
        {"role": "user", "content": "go"}, first.output[0].model_dump(exclude_none=True),
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": '{"command":"ls -la"}'},
        {"type": "function_call_output", "call_id": call.call_id, "output": "files"}])
    assert second.output_text == "all done"
    sent = fake.requests[1]["messages"]
    assert sent[1]["reasoning_content"] == "Run it." and sent[1]["tool_calls"][0]["function"]["arguments"] == ARGS
    third = client.responses.create(model="gpt-x", previous_response_id=first.id, input="and?")
    assert third.output_text == "again"
    roles = [m["role"] for m in fake.requests[2]["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert client.responses.retrieve(first.id).id == first.id
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_both_sdks_retrieve_a_model(stack):
    """models.retrieve was a 404 (no route): any name is served, as requests are."""
    _, base = stack
    openai_model = oa(base).models.retrieve("kimi-local")
    assert (openai_model.id, openai_model.object) == ("kimi-local", "model")
    anthropic_model = an(base).models.retrieve("claude-sonnet-4-5")
    assert (anthropic_model.id, anthropic_model.type) == ("claude-sonnet-4-5", "model")
    assert [m.id for m in oa(base).models.list()] == ["kimi-local"]


def test_a_refused_model_lookup_answers_in_the_anthropic_shape(tmp_path):
    from proxy.app import create_app
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path, API_KEY="right"))
    resp = app.test_client().get("/v1/models/claude-x", headers={"x-api-key": "wrong",
                                                                  "anthropic-version": "2023-06-01"})
    assert resp.status_code == 401 and resp.get_json()["type"] == "error"


def test_chat_continuous_usage_reaches_the_client(stack):
    """vLLM's stream_options.continuous_usage_stats went nowhere: the proxy now asks the upstream
    for it and gives each chunk the usage so far (once the upstream sent one)."""
    from tests.support.proxy_fakes import USAGE
    fake, base = stack
    so_far = lambda n: {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}  # noqa: E731
    fake.script = [Reply([{"content": "Hel", USAGE: so_far(1)}, {"content": "lo", USAGE: so_far(2)}])]
    chunks = list(oa(base).chat.completions.create(
        model="kimi", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert fake.requests[-1]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    seen = [(c.choices[0].delta.content if c.choices else None, c.usage and c.usage.completion_tokens)
            for c in chunks]
    assert seen[1:3] == [("Hel", 1), ("lo", 2)] and seen[-1][1] == 5  # the final usage chunk
    plain = list(oa(base).chat.completions.create(
        model="kimi", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}))
    assert fake.requests[-1]["stream_options"] == {"include_usage": True}
    assert all(c.usage is None for c in plain[:-1])
