"""Tool-call text parsers and the <think> splitter: chunking invariance, leaks, validation."""
import itertools

import pytest
from hypothesis import given, settings, strategies as st

from proxy.canonical import (ParseFailure, ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallEnd,
                             ToolCallStart)
from proxy.toolcalls import PARSER_NAMES, ThinkSplitter, get_parser, split_think

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}},
]
CONTROL = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
           "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|open|>", "<|close|>", "<|sep|>",
           "<|end_of_msg|>", "<tool_call>", "</tool_call>")

K2_CALL = "<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
K3_ARG = '<|open|>argument key="{k}" type="{t}"<|sep|>{v}<|close|>argument<|sep|>'
K3_CALL = '<|open|>call tool="{name}" index="1"<|sep|>{body}<|close|>call<|sep|>'

CASES = {
    "kimi": [
        "Let me check.<|tool_calls_section_begin|>\n" + K2_CALL.format(name="get_weather", i=0, args='{"city": "Paris"}')
        + "\n" + K2_CALL.format(name="ls", i=1, args="") + "\n<|tool_calls_section_end|>",
        "plain answer with <|tool and |> bits",
        "<|tool_calls_section_begin|>  prose inside  " + K2_CALL.format(name="ls", i=0, args="{}"),
        "cut <|tool_calls_section_begin|>\nsome prose",
        "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Ro",
    ],
    "kimi_k3": [
        "<|open|>think<|sep|>hmm<|close|>think<|sep|><|open|>response<|sep|>Sure.<|close|>response<|sep|>"
        "<|open|>tools<|sep|>\n " + K3_CALL.format(name="get_weather", body=K3_ARG.format(k="city", t="string", v="Oslo")
                                                   + K3_ARG.format(k="days", t="number", v="2.50"))
        + "\n<|close|>tools<|sep|><|end_of_msg|>",
        K3_CALL.format(name="ls", body='<|open|>json type="object"<|sep|>{ }<|close|>json<|sep|>'),
        K3_CALL.format(name="get_weather", body=K3_ARG.format(k="days", t="number", v="many")),
        "text <|open|>call tool=\"ls\"",
    ],
    "hermes": [
        'Checking <tool_call>{"name": "get_weather", "arguments": {"city":  "Rome"}}</tool_call> and '
        '<tool_call>{"name": "ls", "arguments": "{}"}</tool_call> done',
        "<tool_call>{broken</tool_call> after",
        "a < b and <tool_ x",
    ],
    "json": [
        '```json\n[{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "ls", "parameters": {}}]\n```',
        '{"function": {"name": "get_weather", "arguments": "{\\"city\\":\\"Oslo\\"}"}}',
        "[link](http://example.com) is the answer",
        '{"name": "ls", "arguments": {}} and then prose',
    ],
    "pythonic": [
        '[get_weather(city="Rome", days=3), ls()]',
        "[link](http://example.com) answer",
        "[get_weather(city=open('x'))]",
    ],
    "passthrough": ["anything <|tool_call_begin|> goes"],
}


def counter_ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def run(name, chunks, tools=TOOLS):
    parser = get_parser(name, tools, new_id=counter_ids())
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.finish()


def merged(events):
    out = []
    for event in events:
        if isinstance(event, (TextDelta, ReasoningDelta)):
            if not event.text:
                continue
            if out and type(out[-1]) is type(event):
                out[-1] = type(event)(out[-1].text + event.text)
                continue
        out.append(event)
    return out


def visible(events):
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def calls(events):
    starts = {e.index: e for e in events if isinstance(e, ToolCallStart)}
    args = {e.index: e.text for e in events if isinstance(e, ToolCallArgsDelta)}
    return [(starts[i].name, args[i]) for i in sorted(starts)]


@pytest.mark.parametrize("name,text", [(n, t) for n, ts in CASES.items() for t in ts])
def test_chunking_does_not_change_events(name, text):
    whole = merged(run(name, [text]))
    assert merged(run(name, list(text))) == whole
    for cut in range(len(text) + 1):
        split = merged(run(name, [text[:cut], "", text[cut:]]))
        assert split == whole, cut
        if name != "passthrough":
            assert not any(tok in visible(split) for tok in CONTROL), cut


def test_kimi_parallel_calls_keep_raw_bytes_and_model_ids():
    events = run("kimi", list(CASES["kimi"][0]))
    assert calls(events) == [("get_weather", '{"city": "Paris"}'), ("ls", "{}")]
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [s.id for s in starts] == ["functions.get_weather:0", "functions.ls:1"]
    assert [s.index for s in starts] == [0, 1]
    assert sum(isinstance(e, ToolCallEnd) for e in events) == 2
    assert visible(events) == "Let me check."


def test_kimi_section_keeps_prose_when_cut_short():
    assert visible(run("kimi", list(CASES["kimi"][3]))) == "cut \nsome prose"
    assert visible(run("kimi", [CASES["kimi"][2]])) == "  prose inside  "


def test_kimi_unterminated_call_is_failure_without_tokens():
    events = run("kimi", [CASES["kimi"][4]])
    assert isinstance(events[0], ParseFailure) and "unterminated" in events[0].reason
    assert visible(events) == 'functions.get_weather:0 {"city": "Ro'


@pytest.mark.parametrize("name,text,reason", [
    ("kimi", K2_CALL.format(name="rm_rf", i=0, args="{}"), "unknown tool"),
    ("kimi", K2_CALL.format(name="ls", i=0, args="{not json"), "invalid JSON"),
    ("hermes", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown tool"),
    ("hermes", '<tool_call>{"name": "ls", "arguments": "{oops"}</tool_call>', "invalid JSON"),
    ("kimi_k3", K3_CALL.format(name="rm_rf", body=""), "unknown tool"),
    ("kimi_k3", K3_CALL.format(name="ls", body='<|open|>json type="object"<|sep|>{x<|close|>json<|sep|>'), "invalid JSON"),
    ("json", '{"name": "rm_rf", "arguments": {}}', "unknown tool"),
    ("json", '{"name": "ls", "arguments": "{x"}', "invalid JSON"),
    ("pythonic", "[rm_rf(path='/')]", "unknown tool"),
])
def test_rejected_calls_become_failure_and_clean_text(name, text, reason):
    events = run(name, list(text))
    failures = [e for e in events if isinstance(e, ParseFailure)]
    assert len(failures) == 1 and reason in failures[0].reason
    assert not calls(events)
    shown = visible(events)
    assert shown.strip() and not any(tok in shown for tok in CONTROL)


def test_k3_typed_arguments_keep_model_bytes_and_reasoning_channel():
    events = run("kimi_k3", [CASES["kimi_k3"][0]])
    assert calls(events) == [("get_weather", '{"city": "Oslo", "days": 2.50}')]
    assert [e.text for e in merged(events) if isinstance(e, ReasoningDelta)] == ["hmm"]
    assert visible(events) == "Sure."
    assert calls(run("kimi_k3", [CASES["kimi_k3"][1]])) == [("ls", "{ }")]


def test_k3_malformed_call_is_readable_text():
    events = run("kimi_k3", [CASES["kimi_k3"][2]])
    assert "not valid number" in events[0].reason
    assert visible(events) == '<call tool="get_weather" index="1"><argument key="days" type="number">many</argument></call>'


def test_hermes_keeps_raw_arguments_and_text_around():
    events = run("hermes", list(CASES["hermes"][0]))
    assert calls(events) == [("get_weather", '{"city":  "Rome"}'), ("ls", "{}")]
    assert visible(events) == "Checking  and  done"
    assert visible(run("hermes", [CASES["hermes"][2]])) == "a < b and <tool_ x"


def test_json_calls_fenced_array_and_nested_function():
    assert calls(run("json", list(CASES["json"][0]))) == [("get_weather", '{"city": "Rome"}'), ("ls", "{}")]
    assert calls(run("json", [CASES["json"][1]])) == [("get_weather", '{"city":"Oslo"}')]
    trailing = run("json", [CASES["json"][3]])
    assert not calls(trailing) and visible(trailing) == CASES["json"][3]


@pytest.mark.parametrize("name", ["json", "pythonic"])
@pytest.mark.parametrize("answer", ["[link](http://example.com) is the answer", "[ ] todo item", "{not json}",
                                    "[Note: this is prose]", "```python\nprint(1)\n```"])
def test_markdown_starting_with_bracket_streams_before_finish(name, answer):
    parser = get_parser(name, TOOLS)
    before_finish = []
    for chunk in [answer[i:i + 3] for i in range(0, len(answer), 3)]:
        before_finish += parser.feed(chunk)
    assert visible(before_finish) == answer
    assert parser.finish() == []


def test_json_code_fence_prefix_is_not_latched():
    parser = get_parser("json", TOOLS, new_id=counter_ids())
    assert parser.feed("`") == [] and parser.feed("`") == []
    events = parser.feed('`\n{"name": "ls", "arguments": {}}\n```') + parser.finish()
    assert calls(events) == [("ls", "{}")]


def test_pythonic_positional_arguments_use_schema_order():
    assert calls(run("pythonic", ['[get_weather("Rome", 3)]'])) == [("get_weather", '{"city": "Rome", "days": 3}')]
    events = run("pythonic", ['[get_weather("Rome", 3)]'], tools=None)
    assert isinstance(events[0], ParseFailure) and "positional" in events[0].reason


def test_pythonic_accepts_json_style_literals():
    assert calls(run("pythonic", ["[get_weather(city=null, days=true)]"])) == [
        ("get_weather", '{"city": null, "days": true}')]


def test_unknown_parser_name_lists_known_ones():
    with pytest.raises(ValueError, match="kimi_k3"):
        get_parser("nope")
    assert set(PARSER_NAMES) >= {"passthrough", "none", "kimi", "kimi_k2", "kimi_k3", "hermes", "json", "pythonic"}


def test_no_tools_declared_means_every_call_is_unknown_but_none_means_unchecked():
    text = K2_CALL.format(name="anything", i=0, args="{}")
    assert isinstance(run("kimi", [text], tools=[])[0], ParseFailure)
    assert calls(run("kimi", [text], tools=None)) == [("anything", "{}")]


def test_think_splitter_split_tags_never_leak():
    text = "<think>plan A</think>Answer <b>bold</b>"
    whole = ThinkSplitter()
    expect = merged(whole.feed(text) + whole.finish())
    assert expect == [ReasoningDelta("plan A"), TextDelta("Answer <b>bold</b>")]
    for cut in range(len(text) + 1):
        splitter = ThinkSplitter()
        assert merged(splitter.feed(text[:cut]) + splitter.feed(text[cut:]) + splitter.finish()) == expect
    assert split_think("<think>r</think>t") == ("r", "t")
    started = ThinkSplitter(starts_in_reasoning=True)
    assert merged(started.feed("r1</think>t1") + started.finish()) == [ReasoningDelta("r1"), TextDelta("t1")]


FRAGMENTS = {
    "kimi": ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
             "<|tool_call_argument_begin|>", "<|tool_call_end|>", "functions.ls:0", "functions.get_weather:1",
             '{"city": "x"}', "{}", " ", "\n", "hi", "<|", "|>", "{"],
    "kimi_k3": ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "tools", "think", "call tool=\"ls\"",
                'argument key="city" type="string"', "argument", "call", "json type=\"object\"", "{}", " ", "x", "<|"],
    "hermes": ["<tool_call>", "</tool_call>", '{"name": "ls", "arguments": {}}', "{", "<tool", " ", "x"],
    "json": ["[", "{", '"name"', ": ", '"ls"', ", ", '"arguments"', "{}", "}", "]", "```", "json", "\n", "x", "`"],
    "pythonic": ["[", "ls", "get_weather", "(", ")", "city=", '"x"', ", ", "]", " ", "link", "1"],
}


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_markup_never_raises_leaks_or_depends_on_chunking(name, data):
    text = "".join(data.draw(st.lists(st.sampled_from(FRAGMENTS[name]), max_size=14)))
    cut = data.draw(st.integers(0, len(text)))
    whole = merged(run(name, [text]))
    assert merged(run(name, [text[:cut], text[cut:]])) == whole
    assert merged(run(name, list(text))) == whole
    assert not any(tok in visible(whole) for tok in CONTROL if tok.startswith("<|"))


def test_json_answers_that_are_not_calls_stay_plain_text():
    answer = '{"name": "Ada", "age": 36}'
    events = run("json", list(answer), tools=None)
    assert events == [TextDelta(answer)]
    truncated = run("json", ['{"name": "ls", "arguments": {"a"'])
    assert isinstance(truncated[0], ParseFailure) and visible(truncated) == '{"name": "ls", "arguments": {"a"'


def test_k3_parallel_calls_keep_order_and_unescape_attributes():
    text = ("<|open|>tools<|sep|>"
            + K3_CALL.format(name="ls", body="")
            + K3_CALL.format(name="get_weather", body=K3_ARG.format(k="city", t="string", v='Say "hi" & <b>')
                             + K3_ARG.format(k="days", t="null", v="null"))
            + "<|close|>tools<|sep|>")
    tools = TOOLS + [{"type": "function", "function": {"name": "a&b", "parameters": {}}}]
    events = run("kimi_k3", list(text), tools=tools)
    assert calls(events) == [("ls", "{}"), ("get_weather", '{"city": "Say \\"hi\\" & <b>", "days": null}')]
    assert [e.index for e in events if isinstance(e, ToolCallStart)] == [0, 1]
    escaped = K3_CALL.format(name="a&amp;b", body="")
    assert calls(run("kimi_k3", [escaped], tools=tools)) == [("a&b", "{}")]


def _held_suffix_len_naive(buf: str, tokens) -> int:
    """The reference: every suffix length, longest first."""
    best = 0
    for token in tokens:
        for k in range(min(len(buf), len(token) - 1), best, -1):
            if buf.endswith(token[:k]):
                best = k
                break
    return best


@settings(max_examples=3000, deadline=None)
@given(st.text("<|>ab_ ", max_size=14), st.lists(st.text("<|>ab_ ", max_size=8), max_size=5))
def test_held_suffix_len_is_the_naive_one(buf, tokens):
    from proxy.toolcalls.base import held_suffix_len
    assert held_suffix_len(buf, tokens) == _held_suffix_len_naive(buf, tokens)
