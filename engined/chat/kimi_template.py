"""Kimi K2-Instruct chat format (reference §4.3). A jinja `chat_template` shipped with the
checkpoint (tokenizer_config.json or chat_template.jinja) wins; otherwise the built-in renderer
below, pinned byte for byte by tests/chat/test_kimi_chat.py.

Turns: <|im_X|>{name}<|im_middle|>{body}<|im_end|>, concatenated without newlines.
`render_ids` encodes markup with special tokens but message text without them, so a user
string containing "<|im_end|>" cannot close its own turn (injection hardening, §4.3).
"""
from __future__ import annotations

import json
import pathlib

import jinja2

from engined.chat.errors import ChatInputError
from engined.chat.messages import marked_final, normalize_messages, normalize_tools, open_final
from engined.chat.template import compile_template

DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
STOP_TOKENS = ("[EOS]", "<|im_end|>", "[EOT]")
TURN_TOKEN = {"user": "<|im_user|>", "assistant": "<|im_assistant|>"}  # every other role: im_system


def _turn(role: str, name: str, body: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Segments (text, is_markup) of one turn."""
    return [(TURN_TOKEN.get(role, "<|im_system|>"), True), (name, False), ("<|im_middle|>", True),
            *body, ("<|im_end|>", True)]


def _tool_calls(calls: list[dict]) -> list[tuple[str, bool]]:
    out = [("<|tool_calls_section_begin|>", True)]
    for call in calls:
        out += [("<|tool_call_begin|>", True), (call["id"], False), ("<|tool_call_argument_begin|>", True),
                (call["function"]["arguments"], False), ("<|tool_call_end|>", True)]
    return out + [("<|tool_calls_section_end|>", True)]


def _message(m: dict) -> list[tuple[str, bool]]:
    role = m["role"]
    if role == "tool":
        body = [(f"## Return of {m.get('tool_call_id', '')}\n{m['content']}", False)]
        return _turn(role, m.get("name") or "tool", body)
    body = [(m["content"], False)] if m.get("content") else []
    if role == "assistant" and m.get("tool_calls"):
        body += _tool_calls(m["tool_calls"])
    return _turn(role, m.get("name") or role, body)


def builtin_segments(messages: list[dict], tools: list[dict] | None,
                     add_generation_prompt: bool) -> list[tuple[str, bool]]:
    """Normalized messages/tools -> (text, is_markup) segments of the K2-Instruct prompt."""
    out = []
    if tools:
        declared = json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
        out += _turn("system", "tool_declare", [(declared, False)])
    if messages[0]["role"] != "system":
        out += _turn("system", "system", [(DEFAULT_SYSTEM, False)])
    for m in messages:
        out += _message(m)
    if add_generation_prompt:
        out += [("<|im_assistant|>", True), ("assistant", False), ("<|im_middle|>", True)]
    return out


def _shipped_template(path: pathlib.Path) -> str | None:
    try:
        cfg = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        cfg = {}
    template = cfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    return template


class KimiChatFormat:
    supports_tools = True

    def __init__(self, template: str | None, tokenizer):
        self.source = template
        self._tokenizer = tokenizer
        self._template = compile_template(template)[0] if template else None
        ids = {tokenizer.token_to_id(t) for t in STOP_TOKENS} | {tokenizer.eos_id}
        self.stop_token_ids = frozenset(i for i in ids if i is not None)
        self.stop_strings = tuple(tokenizer.id_to_token(i) for i in sorted(self.stop_token_ids))

    def output_parser(self, tools_enabled: bool, in_reasoning: bool = False):
        """The streaming parser for this format's output (K2 tool-call markers, <think>)."""
        from engined.chat.kimi_output import KimiOutputParser
        return KimiOutputParser(tools_enabled, in_reasoning)

    def tool_grammar(self, tools: list[dict], forced: str, is_parallel: bool):
        """The grammar of K2 tool calls, markers as this tokenizer's special tokens ->
        (Lark source, lazy trigger or None); forced as messages.forced_tool."""
        from engined.grammar.tools import kimi_grammar
        return kimi_grammar(tools, forced, is_parallel, self._tokenizer.token_to_id)

    @classmethod
    def from_dir(cls, path, tokenizer) -> "KimiChatFormat":
        return cls(_shipped_template(pathlib.Path(path)), tokenizer)

    def render(self, messages: list[dict], tools: list[dict] | None = None,
               add_generation_prompt: bool = True, tool_choice=None,
               continue_final: bool = False) -> str:
        """The prompt text; continue_final: open at the end of the final message's text
        (messages.marked_final, open_final), with no generation prompt."""
        if tool_choice == "none":
            tools = None
        plain, tools = normalize_messages(messages), normalize_tools(tools)
        plain = marked_final(plain) if continue_final else plain
        add_generation_prompt = add_generation_prompt and not continue_final
        if self._template is None:
            text = "".join(text for text, _ in builtin_segments(plain, tools, add_generation_prompt))
            return open_final(text) if continue_final else text
        tok = self._tokenizer
        special = {"bos_token": tok.id_to_token(tok.bos_id) if tok.bos_id is not None else None,
                   "eos_token": tok.id_to_token(tok.eos_id) if tok.eos_id is not None else None}
        try:
            text = self._template.render(messages=plain, tools=tools,
                                         add_generation_prompt=add_generation_prompt, **special)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise ChatInputError(f"the chat template failed on these messages: {exc}") from exc
        return open_final(text) if continue_final else text

    def render_ids(self, messages: list[dict], tools: list[dict] | None = None,
                   add_generation_prompt: bool = True, tool_choice=None) -> list[int]:
        """Prompt token ids; message text never becomes a control token (built-in renderer).
        With a shipped jinja template the rendered string is encoded with specials allowed."""
        if self._template is not None:
            return self._tokenizer.encode(self.render(messages, tools, add_generation_prompt, tool_choice))
        if tool_choice == "none":
            tools = None
        segments = builtin_segments(normalize_messages(messages), normalize_tools(tools), add_generation_prompt)
        return [i for text, markup in segments for i in self._tokenizer.encode(text, allow_special=markup)]
