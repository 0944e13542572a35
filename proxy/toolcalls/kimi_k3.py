"""``kimi_k3``: Kimi K3 "XTML" markup (protocols.md §4.3).

    <|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>
      <|open|>argument key="city" type="string"<|sep|>Beijing<|close|>argument<|sep|>
      <|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>
    <|close|>call<|sep|><|close|>tools<|sep|>

* ``think`` elements are reasoning; ``response`` elements and bare text are visible text;
  other tags (``message`` …) are swallowed, their content kept. Inside ``tools`` but
  outside a call, whitespace-only runs are dropped. ``<|end_of_msg|>`` resets the channel.
* Arguments: a ``json`` block's body is used byte for byte. Typed ``argument`` elements
  are assembled as ``{"key": VALUE, ...}`` where VALUE is the model's stripped text for
  number/boolean/null/object/array (checked against the type) and a JSON string for
  ``string``; so ``2.50`` stays ``2.50``. Attribute values are HTML-unescaped.
* A malformed call (text directly in a call, nested/mismatched elements, missing key or
  type, type mismatch, stray markers, unterminated) is consumed up to its
  ``<|close|>call<|sep|>``; it yields ``ParseFailure`` and its source as XML-like text
  (``<call tool="f">…</call>``), never control tokens.
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field

from proxy.canonical import Event

from .base import TokenParser, emit_text

OPEN, CLOSE, SEP, EOM = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
TOKENS = (OPEN, CLOSE, SEP, EOM)
_ATTR = re.compile(r'([\w-]+)="([^"]*)"')
_TYPES = {"number": (int, float), "boolean": (bool,), "null": (type(None),), "object": (dict,), "array": (list,)}


def to_display(raw: str) -> str:
    """XML-like rendering of XTML source: readable, free of control tokens."""
    return raw.replace(OPEN, "<").replace(CLOSE, "</").replace(SEP, ">").replace(EOM, "")


def parse_header(header: str) -> tuple[str, dict[str, str]]:
    name, _, rest = header.strip().partition(" ")
    return name, {k: html.unescape(v) for k, v in _ATTR.findall(rest)}


@dataclass
class _Call:
    tool: str
    raw: str
    args: list[tuple[str, str]] = field(default_factory=list)
    json_raw: str | None = None
    element: tuple[str, dict] | None = None   # open argument/json element: (name, attrs)
    body: str = ""
    failure: str | None = None


class KimiK3Parser(TokenParser):
    TOKENS = TOKENS
    name = "kimi_k3"

    def __init__(self, tools=None, new_id=None):
        super().__init__(tools, new_id)
        self.tag: tuple[str, str] | None = None   # (OPEN|CLOSE, header so far)
        self.stack: list[str] = []
        self.call: _Call | None = None

    # content between tokens
    def _content(self, out: list[Event], text: str) -> None:
        if not text:
            return
        if self.tag is not None:
            self.tag = (self.tag[0], self.tag[1] + text)
        elif self.call is not None:
            self.call.raw += text
            if self.call.element is not None:
                self.call.body += text
            elif text.strip() and self.call.failure is None:
                self.call.failure = "text directly inside a call"
        elif self.stack and self.stack[-1] == "tools":
            self._prose(out, text)
        else:
            emit_text(out, text, "think" in self.stack)

    # control tokens
    def _token(self, out: list[Event], token: str) -> None:
        if self.tag is not None:
            kind, header = self.tag
            self.tag = None
            if token == SEP:
                self._tag(out, kind, header)
                return
            self._broken_tag(out, kind + header)
        if token in (OPEN, CLOSE):
            self.tag = (token, "")
        elif self.call is not None:
            self.call.raw += token
            self.call.failure = self.call.failure or f"{token} inside a call"
            if token == EOM:
                self._end_call(out)
        if token == EOM:
            self.stack.clear()

    def _broken_tag(self, out: list[Event], source: str) -> None:
        if self.call is not None:
            self.call.raw += source
            self.call.failure = self.call.failure or "unterminated tag header"
        else:
            emit_text(out, to_display(source), "think" in self.stack)

    def _tag(self, out: list[Event], kind: str, header: str) -> None:
        name, attrs = parse_header(header)
        if self.call is not None:
            self.call.raw += kind + header + SEP
            self._call_tag(out, kind, name, attrs)
        elif kind == OPEN and name == "call":
            self.call = _Call(tool=attrs.get("tool", ""), raw=OPEN + header + SEP)
        elif kind == OPEN:
            self.stack.append(name)
        elif name in self.stack:
            del self.stack[len(self.stack) - 1 - self.stack[::-1].index(name):]

    def _call_tag(self, out: list[Event], kind: str, name: str, attrs: dict) -> None:
        call = self.call
        if kind == CLOSE and name == "call":
            if call.element is not None:
                call.failure = call.failure or f"call closed inside an open {call.element[0]!r}"
            self._end_call(out)
        elif call.failure:
            return
        elif kind == OPEN and call.element is None and name in ("argument", "json"):
            call.element, call.body = (name, attrs), ""
        elif kind == CLOSE and call.element is not None and call.element[0] == name:
            call.failure = self._close_element(call)
            call.element = None
        else:
            call.failure = f"unexpected {'open' if kind == OPEN else 'close'} tag {name!r} in a call"

    @staticmethod
    def _close_element(call: _Call) -> str | None:
        name, attrs = call.element
        if name == "json":
            if call.json_raw is not None or call.args:
                return "json block mixed with other arguments"
            call.json_raw = call.body
            return None
        key, typ = attrs.get("key"), attrs.get("type")
        if not key or not typ:
            return "argument without key or type"
        if typ == "string":
            call.args.append((key, json.dumps(call.body, ensure_ascii=False)))
            return None
        try:
            value = json.loads(call.body)
        except ValueError:
            return f"argument {key!r} is not valid {typ}"
        is_bool_as_number = typ == "number" and isinstance(value, bool)
        if typ not in _TYPES or not isinstance(value, _TYPES[typ]) or is_bool_as_number:
            return f"argument {key!r} does not match type {typ!r}"
        call.args.append((key, call.body.strip()))
        return None

    def _end_call(self, out: list[Event]) -> None:
        call, self.call = self.call, None
        display = to_display(call.raw)
        if call.failure or call.json_raw is not None and call.args:
            self.emit_failure(out, call.failure or "mixed arguments", call.raw, display)
            return
        if call.json_raw is not None:
            arguments = call.json_raw
        else:
            arguments = "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {v}" for k, v in call.args) + "}"
        self.emit_call(out, call.tool, arguments, raw=call.raw, display=display)

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._content(out, self.buf)
        self.buf = ""
        if self.tag is not None:
            kind, header = self.tag
            self.tag = None
            self._broken_tag(out, kind + header)
        if self.call is not None:
            self.call.failure = self.call.failure or "unterminated call"
            self._end_call(out)
        self.stack.clear()
        return out
