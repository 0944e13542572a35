"""Output parser: whole input and input split at every character give the same result; only a
possible tag prefix is ever held back; invalid tool JSON becomes content; reasoning spans."""
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engined.chat.output import ContentDelta, OutputParser, ToolCallDelta, parse_call

CASES = {
    "plain": "Paris is the capital of France. [link](https://x.y) <b>bold</b> a < b > c",
    "reasoning": "<think>The user asks about 2+2.\nIt is 4.</think>The answer is **4**.",
    "tool_call": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city":  "Paris", "u": "\\u00e9"}}\n</tool_call>\n',
    "two_calls": '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"x": [1, 2]}}\n</tool_call>',
    "invalid_json": 'Sure <tool_call>{"name": "a", "arguments": {"x": }</tool_call> done',
    "not_json": "Use <tool_call> tags like <tool_call>this</tool_call>.",
    "missing_name": '<tool_call>{"arguments": {}}</tool_call>',
    "unterminated_valid": '<tool_call>\n{"name": "f", "arguments": {"q": "x"}}\n',
    "unterminated_invalid": '<tool_call>\n{"name": "f", "argu',
    "unterminated_think": "<think>still thinking <",
    "partial_tag_at_end": "almost a tag <tool_ca",
    "content_after_call": '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n\nDone: <think>why</think> ok\n',
    "double_encoded": '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
    "parameters_alias": '<tool_call>{"parameters": {"k": true}, "name": "g"}</tool_call>',
}


def run(chunks, tools_enabled=True, in_reasoning=False):
    parser = OutputParser(tools_enabled, in_reasoning=in_reasoning)
    deltas = [d for chunk in chunks for d in parser.feed(chunk)] + parser.finish()
    return deltas, parser.tool_calls


def merged(deltas):
    """Adjacent deltas of one kind joined; call ids dropped (they are random)."""
    out = []
    for delta in deltas:
        if isinstance(delta, ToolCallDelta):
            out.append(("call", delta.index, delta.name, delta.arguments))
        elif out and out[-1][0] == type(delta).__name__:
            out[-1] = (out[-1][0], out[-1][1] + delta.text)
        else:
            out.append((type(delta).__name__, delta.text))
    return out


def without_ids(calls):
    return [{k: v for k, v in call.items() if k != "id"} for call in calls]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("tools_enabled", [True, False])
def test_whole_and_split_at_every_character_agree(name, tools_enabled):
    text = CASES[name]
    whole, whole_calls = run([text], tools_enabled)
    split, split_calls = run(list(text), tools_enabled)
    assert merged(split) == merged(whole)
    assert without_ids(split_calls) == without_ids(whole_calls)
    for cut in range(len(text) + 1):
        deltas, calls = run([text[:cut], text[cut:]], tools_enabled)
        assert merged(deltas) == merged(whole), cut


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(st.sampled_from(["<think>", "</think>", "<tool_call>", "</tool_call>", "<", "</", "<tool",
                                        '{"name": "f", "arguments": {"a": 1}}', "{", "}", "x", " ", "\n", "é😀"]),
                       max_size=12),
       cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_random_texts_any_split_agree(pieces, cuts):
    text = "".join(pieces)
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    whole, whole_calls = run([text])
    split, split_calls = run(chunks)
    assert merged(split) == merged(whole)
    assert without_ids(split_calls) == without_ids(whole_calls)
    emitted = "".join(d.text if not isinstance(d, ToolCallDelta) else "" for d in whole)
    assert len(emitted) + sum(len(c["function"]["arguments"]) for c in whole_calls) <= len(text)


def test_nothing_but_a_possible_tag_prefix_is_held():
    text = CASES["plain"] * 20 + CASES["reasoning"] * 5
    parser, fed, emitted = OutputParser(tools_enabled=True), "", ""
    for ch in text:
        fed += ch
        emitted += "".join(d.text for d in parser.feed(ch))
        held = fed.replace("<think>", "").replace("</think>", "")[len(emitted):]
        assert len(held) < len("<tool_call>") and (not held or held[0] == "<"), held
    assert emitted + "".join(d.text for d in parser.finish()) == text.replace("<think>", "").replace("</think>", "")


@pytest.mark.parametrize("text", ["[1, 2] is a list", "<b>bold</b>", "<div>", "# [Title](url)", "<!-- c -->"])
def test_markdown_and_markup_stream_at_once(text):
    parser = OutputParser(tools_enabled=True)
    first = parser.feed(text[:2])
    rest = parser.feed(text[2:])
    assert "".join(d.text for d in first) == text[:2]   # none of these can start <think> or <tool_call>
    assert "".join(d.text for d in first + rest) == text and not parser.finish()


def test_tool_call_keeps_argument_bytes_and_has_ids():
    deltas, calls = run([CASES["two_calls"]])
    assert [type(d) for d in deltas] == [ToolCallDelta, ToolCallDelta]
    assert [(d.index, d.name, d.arguments) for d in deltas] == [(0, "a", "{}"), (1, "b", '{"x": [1, 2]}')]
    assert all(d.id.startswith("call_") and len(d.id) == 29 for d in deltas) and deltas[0].id != deltas[1].id
    assert calls == [{"id": d.id, "type": "function", "function": {"name": d.name, "arguments": d.arguments}}
                     for d in deltas]
    deltas, calls = run([CASES["tool_call"]])
    assert deltas[0] == ContentDelta("Let me check.\n")
    assert calls[0]["function"]["arguments"] == '{"city":  "Paris", "u": "\\u00e9"}'
    assert len(deltas) == 2, "whitespace after the last call is not sent as content"


def test_invalid_tool_json_becomes_content():
    for name in ("invalid_json", "not_json", "missing_name", "unterminated_invalid"):
        deltas, calls = run([CASES[name]])
        assert calls == [] and merged(deltas) == [("ContentDelta", CASES[name])], name


def test_unterminated_valid_call_at_finish_is_a_call():
    deltas, calls = run([CASES["unterminated_valid"]])
    assert [c["function"] for c in calls] == [{"name": "f", "arguments": '{"q": "x"}'}]


def test_reasoning_spans():
    assert merged(run([CASES["reasoning"]])[0]) == [
        ("ReasoningDelta", "The user asks about 2+2.\nIt is 4."), ("ContentDelta", "The answer is **4**.")]
    assert merged(run([CASES["unterminated_think"]])[0]) == [("ReasoningDelta", "still thinking <")]
    assert merged(run(["opened by the prompt</think>answer"], in_reasoning=True)[0]) == [
        ("ReasoningDelta", "opened by the prompt"), ("ContentDelta", "answer")]


def test_tool_tags_are_content_when_tools_are_off():
    deltas, calls = run([CASES["tool_call"]], tools_enabled=False)
    assert calls == [] and merged(deltas) == [("ContentDelta", CASES["tool_call"])]


def test_content_after_calls_and_argument_forms():
    assert merged(run([CASES["content_after_call"]])[0]) == [
        ("call", 0, "f", "{}"), ("ContentDelta", "\n\nDone: "), ("ReasoningDelta", "why"), ("ContentDelta", " ok\n")]
    assert run([CASES["double_encoded"]])[1][0]["function"]["arguments"] == '{"a": 1}'
    assert run([CASES["parameters_alias"]])[1][0]["function"]["arguments"] == '{"k": true}'


@pytest.mark.parametrize("body, expected", [
    ('{"name": "f", "arguments": {"a": {"b": [1, "}"]}}, "x": 1}', ("f", '{"a": {"b": [1, "}"]}}')),
    ('  {"arguments":{} ,"name":"g"}  ', ("g", "{}")),
    ('{"name": "f"}', ("f", "{}")),
    ('{"name": "f", "arguments": [1]}', None),
    ('{"name": 3, "arguments": {}}', None),
    ('{"name": "f", "arguments": {}} trailing', None),
    ("[]", None),
])
def test_parse_call(body, expected):
    assert parse_call(body) == expected
    if expected:
        assert json.loads(expected[1]) is not None

