"""An Anthropic tool_use `input` is always an object, streamed and not (issue 28, item 2).

With `tool_choice: {"type": "any"}` and one tool, vLLM answered the call's arguments as the
JSON string `"Paris"`. The non-streamed reply wrapped them as {"value": "Paris"}; the stream
passed them on as input_json_delta, so the client's `input` became a string.
"""
import json
import logging

import pytest

from proxy import sse
from proxy.app import create_app
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

BODY = {"model": "k3", "max_tokens": 256, "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "tools": [{"name": "answer", "input_schema": {"type": "object"}}]}


def client_with(tmp_path, reply: Reply):
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path))
    app.extensions["kimi"].upstream = FakeUpstream(reply).client()
    return app.test_client()


def inputs(client, stream: bool) -> tuple[list, list]:
    """(each tool_use input, the input_json_delta fragments) as the client receives them."""
    resp = client.post("/v1/messages", json={**BODY, "stream": stream})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    if not stream:
        return [b["input"] for b in resp.get_json()["content"] if b["type"] == "tool_use"], []
    frames = [(e, json.loads(d)) for e, d in sse.parse_frames(resp.get_data())]
    blocks: dict[int, list] = {}
    for e, d in frames:
        if e == "content_block_start" and d["content_block"]["type"] == "tool_use":
            blocks[d["index"]] = []
        elif e == "content_block_delta" and d["delta"]["type"] == "input_json_delta":
            blocks[d["index"]].append(d["delta"]["partial_json"])
    return [json.loads("".join(parts) or "{}") for parts in blocks.values()], list(blocks.values())


OBJECT = '{"city": "Paris", "country": "France"}'


@pytest.mark.parametrize("raw,expected", [('"Paris"', {"value": "Paris"}), ("42", {"value": 42}),
                                          ('  ["a", "b"]', {"value": ["a", "b"]}), ("null", {"value": None})])
def test_arguments_that_are_not_an_object_are_wrapped_the_same_streamed_and_not(tmp_path, raw, expected):
    """Beside them, an object's arguments still stream in the fragments they came in."""
    client = client_with(tmp_path, Reply.tools([("call_0", "answer", raw), ("call_1", "answer", OBJECT)]))
    assert inputs(client, stream=False)[0] == [expected, json.loads(OBJECT)]
    got, fragments = inputs(client, stream=True)
    assert got == [expected, json.loads(OBJECT)]
    assert fragments[1] == [OBJECT[:len(OBJECT) // 2], OBJECT[len(OBJECT) // 2:]]


def test_a_request_with_wrapped_inputs_logs_it_once(tmp_path, caplog):
    calls = [("call_0", "answer", '"Paris"'), ("call_1", "answer", '{"ok": 1}'), ("call_2", "answer", '"Lyon"')]
    client = client_with(tmp_path, Reply.tools(calls))
    for stream in (False, True):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="kimi.proxy"):
            got, _ = inputs(client, stream)
        assert got == [{"value": "Paris"}, {"ok": 1}, {"value": "Lyon"}]
        wrapped = [r for r in caplog.records if "not a JSON object" in r.getMessage()]
        assert len(wrapped) == 1, [r.getMessage() for r in caplog.records]
