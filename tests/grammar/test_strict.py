"""OpenAI's strict: true closes a schema's objects (engined/grammar/strict.py): the grammar then
refuses a key the schema does not name, as OpenAI's strict mode never writes one."""
import pytest

from engined.grammar.strict import closed
from engined.serving.parse import parse_constraint
from tests.support.engine import post

OPEN = {"type": "object", "properties": {"a": {"type": "string"},
        "inner": {"type": "object", "properties": {"b": {"type": "integer"}}},
        "list": {"type": "array", "items": {"type": "object", "properties": {"c": {}}}},
        "free": {"type": "object", "properties": {}, "additionalProperties": True}},
        "required": ["a"]}


def test_every_object_that_names_properties_is_closed_and_its_own_word_stands():
    strict = closed(OPEN)
    assert strict["additionalProperties"] is False
    assert strict["properties"]["inner"]["additionalProperties"] is False
    assert strict["properties"]["list"]["items"]["additionalProperties"] is False
    assert strict["properties"]["free"]["additionalProperties"] is True
    assert "additionalProperties" not in OPEN and closed({"type": "string"}) == {"type": "string"}


def schema_of(strict):
    spec = {"name": "s", "schema": OPEN, **({"strict": strict} if strict is not None else {})}
    return parse_constraint({"response_format": {"type": "json_schema", "json_schema": spec}}).source


@pytest.mark.parametrize("strict", [None, False])
def test_a_schema_that_is_not_strict_stays_as_sent(strict):
    assert schema_of(strict) == OPEN


def test_the_grammar_of_a_strict_schema_refuses_an_unnamed_key(compiler, smol_text):
    tokenizer, _ = smol_text
    text = '{"a": "x", "zzz": 1}'
    for schema, accepts in ((OPEN, True), (schema_of(True), False)):
        matcher = compiler.json_schema(schema).new_matcher()
        assert matcher.consume_tokens(tokenizer.encode(text)) is accepts, schema


def test_a_strict_tool_is_closed_served(served):
    """The closed schema is what the served grammar compiles: every call's keys are named."""
    tool = {"type": "function", "function": {
        "name": "read", "strict": True, "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40}},
                       "required": ["path"]}}}
    from engined.serving.structured import _strict
    assert _strict(tool)["function"]["parameters"]["additionalProperties"] is False
    import json
    resp = post(served.sock, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Read README.md"}], "tools": [tool],
        "tool_choice": "required", "max_tokens": 64, "temperature": 0}).json()
    for call in resp["choices"][0]["message"]["tool_calls"]:
        assert set(json.loads(call["function"]["arguments"])) <= {"path"}
