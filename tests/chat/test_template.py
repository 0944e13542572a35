"""Chat rendering: pinned to transformers' apply_chat_template on the same template, plus golden
hermes text for tools (SmolLM2's template has no tool support, so we render tools ourselves)."""
import json

import pytest

from engined.chat import ChatFormat, ChatInputError, load_text

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

PLAIN_CHATS = [
    [{"role": "user", "content": "Which city is the capital of France?"}],
    [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Bonjour ! Ça va ?"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! 😀"},
     {"role": "user", "content": "写一首诗\n\n  with spaces  "}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "<b>markup</b> & {{ braces }}"}],
]

# A template that reads tools and tool calls, to check they are passed through natively.
NATIVE_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.content is defined %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}[{{ call.id }} {{ call.function.name }} "
    "{{ call.function.arguments | tojson }}]{% endfor %}"
    "{% if message.tool_call_id is defined %} (for {{ message.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def text(default_gguf, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        mp.delenv("CACHE_DIRECTORY", raising=False)
        return load_text(default_gguf)


@pytest.fixture(scope="module")
def chat(text):
    return text[1]


def test_template_is_the_ggufs(chat, reference):
    assert chat.source == reference.chat_template and not chat.supports_tools


@pytest.mark.parametrize("messages", PLAIN_CHATS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_plain_chats_match_transformers(chat, reference, messages, add_generation_prompt):
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert chat.render(messages, add_generation_prompt=add_generation_prompt) == expected


def test_text_parts_are_joined_and_developer_is_system(chat, reference):
    parts = [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]
    joined = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "one\ntwo"}]
    assert chat.render(parts) == reference.apply_chat_template(joined, tokenize=False, add_generation_prompt=True)


def test_stop_tokens(chat, text):
    tokenizer = text[0]
    assert chat.stop_token_ids == frozenset({tokenizer.eos_id, tokenizer.token_to_id("<|endoftext|>")})
    assert set(chat.stop_strings) == {"<|im_end|>", "<|endoftext|>"}


TOOL_HISTORY = [
    {"role": "user", "content": "Weather in Paris and Lyon?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":  \"Paris\"}"}},
        {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "{\"temp_c\": 18}"},
    {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
]

GOLDEN_TOOLS = """<|im_start|>system
You are terse.

# Tools

You may call one or more functions to help with the user's request. The functions are described as JSON schemas inside <tools></tools>:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
</tools>

To call a function, answer with one JSON object per call, each inside <tool_call></tool_call> tags:
<tool_call>
{"name": "<function-name>", "arguments": <arguments-as-a-JSON-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris and Lyon?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city":  "Paris"}}
</tool_call>
<tool_call>
{"name": "get_weather", "arguments": {"city": "Lyon"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"temp_c": 18}
</tool_response>
<tool_response>
rain
</tool_response><|im_end|>
<|im_start|>assistant
"""


def test_hermes_golden(chat):
    messages = [{"role": "system", "content": "You are terse."}] + TOOL_HISTORY
    assert chat.render(messages, tools=[WEATHER_TOOL]) == GOLDEN_TOOLS


def test_hermes_without_system_adds_one(chat):
    rendered = chat.render(TOOL_HISTORY[:1], tools=[WEATHER_TOOL])
    assert rendered.startswith("<|im_start|>system\n# Tools\n\n")
    assert "SmolLM" not in rendered   # the template's default system prompt is replaced, once
    assert rendered.count("<|im_start|>system") == 1


def test_tool_choice(chat):
    none = chat.render(TOOL_HISTORY, tools=[WEATHER_TOOL], tool_choice="none")
    assert "<tools>" not in none and "<tool_call>\n{\"name\": \"get_weather\"" in none   # history still shown
    assert none == chat.render(TOOL_HISTORY)
    assert chat.render(TOOL_HISTORY, tools=[WEATHER_TOOL], tool_choice="auto") == chat.render(TOOL_HISTORY, tools=[WEATHER_TOOL])
    required = chat.render(TOOL_HISTORY[:1], tools=[WEATHER_TOOL], tool_choice="required")
    assert "You must answer with at least one function call." in required
    named = chat.render(TOOL_HISTORY[:1], tools=[WEATHER_TOOL],
                        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert 'You must answer by calling the function "get_weather".' in named


def test_assistant_text_before_tool_call_and_non_json_arguments(chat):
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}]
    assert "<|im_start|>assistant\nChecking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": \"not json\"}\n</tool_call><|im_end|>" \
        in chat.render(messages)


def test_native_tool_template_matches_transformers(text, reference):
    chat = ChatFormat(NATIVE_TOOLS_TEMPLATE, text[0])
    assert chat.supports_tools
    ours = chat.render(TOOL_HISTORY, tools=[WEATHER_TOOL])
    theirs_history = json.loads(json.dumps(TOOL_HISTORY))
    del theirs_history[1]["content"]
    for call in theirs_history[1]["tool_calls"]:
        call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    expected = reference.apply_chat_template(theirs_history, tools=[WEATHER_TOOL], chat_template=NATIVE_TOOLS_TEMPLATE,
                                             tokenize=False, add_generation_prompt=True)
    assert ours == expected
    assert "<tools>" not in ours and "[call_a get_weather {\"city\": \"Paris\"}]" in ours
    assert "<|im_start|>system" not in chat.render(TOOL_HISTORY, tools=[WEATHER_TOOL], tool_choice="none")


def test_template_helpers(text):
    chat = ChatFormat("{{ strftime_now('%Y') | length }} {{ {'a': 'é'} | tojson }} {{ bos_token }}"
                      "{% generation %}gen{% endgeneration %}{% for m in messages %}{% if loop.index > 1 %}{% break %}"
                      "{% endif %}{{ m.content }}{% endfor %}", text[0])
    assert chat.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == \
        '4 {"a": "é"} <|im_start|>gena'


def test_no_template_falls_back_to_chatml(text):
    rendered = ChatFormat(None, text[0]).render([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_raise_exception_becomes_input_error(text):
    chat = ChatFormat("{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}", text[0])
    with pytest.raises(ChatInputError, match="first must be user"):
        chat.render([{"role": "assistant", "content": "x"}])


@pytest.mark.parametrize("messages, tools, tool_choice, match", [
    ([], None, None, "non-empty list"),
    ("hi", None, None, "non-empty list"),
    ([{"role": "wizard", "content": "x"}], None, None, r"messages\[0\].role 'wizard'"),
    (["hi"], None, None, r"messages\[0\] must be an object"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], None, None, "text only"),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}], None, None, r"\[0\].text must be a string"),
    ([{"role": "user", "content": 42}], None, None, "string, null or a list"),
    ([{"role": "user", "content": None}], None, None, "a user message needs content"),
    ([{"role": "assistant", "content": None}], None, None, "content or tool_calls"),
    ([{"role": "tool", "content": "x", "tool_call_id": 5}], None, None, "tool_call_id must be a string"),
    ([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}], None, None, r"tool_calls\[0\]"),
    ([{"role": "user", "content": "x"}], [{"type": "retrieval"}], None, r"tools\[0\]"),
    ([{"role": "user", "content": "x"}], [{"type": "function", "function": {"name": ""}}], None, "name"),
    ([{"role": "user", "content": "x"}], [WEATHER_TOOL], "sometimes", "tool_choice must be"),
    ([{"role": "user", "content": "x"}], [WEATHER_TOOL], {"type": "function", "function": {"name": "nope"}}, "not in tools"),
    ([{"role": "user", "content": "x"}], None, "required", "needs tools"),
])
def test_bad_input_is_a_clear_input_error(chat, messages, tools, tool_choice, match):
    with pytest.raises(ChatInputError, match=match):
        chat.render(messages, tools=tools, tool_choice=tool_choice)
