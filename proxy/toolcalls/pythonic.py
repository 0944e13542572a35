"""``pythonic``: the whole reply is a Python list of calls (Llama 3.2/4 style).

    [get_weather(city="Beijing", days=3), other(x=1)]

The reply is held only while it could start ``[name(``; ``[link](…)``, ``[ ]`` or
``[Note: …`` stream out at once. Values must be literals (``true``/``false``/``null`` are
accepted too). Positional arguments are mapped onto the declared schema's property order;
without a schema they are an error, never silently dropped. Arguments are built once with
``json.dumps`` (this format has no JSON text to preserve).
"""
from __future__ import annotations

import ast
import json
import re

from proxy.canonical import Event
from .whole_reply import MAYBE, NO, YES, WholeReplyParser

_NAME = re.compile(r"[A-Za-z_]\w*")
_JSON_NAMES = {"true": True, "false": False, "null": None}


class CallError(ValueError):
    pass


def pythonic_prefix_state(text: str) -> str:
    text = text.lstrip()
    if not text:
        return MAYBE
    if text[0] != "[":
        return NO
    text = text[1:].lstrip()
    match = _NAME.match(text)
    if not text or match and match.end() == len(text):
        return MAYBE
    if not match:
        return NO
    rest = text[match.end():].lstrip()
    if not rest:
        return MAYBE
    return YES if rest[0] == "(" else NO


def _literal(node: ast.AST) -> object:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise CallError("argument value is not a literal") from exc
    return list(value) if isinstance(value, tuple) else value


def _call_arguments(call: ast.Call, params: dict | None) -> dict:
    args = {kw.arg: _literal(kw.value) for kw in call.keywords if kw.arg is not None}
    if len(args) != len(call.keywords):
        raise CallError("**kwargs are not allowed")
    if call.args:
        names = list((params or {}).get("properties") or {})
        if len(call.args) > len(names):
            raise CallError("positional arguments without matching schema properties")
        for name, node in zip(names, call.args):
            if name in args:
                raise CallError(f"argument {name!r} given twice")
            args[name] = _literal(node)
    return args


def parse_call_list(text: str, tool_params: dict[str, dict]) -> list[tuple[str, dict]]:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise CallError("not a Python expression") from exc
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        raise CallError("not a list of calls")
    calls = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise CallError("list element is not a call to a plain name")
        calls.append((node.func.id, _call_arguments(node, tool_params.get(node.func.id))))
    return calls


class PythonicParser(WholeReplyParser):
    name = "pythonic"

    prefix_state = staticmethod(pythonic_prefix_state)

    def has_trailing_text(self, text: str) -> bool:
        end = text.rfind("]")
        if end < 0 or not text[end + 1:].strip():
            return False
        try:
            ast.parse(text[:end + 1].strip(), mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return False
        return True

    def parse(self, text: str, out: list[Event]) -> None:
        try:
            calls = parse_call_list(text, self.tool_params)
            encoded = [(name, json.dumps(args, ensure_ascii=False)) for name, args in calls]
        except (CallError, TypeError, ValueError) as exc:
            self.emit_failure(out, f"pythonic call list rejected: {exc}", text, text)
            return
        for name, arguments in encoded:
            self.emit_call(out, name, arguments, raw=text, display=f"{name}({arguments})")
