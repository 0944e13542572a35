"""Kimi tokenizer, K2-Instruct template (golden, §4.3) and the streaming tool-call parser."""
import json

import pytest
from hypothesis import given, settings, strategies as st

from tests.support import kimi_tiny  # noqa: E402

from engined.chat.kimi_output import KimiOutputParser  # noqa: E402
from engined.chat.kimi_template import KimiChatFormat  # noqa: E402
from engined.chat.kimi_tokenizer import KimiTokenizer  # noqa: E402
from engined.chat.output import ContentDelta, ReasoningDelta, ToolCallDelta  # noqa: E402
from engined.chat.tokenizer import IncrementalDecoder  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                                                            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "name": "get_weather", "content": "{\"temp_c\": 18}"},
    {"role": "assistant", "content": "It is 18 °C in Paris."},
    {"role": "user", "content": "And in Rome?"},
]
# The §4.3 example, verbatim (the only newline is inside the tool-result body).
GOLDEN = (
    '<|im_system|>tool_declare<|im_middle|>[{"type":"function","function":{"name":"get_weather","description":"Get current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]<|im_end|>'
    "<|im_system|>system<|im_middle|>You are a helpful assistant.<|im_end|>"
    "<|im_user|>user<|im_middle|>What's the weather in Paris?<|im_end|>"
    '<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    '<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n{"temp_c": 18}<|im_end|>'
    "<|im_assistant|>assistant<|im_middle|>It is 18 °C in Paris.<|im_end|>"
    "<|im_user|>user<|im_middle|>And in Rome?<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|>")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return kimi_tiny.write_tiny_checkpoint(tmp_path_factory.mktemp("kimi"), num_shards=1)


@pytest.fixture(scope="module")
def tok(tiny_dir):
    return KimiTokenizer.from_dir(tiny_dir)


def test_builtin_template_golden(tok):
    assert KimiChatFormat(None, tok).render(MESSAGES, TOOLS) == GOLDEN


def test_default_system_turn_and_no_generation_prompt(tok):
    text = KimiChatFormat(None, tok).render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert text == ("<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
                    "<|im_user|>user<|im_middle|>hi<|im_end|>")


def test_shipped_jinja_template_wins(tmp_path):
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    path = kimi_tiny.write_tiny_checkpoint(tmp_path / "k", num_shards=1, chat_template=template)
    tok = KimiTokenizer.from_dir(path)
    assert KimiChatFormat.from_dir(path, tok).render([{"role": "user", "content": "hi"}]) == "[user]hi>"


def test_render_ids_never_turns_user_text_into_control_tokens(tok):
    chat = KimiChatFormat(None, tok)
    ids = chat.render_ids([{"role": "user", "content": "bye<|im_end|>"}])
    im_end = tok.token_to_id("<|im_end|>")
    assert ids.count(im_end) == 2                       # system and user turn ends only
    assert tok.decode(ids) == chat.render([{"role": "user", "content": "bye<|im_end|>"}])


def test_tokenizer_specials_and_round_trip(tok):
    first = len(kimi_tiny.bpe_ranks())
    assert tok.vocab_size == first + 256
    assert tok.token_to_id("<|im_end|>") == first + 2 and tok.token_to_id("<|im_middle|>") == first + 17
    assert tok.token_to_id("<|reserved_token_%d|>" % (first + 5)) == first + 5
    text = "hello world 東京 naïve <|im_end|> x"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_end|>") == [first + 2]
    assert first + 2 not in tok.encode("<|im_end|>", allow_special=False)
    chat = KimiChatFormat(None, tok)
    assert chat.stop_token_ids == {first + 1, first + 2, first + 9}


def test_incremental_decoder_accepts_kimi_tokenizer(tok):
    text = "東京 weather naïve"
    dec = IncrementalDecoder(tok)
    assert "".join(dec.push(i) for i in tok.encode(text)) + dec.flush() == text


MODEL_OUTPUT = ('<think>plan: call it</think>Sure.<|tool_calls_section_begin|><|tool_call_begin|>'
                'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Rome",  "unit":"c"}'
                '<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>'
                '{"tz": "CET"}<|tool_call_end|><|tool_calls_section_end|>')


def _merge(deltas):
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    calls = {}
    for d in deltas:
        if isinstance(d, ToolCallDelta):
            c = calls.setdefault(d.index, {"id": d.id, "name": d.name, "arguments": ""})
            c["arguments"] += d.arguments
    return content, reasoning, calls


def _parse(chunks, tools=True):
    p = KimiOutputParser(tools_enabled=tools)
    deltas = [d for c in chunks for d in p.feed(c)] + p.finish()
    return _merge(deltas), p.tool_calls, deltas


def test_whole_output_parses_into_native_tool_calls():
    (content, reasoning, calls), tool_calls, _ = _parse([MODEL_OUTPUT])
    assert content == "Sure." and reasoning == "plan: call it"
    assert calls == {0: {"id": "functions.get_weather:0", "name": "get_weather",
                         "arguments": '{"city": "Rome",  "unit":"c"}'},
                     1: {"id": "functions.get_time:1", "name": "get_time", "arguments": '{"tz": "CET"}'}}
    assert [c["function"]["arguments"] for c in tool_calls] == ['{"city": "Rome",  "unit":"c"}', '{"tz": "CET"}']
    assert json.loads(tool_calls[0]["function"]["arguments"]) == {"city": "Rome", "unit": "c"}


def test_arguments_stream_before_the_call_closes():
    p = KimiOutputParser(tools_enabled=True)
    p.feed('<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a"')
    assert p.tool_calls[0]["function"] == {"name": "f", "arguments": '{"a"'}


def test_without_tools_markers_stay_content():
    (content, _, calls), tool_calls, _ = _parse(["a<|tool_call_begin|>x<|tool_call_argument_begin|>{}<|tool_call_end|>"], tools=False)
    assert calls == {} and tool_calls == [] and content.startswith("a<|tool_call_begin|>")


def test_partial_marker_is_held_back_then_released():
    p = KimiOutputParser(tools_enabled=True)
    assert _merge(p.feed("hi <|tool_ca"))[0] == "hi "
    assert _merge(p.feed("ll_begin"))[0] == ""         # still a prefix of <|tool_call_begin|>
    assert _merge(p.feed("X"))[0] == "<|tool_call_beginX" # no longer one: released at once
    assert _merge(p.feed(" <") + p.finish())[0] == " <"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(MODEL_OUTPUT)), max_size=12))
def test_split_anywhere_equals_whole(cuts):
    bounds = sorted(set([0, len(MODEL_OUTPUT), *cuts]))
    chunks = [MODEL_OUTPUT[a:b] for a, b in zip(bounds, bounds[1:])]
    (whole, whole_calls, _), (split, split_calls, _) = _parse([MODEL_OUTPUT]), _parse(chunks)
    assert split == whole and split_calls == whole_calls


def test_chat_format_hands_out_the_k2_parser(tok):
    parser = KimiChatFormat(None, tok).output_parser(tools_enabled=True)
    assert isinstance(parser, KimiOutputParser)
    parser.feed(MODEL_OUTPUT)
    parser.finish()
    assert [c["id"] for c in parser.tool_calls] == ["functions.get_weather:0", "functions.get_time:1"]


def test_long_runs_are_cut_before_tiktoken_and_round_trip(tok):
    text = "a" * 30_000 + " " * 30_000 + "東京" * 20
    assert tok.decode(tok.encode(text)) == text
