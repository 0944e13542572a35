"""Tool-call grammars (llguidance Lark), one per chat family, written from the same markers
the family's template renders and its output parser reads, so the three cannot disagree.

- hermes (SmolLM2 and other Llama-family templates; engined/chat/hermes.py, output.py):
      <tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>   (calls joined by \\n)
- Kimi K2 (engined/chat/kimi_template.py, kimi_output.py), markers as special tokens:
      <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
      <|tool_call_argument_begin|>ARGS<|tool_call_end|>...<|tool_calls_section_end|>
ARGS is the tool's own JSON schema (`%json`), NAME one of the allowed tools. `forced` is
'*' (any tool), a tool's name (that one), or '' (tool_choice auto: the grammar is lazy and
wakes at the family's opener, so free text before it stays free).
"""
from __future__ import annotations

import json

from engined.chat.hermes import tool_call_text
from engined.chat.kimi_output import ARGS_OPEN, CALL_CLOSE, CALL_OPEN, SECTION_CLOSE, SECTION_OPEN
from engined.chat.output import CALL_OPEN as HERMES_OPEN
from engined.grammar.compile import JSON_OPTIONS
from engined.grammar.matcher import Trigger


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _allowed(tools: list[dict], forced: str) -> list[dict]:
    return [t for t in tools if forced in ("", "*") or t["function"]["name"] == forced]


def _arguments_rule(k: int, tool: dict) -> str:
    schema = tool["function"].get("parameters") or {"type": "object"}
    if isinstance(schema, bool) or not isinstance(schema, dict):
        schema = {"type": "object"}
    schema = {**schema, "x-guidance": JSON_OPTIONS}
    return f"args{k}: %json {json.dumps(schema, ensure_ascii=False)}"


def _repeat(rule: str, is_parallel: bool, joiner: str = "") -> str:
    if not is_parallel:
        return rule
    return f"{rule} ({joiner} {rule})*" if joiner else f"{rule}+"


def hermes_grammar(tools: list[dict], forced: str, is_parallel: bool) -> tuple[str, Trigger | None]:
    """-> (Lark source, trigger or None). The text around a call is hermes.tool_call_text's."""
    sample = tool_call_text({"function": {"name": "@N@", "arguments": '{"@A@": 0}'}})
    head, rest = sample.split('"@N@"')          # '<tool_call>\n{"name": '
    between, end = rest.split('{"@A@": 0}')     # ', "arguments": ' and '}\n</tool_call>'
    # a newline may end the reply: the template's turn is "...</tool_call>\n" + end of turn
    lines = ["start: " + _repeat("call", is_parallel, _literal("\n")) + " " + _literal("\n") + "?"]
    allowed = _allowed(tools, forced)
    lines.append("call: " + " | ".join(f"call{k}" for k in range(len(allowed))))
    for k, tool in enumerate(allowed):
        name = json.dumps(tool["function"]["name"], ensure_ascii=False)
        lines.append(f"call{k}: {_literal(head + name + between)} args{k} {_literal(end)}")
        lines.append(_arguments_rule(k, tool))
    trigger = Trigger(text=HERMES_OPEN.encode()) if forced == "" else None
    return "\n".join(lines) + "\n", trigger


def kimi_grammar(tools: list[dict], forced: str, is_parallel: bool,
                 token_id) -> tuple[str, Trigger | None]:
    """token_id: marker -> its special token id (the markers are single tokens)."""
    markers = (SECTION_OPEN, SECTION_CLOSE, CALL_OPEN, ARGS_OPEN, CALL_CLOSE)
    tok = {m: f"<[{token_id(m)}]>" for m in markers}
    section = f"{tok[SECTION_OPEN]} {_repeat('call', is_parallel)} {tok[SECTION_CLOSE]}"
    # woken lazily, a bare call (no section, which kimi_output.py also reads) is followed too
    lines = [f"start: {section}" + (f" | {_repeat('call', is_parallel)}" if forced == "" else "")]
    allowed = _allowed(tools, forced)
    lines.append(f"call: {tok[CALL_OPEN]} (" + " | ".join(f"call{k}" for k in range(len(allowed)))
                 + f") {tok[CALL_CLOSE]}")
    for k, tool in enumerate(allowed):
        prefix = _literal(f"functions.{tool['function']['name']}:")
        lines.append(f"call{k}: {prefix} INDEX {tok[ARGS_OPEN]} args{k}")
        lines.append(_arguments_rule(k, tool))
    lines.append("INDEX: /[0-9]{1,3}/")
    openers = frozenset({token_id(SECTION_OPEN), token_id(CALL_OPEN)})
    trigger = Trigger(token_ids=openers) if forced == "" else None
    return "\n".join(lines) + "\n", trigger
