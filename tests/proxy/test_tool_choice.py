"""tool_choice as each dialect's API answers it: a choice that forces a call where the request
has no tools, or names a tool it does not have, is a 400 in the caller's shape (it went
upstream as auto and came back as text: tried as a new user would); an allowed_tools choice
(OpenAI Chat and Responses) keeps the tools it lists and goes as its mode; one that forces only
a hosted tool (left out) goes as auto, as the hosted tools themselves do."""
import pytest

from proxy.app import create_app
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

FN = {"type": "object", "properties": {}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RESP = {"model": "m", "input": "hi"}
ANTH = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": FN}} for n in ("a", "b", "c")]
RESP_TOOLS = [{"type": "function", "name": n, "parameters": FN} for n in ("a", "b", "c")]
ANTH_TOOLS = [{"name": n, "input_schema": FN} for n in ("a", "b", "c")]


@pytest.fixture
def post(tmp_path):
    fake = FakeUpstream(Reply.text("ok"))
    app = create_app(proxy_config("http://127.0.0.1:9/v1", tmp_path))
    app.extensions["kimi"].upstream = fake.client()
    client = app.test_client()

    def post(route: str, body: dict):
        headers = {"anthropic-version": "2023-06-01"} if route == "/v1/messages" else {}
        resp = client.post(route, json=body, headers=headers)
        return resp.status_code, resp.get_json(), fake.requests[-1] if fake.requests else None
    return post


REFUSED = [
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}),
    ("/v1/chat/completions", {**CHAT, "tool_choice": {"type": "function", "function": {"name": "a"}}}),
    ("/v1/chat/completions", {**CHAT, "tools": CHAT_TOOLS,
                              "tool_choice": {"type": "function", "function": {"name": "zz"}}}),
    ("/v1/responses", {**RESP, "tool_choice": "required"}),
    ("/v1/responses", {**RESP, "tools": RESP_TOOLS, "tool_choice": {"type": "function", "name": "zz"}}),
    ("/v1/messages", {**ANTH, "tool_choice": {"type": "any"}}),
    ("/v1/messages", {**ANTH, "tools": ANTH_TOOLS, "tool_choice": {"type": "tool", "name": "zz"}}),
    ("/v1/chat/completions", {**CHAT, "tools": CHAT_TOOLS, "tool_choice": {
        "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "zz"}}]}}}),
    ("/v1/responses", {**RESP, "tools": RESP_TOOLS, "tool_choice": {
        "type": "allowed_tools", "mode": "sometimes", "tools": [{"type": "function", "name": "a"}]}}),
    # odd shapes: 400s naming the field, never a 500 or a silent drop of every tool
    ("/v1/chat/completions", {**CHAT, "tools": CHAT_TOOLS,
                              "tool_choice": {"type": "function", "function": {"name": ["a"]}}}),
    ("/v1/chat/completions", {**CHAT, "tools": CHAT_TOOLS,
                              "tool_choice": {"type": "custom", "custom": {"name": {}}}}),
    ("/v1/chat/completions", {**CHAT, "tools": CHAT_TOOLS, "tool_choice": {
        "type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": ["function"], "name": "a"}]}}}),
    ("/v1/responses", {**RESP, "tools": RESP_TOOLS, "tool_choice": {
        "type": "allowed_tools", "mode": "auto", "tools": ["a", 3, None]}}),
    ("/v1/chat/completions", {**CHAT, "tools": CHAT_TOOLS, "tool_choice": {
        "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": "a"}]}}}),
]


@pytest.mark.parametrize("route,body", REFUSED)
def test_a_choice_that_cannot_be_met_is_a_400_in_the_callers_shape(post, route, body):
    status, answer, sent = post(route, body)
    assert status == 400 and sent is None, answer
    if route == "/v1/messages":
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
        assert "tool_choice" in answer["error"]["message"]
    else:
        assert answer["error"]["param"] == "tool_choice"


def test_chat_allowed_tools_keep_the_listed_tools_and_go_as_their_mode(post):
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "c"}}, {"type": "function", "function": {"name": "a"}}]}}
    status, _, sent = post("/v1/chat/completions", {**CHAT, "tools": CHAT_TOOLS, "tool_choice": choice})
    assert status == 200
    assert [t["function"]["name"] for t in sent["tools"]] == ["a", "c"] and sent["tool_choice"] == "required"


def test_responses_allowed_tools_leave_hosted_ones_out_with_the_rest(post):
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [
        {"type": "function", "name": "b"}, {"type": "image_generation"}]}
    body = {**RESP, "tools": [*RESP_TOOLS, {"type": "web_search"}], "tool_choice": choice}
    status, answer, sent = post("/v1/responses", body)
    assert status == 200
    assert [t["function"]["name"] for t in sent["tools"]] == ["b"] and sent["tool_choice"] == "auto"
    assert answer["tool_choice"] == choice  # the envelope echoes what the client sent


@pytest.mark.parametrize("route,body", [
    ("/v1/messages", {**ANTH, "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                      "tool_choice": {"type": "any"}}),
    ("/v1/messages", {**ANTH, "tools": [*ANTH_TOOLS, {"type": "web_search_20250305", "name": "web_search"}],
                      "tool_choice": {"type": "tool", "name": "web_search"}}),
    ("/v1/responses", {**RESP, "tools": [{"type": "web_search"}], "tool_choice": "required"}),
])
def test_forcing_only_a_hosted_tool_goes_as_auto(post, route, body):
    status, answer, sent = post(route, body)
    assert status == 200, answer
    assert "tool_choice" not in sent


@pytest.mark.parametrize("route,body,expect", [
    ("/v1/chat/completions", {**CHAT, "tools": CHAT_TOOLS, "tool_choice": "required"}, "required"),
    ("/v1/responses", {**RESP, "tools": RESP_TOOLS, "tool_choice": {"type": "function", "name": "b"}},
     {"type": "function", "function": {"name": "b"}}),
    ("/v1/messages", {**ANTH, "tools": ANTH_TOOLS, "tool_choice": {"type": "any"}}, "required"),
])
def test_a_choice_that_can_be_met_goes_upstream(post, route, body, expect):
    status, _, sent = post(route, body)
    assert status == 200 and sent["tool_choice"] == expect and len(sent["tools"]) == 3
