"""Custom (freeform) tools on the Chat Completions route, as OpenAI's Chat API writes them:
the tool goes upstream as a function of one `input` string under the grammar's pattern, a
named custom tool_choice as that function, and the call comes back as a custom tool call
with the raw input, streamed and not; an echoed custom call goes upstream as its function
call. The engine-backed check is tests/grammar/test_freeform.py."""
import json
import re

from proxy import sse
from proxy.app import create_app
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

PATCH = "*** Begin Patch\n*** Add File: hi.txt\n+hi \"there\"\n*** End Patch\n"
LARK = ('start: begin hunk+ end\nbegin: "*** Begin Patch" LF\nend: "*** End Patch" LF?\n'
        'hunk: "*** Add File: " /(.+)/ LF ("+" /(.*)/ LF)+\n%import common.LF\n')
TOOL = {"type": "custom", "custom": {"name": "apply_patch", "description": "Edit files.",
                                     "format": {"type": "grammar", "grammar": {"syntax": "lark",
                                                                              "definition": LARK}}}}
TEXT_TOOL = {"type": "custom", "custom": {"name": "note", "format": {"type": "text"}}}
FUNCTION = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
ASK = {"model": "m", "messages": [{"role": "user", "content": "add hi.txt"}],
       "tools": [TOOL, TEXT_TOOL, FUNCTION]}


def make(tmp_path, *replies):
    fake = FakeUpstream(*replies)
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path))
    app.extensions["kimi"].upstream = fake.client()
    return app.test_client(), fake


def call_reply(name="apply_patch", raw=PATCH):
    return Reply.tools([("call_1", name, json.dumps({"input": raw}))])


def test_a_custom_tool_goes_upstream_as_a_constrained_function(tmp_path):
    client, fake = make(tmp_path, call_reply())
    body = {**ASK, "tool_choice": {"type": "custom", "custom": {"name": "apply_patch"}}}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    sent = {t["function"]["name"]: t["function"] for t in fake.requests[0]["tools"]}
    pattern = sent["apply_patch"]["parameters"]["properties"]["input"]["pattern"]
    assert re.fullmatch(pattern, PATCH) and not re.fullmatch(pattern, "*** Begin Patch\n")
    assert "Input grammar (lark)" in sent["apply_patch"]["description"]
    assert sent["note"]["parameters"]["properties"]["input"] == {"type": "string"}  # free text
    assert fake.requests[0]["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}


def test_the_call_comes_back_custom_with_its_raw_input(tmp_path):
    client, _ = make(tmp_path, call_reply())
    message = client.post("/v1/chat/completions", json=ASK).get_json()["choices"][0]["message"]
    assert message["tool_calls"] == [{"id": "call_1", "type": "custom",
                                      "custom": {"name": "apply_patch", "input": PATCH}}]


def test_a_function_call_beside_stays_a_function(tmp_path):
    client, _ = make(tmp_path, call_reply("f", "x"))
    call = client.post("/v1/chat/completions", json=ASK).get_json()["choices"][0]["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "f"


def test_a_streamed_custom_call_carries_its_input_whole(tmp_path):
    client, _ = make(tmp_path, call_reply())
    raw = sse.parse_frames(client.post("/v1/chat/completions", json={**ASK, "stream": True}).get_data())
    chunks = [json.loads(data) for _event, data in raw if data != "[DONE]"]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    calls = [c for delta in deltas for c in delta.get("tool_calls", ())]
    assert calls[0] == {"index": 0, "id": "call_1", "type": "custom",
                        "custom": {"name": "apply_patch", "input": ""}}
    assert "".join(c["custom"].get("input", "") for c in calls) == PATCH
    assert all("function" not in c for c in calls)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_an_echoed_custom_call_goes_upstream_as_its_function_call(tmp_path):
    client, fake = make(tmp_path, Reply.text("done"))
    history = [ASK["messages"][0],
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "Done!"}]
    assert client.post("/v1/chat/completions", json={**ASK, "messages": history}).status_code == 200
    sent = fake.requests[0]["messages"][1]["tool_calls"][0]
    assert sent["function"]["name"] == "apply_patch"
    assert json.loads(sent["function"]["arguments"]) == {"input": PATCH}
