"""A schema the engine cannot compile is a 400 naming the field the CLIENT sent (issue 27).

The engine names its own Chat field (`response_format.json_schema.schema...`,
`tools[j].function.parameters...`, j counting the tools it was sent); through the proxy the
error names `output_format.schema...`, `text.format.schema...`, `tools[i].input_schema...`,
with i the client's index of the tool, in each dialect's error shape.
"""
import pytest

from proxy.app import create_app
from proxy.client_fields import rename_paths
from tests.proxy.test_errors import VALID, assert_shape
from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config

BAD = {"type": "object", "properties": {"age": {"type": "nope"}}}
GOOD = {"type": "object", "properties": {"q": {"type": "string"}}}
FORMAT = "response_format.json_schema.schema"


@pytest.fixture
def live(tmp_path):
    """The app with the real upstream client, in front of the fake upstream's HTTP server."""
    fake = FakeUpstream()
    with fake.serve() as url:
        yield fake, create_app(proxy_config(url, tmp_path)).test_client()


def refuse(fake: FakeUpstream, where: str) -> None:
    """The engine's answer to a schema that does not compile (engined/serving/structured.py)."""
    fake.script = [Reply(status=400, error_code="invalid_request_error", error_param=where,
                         error_message=f"{where} does not compile: unknown type 'nope'")]


def post(client, route: str, stream: bool, **fields):
    return client.post(route, json={**VALID[route], "stream": stream, **fields})


def error_of(resp, dialect: str) -> dict:
    assert_shape(resp, dialect, 400)
    error = resp.get_json()["error"]
    assert error["type"] == "invalid_request_error", error
    return error


def assert_names(error: dict, client_path: str, engine_path: str, has_param: bool = True):
    assert f"{client_path} does not compile" in error["message"], error
    assert engine_path not in error["message"], error
    if has_param:
        assert error["param"] == client_path, error


def upstream_tool_names(fake: FakeUpstream) -> list[str]:
    return [t["function"]["name"] for t in fake.requests[-1]["tools"]]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("sent,client_field", [
    ({"output_format": {"type": "json_schema", "schema": BAD}}, "output_format.schema"),
    ({"output_config": {"format": {"type": "json_schema", "schema": BAD}}}, "output_config.format.schema"),
])
def test_anthropic_output_format_errors_name_the_clients_field(live, stream, sent, client_field):
    fake, client = live
    refuse(fake, f"{FORMAT}.properties.age")
    error = error_of(post(client, "/v1/messages", stream, **sent), "anthropic")
    assert_names(error, f"{client_field}.properties.age", FORMAT, has_param=False)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_errors_name_input_schema_at_the_clients_index(live, stream):
    """The server tool is left out upstream: the engine's tools[1] is the client's tools[2]."""
    fake, client = live
    refuse(fake, "tools[1].function.parameters.properties.age")
    tools = [{"type": "web_search_20250305", "name": "web_search"},
             {"name": "good", "input_schema": GOOD}, {"name": "bad", "input_schema": BAD}]
    error = error_of(post(client, "/v1/messages", stream, tools=tools), "anthropic")
    assert upstream_tool_names(fake) == ["good", "bad"]
    assert_names(error, "tools[2].input_schema.properties.age", "function.parameters", has_param=False)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_text_format_errors_name_text_format(live, stream):
    fake, client = live
    refuse(fake, f"{FORMAT}.properties.age")
    text = {"format": {"type": "json_schema", "name": "p", "schema": BAD}}
    error = error_of(post(client, "/v1/responses", stream, text=text), "openai")
    assert_names(error, "text.format.schema.properties.age", FORMAT)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tools,upstream_index,client_path", [
    ([{"type": "web_search"}, {"type": "function", "name": "good", "parameters": GOOD},
      {"type": "function", "name": "bad", "parameters": BAD}], 1, "tools[2].parameters"),
    ([{"type": "web_search"}, {"type": "namespace", "name": "ns", "tools": [
        {"type": "function", "name": "good", "parameters": GOOD},
        {"type": "function", "name": "bad", "parameters": BAD}]}], 1, "tools[1].tools[1].parameters"),
])
def test_responses_tool_errors_name_parameters_at_the_clients_index(live, stream, tools, upstream_index,
                                                                     client_path):
    fake, client = live
    refuse(fake, f"tools[{upstream_index}].function.parameters.properties.age")
    error = error_of(post(client, "/v1/responses", stream, tools=tools), "openai")
    assert upstream_tool_names(fake)[upstream_index] == "bad"
    assert_names(error, f"{client_path}.properties.age", "function.parameters")


def test_a_responses_custom_tools_error_names_its_format(live):
    """The proxy wrote that schema from the tool's grammar: the client's field is `format`."""
    fake, client = live
    refuse(fake, "tools[0].function.parameters.properties.input")
    tools = [{"type": "web_search"}, {"type": "custom", "name": "patch", "format": {
        "type": "grammar", "syntax": "regex", "definition": "a+"}}]
    error = error_of(post(client, "/v1/responses", False, tools=tools), "openai")
    assert fake.requests[-1]["tools"][0]["function"]["parameters"]["properties"]["input"]["pattern"] == "^(?:a+)$"
    assert_names(error, "tools[1].format", "function.parameters")


@pytest.mark.parametrize("stream", [False, True])
def test_chat_errors_keep_response_format_and_map_a_left_out_tool(live, stream):
    """Chat's own fields pass through as they are; a tool without a name is left out upstream."""
    fake, client = live
    refuse(fake, f"{FORMAT}.properties.age")
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": BAD}}
    error = error_of(post(client, "/v1/chat/completions", stream, response_format=fmt), "openai")
    assert error["param"] == f"{FORMAT}.properties.age", error
    refuse(fake, "tools[0].function.parameters.properties.age")
    tools = [{"type": "function", "function": {"parameters": GOOD}},
             {"type": "function", "function": {"name": "bad", "parameters": BAD}}]
    error = error_of(post(client, "/v1/chat/completions", stream, tools=tools), "openai")
    assert upstream_tool_names(fake) == ["bad"]
    assert error["param"] == "tools[1].function.parameters.properties.age", error
    assert "tools[1].function.parameters.properties.age does not compile" in error["message"]


def test_paths_are_renamed_in_one_pass_and_only_whole():
    fields = {"tools[0].function.parameters": ("tools[1].parameters", True),
              "tools[1].function.parameters": ("tools[2].parameters", True),
              "response_format.json_schema.schema": ("text.format.schema", True),
              "response_format": ("text.format", True)}
    assert rename_paths("tools[0].function.parameters.x and tools[1].function.parameters", fields) == \
        "tools[1].parameters.x and tools[2].parameters"
    assert rename_paths("tools[10].function.parameters.x", fields) == "tools[10].function.parameters.x"
    assert rename_paths("`response_format.json_schema.schema.$defs.A`: no", fields) == \
        "`text.format.schema.$defs.A`: no"
    assert rename_paths("response_format.type must be x; my_response_format", fields) == \
        "text.format.type must be x; my_response_format"
