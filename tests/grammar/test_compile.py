"""Grammar compilation: every tool schema real clients sent compiles; a bad one names its path;
compiled grammars are cached by their source; unknown keywords are ignored, not refused."""
import pathlib
import sys

import pytest

from engined.grammar.compile import GrammarError

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import structured_set  # noqa: E402


def test_every_recorded_tool_schema_compiles(compiler):
    tools = structured_set.client_tools()
    assert len(tools) >= 60                       # Claude Code, Codex, opencode, Cline tools
    failed = []
    for source, tool in tools:
        try:
            compiler.json_schema(tool["function"]["parameters"])
        except GrammarError as exc:
            failed.append((source, tool["function"]["name"], exc.message))
    assert not failed


def test_every_recorded_tool_set_compiles_as_one_tool_call_grammar(compiler, smol_text):
    _, chat = smol_text
    by_request = {}
    for source, body in structured_set.recorded_bodies():
        tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": s}}
                 for tool in body.get("tools") or () for n, d, s in structured_set.function_tools(tool)]
        if tools:
            by_request[source] = tools
    assert by_request
    for source, tools in by_request.items():
        compiler.lark(chat.tool_grammar(tools, "*", True)[0])


@pytest.mark.parametrize("schema, path", [
    ({"type": "object", "properties": {"a": {"type": "nope"}}}, "schema.properties.a"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string",
      "pattern": "(unclosed"}}}}, "schema.properties.a.items"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "schema.properties.a"),
    ({"anyOf": [{"type": "string"}, {"minimum": "x"}]}, "schema.anyOf[1]"),
])
def test_a_bad_schema_names_the_failing_path(compiler, schema, path):
    with pytest.raises(GrammarError) as info:
        compiler.json_schema(schema, "schema")
    assert info.value.path == path
    assert info.value.message.startswith(path)


def test_a_ref_to_defs_compiles_and_only_a_bad_def_is_blamed(compiler):
    good = {"$defs": {"n": {"type": "integer"}}, "type": "object",
            "properties": {"a": {"$ref": "#/$defs/n"}}}
    compiler.json_schema(good)
    bad = {"$defs": {"n": {"type": "nope"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}}
    with pytest.raises(GrammarError) as info:
        compiler.json_schema(bad, "s")
    assert info.value.path in ("s.$defs.n", "s.properties.a")


def test_unknown_keywords_and_formats_are_ignored_with_a_warning(compiler):
    compiled = compiler.json_schema({"type": "object", "unevaluatedProperties": False,
                                     "properties": {"a": {"type": "string", "format": "weird"}}})
    assert compiled.warnings


def test_compiled_grammars_are_cached_by_source(compiler):
    schema = {"type": "object", "properties": {"cached": {"type": "integer"}}}
    first = compiler.json_schema(schema)
    assert compiler.json_schema(dict(schema)) is first
    assert compiler.regex("[a-z]+") is compiler.regex("[a-z]+")
    assert compiler.regex("[a-z]+") is not compiler.regex("[a-y]+")
