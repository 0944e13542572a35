"""Grammar compilation: every tool schema real clients sent compiles; a bad one names its path;
compiled grammars are cached by their source; unknown keywords are ignored, not refused."""
import json

import pytest

from tests.support import bench

from engined.grammar.compile import GrammarError

structured_set = bench.load("structured_set")


def recorded_tool_sets() -> dict[str, list[dict]]:
    """Request -> its function tools as Chat tools, for every recorded request with tools:
    the live-client traffic and the cassettes (Claude Code's 172-tool turn among them)."""
    out = {}
    bodies = list(structured_set.recorded_bodies()) + list(structured_set.cassette_bodies())
    for k, (source, body) in enumerate(bodies):
        tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": s}}
                 for tool in body.get("tools") or () for n, d, s in structured_set.function_tools(tool)]
        if tools:
            out[f"{source}#{k}"] = tools
    return out


def test_every_recorded_tool_schema_compiles(compiler):
    schemas = {json.dumps(t["function"]["parameters"], sort_keys=True): (source, t["function"]["name"])
               for source, tools in recorded_tool_sets().items() for t in tools}
    assert len(schemas) >= 200                    # Claude Code, Codex, opencode, Cline, MCP tools
    failed = []
    for text, (source, name) in schemas.items():
        try:
            compiler.json_schema(json.loads(text))
        except GrammarError as exc:
            failed.append((source, name, exc.message))
    assert not failed


def test_every_recorded_tool_set_compiles_as_one_tool_call_grammar(compiler, smol_text):
    _, chat = smol_text
    seen = set()
    for tools in recorded_tool_sets().values():
        source = chat.tool_grammar(tools, "", True)[0]
        if source not in seen:
            seen.add(source)
            compiler.lark(source)
    assert len(seen) >= 10


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
    assert str(info.value).startswith(f"{path}: ") and info.value.message


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
