"""Golden transcripts per dialect (in-process, scripted fake upstream): the exact event
order, the exact non-stream shape, and no fields from other dialects."""
import json

import pytest

from proxy import sse
from proxy.app import create_app
from proxy.cassettes.replay import Normaliser
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANTH_BODY = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
RESP_BODY = {"model": "m", "input": "hi"}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("f", "g")]
ANTH_TOOLS = [{"name": n, "input_schema": {"type": "object"}} for n in ("f", "g")]
RESP_TOOLS = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("f", "g")]
FOREIGN = {"anthropic": {"choices", "object", "sequence_number", "output"},
           "chat": {"sequence_number", "content_block", "output", "response", "stop_sequence"},
           "responses": {"choices", "content_block", "message", "index"}}


@pytest.fixture
def run(tmp_path):
    fake = FakeUpstream()
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path))
    app.extensions["kimi"].upstream = fake.client()
    client = app.test_client()

    def go(path, body, *replies, headers=None):
        fake.script = list(replies)
        resp = client.post(path, json=body, headers=headers or {})
        assert resp.status_code == 200, resp.get_data(as_text=True)
        if not body.get("stream"):
            return resp.get_json()
        return [(e, d if d == "[DONE]" else json.loads(d)) for e, d in sse.parse_frames(resp.get_data())]
    go.fake = fake
    go.decode = app.extensions["kimi"].reasoning.ledger.decode
    return go


def keys_deep(obj) -> set:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in keys_deep(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in keys_deep(v)}
    return set()


def assert_no_foreign(dialect, frames):
    for _e, data in frames:
        assert not keys_deep(data) & FOREIGN[dialect], data


def anthropic_shape(frames):
    out = []
    for event, data in frames:
        assert data["type"] == event
        if event == "content_block_start":
            out.append(f"start:{data['index']}:{data['content_block']['type']}")
        elif event == "content_block_delta":
            out.append(f"delta:{data['index']}:{data['delta']['type']}")
        elif event == "content_block_stop":
            out.append(f"stop:{data['index']}")
        else:
            out.append(event)
    return out


def test_anthropic_stream_reasoning_text_tool(run):
    reply = Reply.tools([("c1", "f", '{"a": 1}')], text="Sure.")
    reply.deltas.insert(0, {"reasoning_content": "Plan."})
    frames = run("/v1/messages", {**ANTH_BODY, "stream": True, "tools": ANTH_TOOLS}, reply)
    assert anthropic_shape(frames) == [
        "message_start", "ping",
        "start:0:thinking", "delta:0:thinking_delta", "delta:0:signature_delta", "stop:0",
        "start:1:text", "delta:1:text_delta", "stop:1",
        "start:2:tool_use", "delta:2:input_json_delta", "delta:2:input_json_delta", "stop:2",
        "message_delta", "message_stop"]
    start = frames[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["model"] == "m"
    assert frames[4][1]["delta"]["signature"].startswith("klr2.")
    assert frames[9][1]["content_block"] == {"type": "tool_use", "id": "toolu_c1", "name": "f", "input": {}}
    assert "".join(d["delta"]["partial_json"] for _e, d in frames[10:12]) == '{"a": 1}'
    assert frames[-2][1] == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                             "usage": {"input_tokens": 7, "output_tokens": 5}}
    assert_no_foreign("anthropic", frames)


def test_anthropic_stop_sequence_and_disabled_thinking(run):
    reply = Reply.text("abc", reasoning="hidden", extra_choice={"stop_reason": "</x>"})
    body = {**ANTH_BODY, "stream": True, "stop_sequences": ["</x>"], "thinking": {"type": "disabled"}}
    frames = run("/v1/messages", body, reply)
    assert anthropic_shape(frames) == ["message_start", "ping", "start:0:text", "delta:0:text_delta",
                                       "stop:0", "message_delta", "message_stop"]
    assert frames[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "</x>"}
    assert "reasoning_effort" not in run.fake.requests[-1] and run.fake.requests[-1]["stop"] == ["</x>"]
    body = {**ANTH_BODY, "stop_sequences": ["</x>"], "thinking": {"type": "adaptive"}}
    out = run("/v1/messages", body, Reply.text("abc", reasoning="r", extra_choice={"stop_reason": "</x>"}))
    assert set(out) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert [b["type"] for b in out["content"]] == ["thinking", "text"]
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", "</x>")


def test_anthropic_interleaved_parallel_calls_do_not_mix(run):
    reply = Reply.tools([("c1", "f", '{"x": 1}'), ("c2", "g", '{"y": 2}')], interleave=True)
    frames = run("/v1/messages", {**ANTH_BODY, "stream": True, "tools": ANTH_TOOLS}, reply)
    blocks: dict = {}
    for event, data in frames:
        if event == "content_block_start":
            blocks[data["index"]] = [data["content_block"]["name"], ""]
        elif event == "content_block_delta":
            blocks[data["index"]][1] += data["delta"]["partial_json"]
    assert blocks == {0: ["f", '{"x": 1}'], 1: ["g", '{"y": 2}']}
    assert anthropic_shape(frames).count("stop:0") == 1 and anthropic_shape(frames).index("stop:0") < \
        anthropic_shape(frames).index("start:1:tool_use")


def test_chat_stream_golden(run):
    reply = Reply.tools([("c1", "f", '{"x": 1}'), ("c2", "g", '{"y": 2}')], interleave=True)
    reply.deltas.insert(0, {"reasoning_content": "R"})
    body = {**CHAT_BODY, "stream": True, "tools": TOOLS, "stream_options": {"include_usage": True}}
    frames = run("/v1/chat/completions", body, reply)
    assert all(e is None for e, _d in frames) and frames[-1][1] == "[DONE]"
    deltas = [d["choices"][0]["delta"] if d["choices"] else "usage" for _e, d in frames[:-1]]
    assert deltas[:2] == [{"role": "assistant", "content": ""}, {"reasoning_content": "R"}]
    args = {0: "", 1: ""}
    for delta in deltas:
        for tc in (delta.get("tool_calls", []) if isinstance(delta, dict) else []):
            args[tc["index"]] += tc["function"]["arguments"]
    assert args == {0: '{"x": 1}', 1: '{"y": 2}'}
    assert frames[-3][1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "tool_calls"}
    assert deltas[-1] == "usage" and frames[-2][1]["usage"]["total_tokens"] == 12
    assert_no_foreign("chat", frames[:-1])
    ids = {d["id"] for _e, d in frames[:-1]}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")


def test_chat_include_usage_false_and_non_stream_shape(run):
    body = {**CHAT_BODY, "stream": True, "stream_options": {"include_usage": False}}
    frames = run("/v1/chat/completions", body, Reply.text("hi"))
    assert all(d == "[DONE]" or d["choices"] for _e, d in frames)
    out = run("/v1/chat/completions", {**CHAT_BODY, "tools": TOOLS}, Reply.tools([("c1", "f", "{}")]))
    assert set(out) == {"id", "object", "created", "model", "choices", "usage"}
    msg = out["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert out["choices"][0]["finish_reason"] == "tool_calls"


def responses_checks(frames):
    seqs = [d["sequence_number"] for _e, d in frames]
    assert seqs == list(range(len(frames)))
    assert [e for e, _d in frames[:2]] == ["response.created", "response.in_progress"]
    terminal = [e for e, _d in frames if e in ("response.completed", "response.incomplete", "response.failed")]
    assert terminal == [frames[-1][0]]
    added = [d["item"]["id"] for e, d in frames if e == "response.output_item.added"]
    done = [d["item"] for e, d in frames if e == "response.output_item.done"]
    assert added == [i["id"] for i in done]
    assert frames[-1][1]["response"]["output"] == done
    assert len({d["response"]["id"] for e, d in frames if "response" in d}) == 1
    assert_no_foreign("responses", frames)
    return done


def test_responses_stream_golden_and_equal_to_non_stream(run):
    def reply():
        r = Reply.tools([("c1", "f", '{"x":  1}'), ("c2", "g", '{"y": 2}')], interleave=True, text="Hi")
        r.deltas.insert(0, {"reasoning_content": "R"})
        return r
    frames = run("/v1/responses", {**RESP_BODY, "stream": True, "tools": RESP_TOOLS}, reply())
    done = responses_checks(frames)
    assert [i["type"] for i in done] == ["reasoning", "message", "function_call", "function_call"]
    assert [i.get("arguments") for i in done[2:]] == ['{"x":  1}', '{"y": 2}']
    events = [e for e, _d in frames]
    assert events[2:8] == ["response.output_item.added", "response.reasoning_summary_part.added",
                           "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done",
                           "response.reasoning_summary_part.done", "response.output_item.done"]
    streamed = frames[-1][1]["response"]
    body = run("/v1/responses", {**RESP_BODY, "tools": RESP_TOOLS}, reply())
    assert Normaliser(run.decode)(body) == Normaliser(run.decode)(streamed)
    assert body["output"][0]["encrypted_content"] != streamed["output"][0]["encrypted_content"]  # per turn


def test_responses_named_tool_choice_and_incomplete(run):
    body = {**RESP_BODY, "stream": True, "tools": RESP_TOOLS, "tool_choice": {"type": "function", "name": "g"}}
    frames = run("/v1/responses", body, Reply.text("cut", finish="length"))
    responses_checks(frames)
    assert frames[-1][0] == "response.incomplete"
    assert frames[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert run.fake.requests[-1]["tool_choice"] == {"type": "function", "function": {"name": "g"}}


def test_chat_logprobs_pass_through(run):
    entry = {"token": "hi", "logprob": -0.1, "bytes": [104, 105], "top_logprobs": []}
    def reply():
        return Reply.text("hi", extra_choice={"logprobs": {"content": [entry]}})
    out = run("/v1/chat/completions", {**CHAT_BODY, "logprobs": True}, reply())
    assert out["choices"][0]["logprobs"] == {"content": [entry]}
    assert run.fake.requests[-1]["logprobs"] is True
    frames = run("/v1/chat/completions", {**CHAT_BODY, "stream": True, "logprobs": True}, reply())
    got = [d["choices"][0]["logprobs"] for _e, d in frames[:-1] if d["choices"] and "logprobs" in d["choices"][0]]
    assert got == [{"content": [entry]}]
    assert run("/v1/chat/completions", CHAT_BODY, Reply.text("x"))["choices"][0]["logprobs"] is None
    anth = run("/v1/messages", {**ANTH_BODY, "stream": True}, reply())
    assert_no_foreign("anthropic", anth) and not any("logprobs" in keys_deep(d) for _e, d in anth)
