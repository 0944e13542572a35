"""Structured outputs through the proxy, in front of the real engine serving the default model:
Anthropic output_format / output_config.format and Responses text.format arrive constrained,
and a schema that does not compile is a 400 in each dialect's own error shape."""
import json

import jsonschema
import pytest

from proxy.app import create_app
from tests.support.proxy_fakes import proxy_config

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
BAD = {"type": "object", "properties": {"age": {"type": "nope"}}}
ASK = "Describe a person."


@pytest.fixture(scope="module")
def client(served, tmp_path_factory):
    app = create_app(proxy_config(f"unix://{served.sock}", tmp_path_factory.mktemp("proxy")))
    return app.test_client()


def anthropic(fmt_field: dict) -> dict:
    return {"model": "m", "max_tokens": 64, "temperature": 0,
            "messages": [{"role": "user", "content": ASK}], **fmt_field}


@pytest.mark.parametrize("field", [
    lambda s: {"output_format": {"type": "json_schema", "schema": s}},
    lambda s: {"output_config": {"format": {"type": "json_schema", "schema": s}}},
])
def test_anthropic_output_format_is_constrained(client, field):
    resp = client.post("/v1/messages", json=anthropic(field(SCHEMA)))
    assert resp.status_code == 200, resp.get_data()
    text = "".join(b["text"] for b in resp.get_json()["content"] if b["type"] == "text")
    jsonschema.validate(json.loads(text), SCHEMA)


def test_responses_text_format_is_constrained(client):
    resp = client.post("/v1/responses", json={"model": "m", "input": ASK, "max_output_tokens": 64,
                                              "temperature": 0, "text": {"format": {
                                                  "type": "json_schema", "name": "p", "schema": SCHEMA}}})
    assert resp.status_code == 200, resp.get_data()
    texts = [c["text"] for item in resp.get_json()["output"] if item["type"] == "message"
             for c in item["content"] if c["type"] == "output_text"]
    jsonschema.validate(json.loads("".join(texts)), SCHEMA)


def test_a_bad_schema_is_a_400_in_each_dialects_shape(client):
    anth = client.post("/v1/messages", json=anthropic({"output_format": {"type": "json_schema", "schema": BAD}}))
    assert anth.status_code == 400
    body = anth.get_json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "output_format.schema.properties.age" in body["error"]["message"]  # the client's field
    assert "response_format" not in body["error"]["message"]
    resp = client.post("/v1/responses", json={"model": "m", "input": ASK, "text": {"format": {
        "type": "json_schema", "name": "p", "schema": BAD}}})
    assert resp.status_code == 400
    error = resp.get_json()["error"]
    assert error["type"] == "invalid_request_error" and "text.format.schema.properties.age" in error["message"]
    assert error["param"].startswith("text.format.schema.properties.age"), error
    chat = client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": ASK}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": BAD}}})
    assert chat.status_code == 400
    error = chat.get_json()["error"]
    assert error["type"] == "invalid_request_error" and "properties.age" in error["message"]
    assert error["param"].startswith("response_format.json_schema.schema.properties.age"), error
    assert "type" not in chat.get_json()  # no Anthropic envelope on the OpenAI routes
