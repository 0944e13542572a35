"""``hermes``: ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>`` (Qwen/Hermes style).

Text outside the tags streams through with hold-back. The body of each call is buffered
until ``</tool_call>``; ``arguments`` keeps the model's raw JSON text (a JSON-string value
is unwrapped once). A rejected or unterminated call emits ``ParseFailure`` and its stripped
body as text, without the tags.
"""
from __future__ import annotations

from proxy.canonical import Event

from .base import Parser, emit_text, next_token
from .jsonraw import call_from_object

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(Parser):
    name = "hermes"

    def __init__(self, tools=None, new_id=None):
        super().__init__(tools, new_id)
        self.buf = ""
        self.in_call = False

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self.buf += text
        while True:
            if self.in_call:
                before, token, after = next_token(self.buf, (CLOSE, OPEN))
                if token is None:
                    return out
                self._close_call(out, before)
                self.in_call = token == OPEN
            else:
                before, token, after = next_token(self.buf, (OPEN, CLOSE))
                emit_text(out, before)
                if token is None:
                    self.buf = after
                    return out
                self.in_call = token == OPEN
            self.buf = after

    def _close_call(self, out: list[Event], body: str) -> None:
        call = call_from_object(body)
        if call is None:
            self.emit_failure(out, "tool_call body is not a call object", body, body.strip())
            return
        self.emit_call(out, call[0], call[1], raw=body, display=body.strip())

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self.in_call:
            self.emit_failure(out, "unterminated <tool_call>", self.buf, self.buf.strip())
        else:
            emit_text(out, self.buf)
        self.buf, self.in_call = "", False
        return out
