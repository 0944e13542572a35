"""response_format and vLLM's structured_outputs on the served default model (SmolLM2, CPU,
greedy): replies are checked by jsonschema / re, never by the grammar that made them."""
import json
import re

import jsonschema
import pytest

from tests.support.engine import post, stream

ASK = [{"role": "user", "content": "Describe a person you know."}]
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                      "age": {"type": "integer", "minimum": 0}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"sky": {"enum": ["sunny", "cloudy", "rain"]},
                                      "temp_c": {"type": "integer", "minimum": -50, "maximum": 60}},
     "required": ["sky", "temp_c"], "additionalProperties": False},
    {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
     "minItems": 2, "maxItems": 3},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "maximum": 99}},
                         "required": ["x"], "additionalProperties": False}},
     "type": "object", "properties": {"at": {"$ref": "#/$defs/point"}}, "required": ["at"],
     "additionalProperties": False},
]


def chat(served, **fields):
    resp = post(served.sock, "/v1/chat/completions",
                {"messages": ASK, "max_tokens": 64, "temperature": 0, **fields}, timeout=120)
    return resp


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("strict", [True, False])
def test_a_json_schema_reply_validates(served, schema, strict):
    resp = chat(served, response_format={"type": "json_schema", "json_schema": {
        "name": "answer", "schema": schema, "strict": strict}})
    assert resp.status == 200, resp.body
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_json_object_gives_an_object(served):
    resp = post(served.sock, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Give your name as JSON: {\"name\": ...}"}],
        "max_tokens": 64, "temperature": 0, "response_format": {"type": "json_object"}})
    assert isinstance(json.loads(resp.json()["choices"][0]["message"]["content"]), dict)


def test_a_streamed_json_schema_reply_validates(served):
    events = stream(served.sock, "/v1/chat/completions", {
        "messages": ASK, "max_tokens": 64, "temperature": 0, "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMAS[0]}}})
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if isinstance(e, dict) and e.get("choices"))
    jsonschema.validate(json.loads(text), SCHEMAS[0])


@pytest.mark.parametrize("field, value, check", [
    ("json", SCHEMAS[1], lambda text: jsonschema.validate(json.loads(text), SCHEMAS[1])),
    ("json", json.dumps(SCHEMAS[1]), lambda text: jsonschema.validate(json.loads(text), SCHEMAS[1])),
    ("regex", r"[A-Z][a-z]{2,6} is [0-9]{2}", lambda t: re.fullmatch(r"[A-Z][a-z]{2,6} is [0-9]{2}", t)),
    ("choice", ["young", "old"], lambda t: t in ("young", "old")),
    ("grammar", 'start: "age: " /[0-9]{1,2}/', lambda t: re.fullmatch(r"age: [0-9]{1,2}", t)),
])
def test_vllm_structured_outputs(served, field, value, check):
    for body in ({"structured_outputs": {field: value}}, {f"guided_{field}": value}):
        resp = chat(served, **body)
        assert resp.status == 200, resp.body
        assert check(resp.json()["choices"][0]["message"]["content"]) is not False


def test_completions_take_a_constraint_too(served):
    resp = post(served.sock, "/v1/completions", {"prompt": "The answer is", "max_tokens": 8,
                                                  "temperature": 0, "structured_outputs": {"choice": ["yes", "no"]}})
    assert resp.json()["choices"][0]["text"] in ("yes", "no")


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"a": {"type": "nope"}}}}}},
     "response_format.json_schema.schema.properties.a"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(x"}}}}}},
     "response_format.json_schema.schema.properties.a"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "start: undefined_rule"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.regex"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"q": {"type": "nope"}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters.properties.q"),
])
def test_a_bad_constraint_is_a_400_naming_its_path(served, body, param):
    resp = chat(served, **body)
    assert resp.status == 400, resp.body
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"].startswith(f"{param} does not compile: ") or "compile" not in error["message"]


def test_a_plain_request_batched_with_a_constrained_one_is_unchanged(served):
    import threading
    plain = {"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 24,
             "temperature": 0, "return_token_ids": True}
    alone = post(served.sock, "/v1/chat/completions", plain).json()["choices"][0]["token_ids"]
    results = {}

    def constrained():
        results["json"] = chat(served, response_format={"type": "json_schema", "json_schema": {
            "name": "a", "schema": SCHEMAS[0]}})

    thread = threading.Thread(target=constrained)
    thread.start()
    results["plain"] = post(served.sock, "/v1/chat/completions", plain)
    thread.join(120)
    assert results["plain"].json()["choices"][0]["token_ids"] == alone
    jsonschema.validate(json.loads(results["json"].json()["choices"][0]["message"]["content"]), SCHEMAS[0])


def test_the_request_log_line_counts_the_masks(served):
    from tests.support.engine import eventually
    request_id = "grammar-log-line-1"
    resp = post(served.sock, "/v1/chat/completions", {
        "messages": ASK, "max_tokens": 64, "temperature": 0, "response_format": {
            "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMAS[0]}}},
        headers={"x-request-id": request_id}, timeout=120)
    tokens = resp.json()["usage"]["completion_tokens"]
    log = served.dir / "engine.log"
    assert eventually(lambda: f"request_id={request_id} " in log.read_text())
    line = next(l for l in log.read_text().splitlines() if f"request_id={request_id} " in l)
    fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
    assert int(fields["grammar_masks"]) == tokens                 # one mask per drawn token
    assert 0 <= int(fields["grammar_ready"]) <= tokens and float(fields["grammar_mask_ms"]) >= 0
