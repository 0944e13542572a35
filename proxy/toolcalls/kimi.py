"""``kimi`` (alias ``kimi_k2``): Kimi K2 / Kimi-Linear tool-call control tokens (protocols.md §4.2).

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city":"Beijing"}<|tool_call_end|>
    <|tool_calls_section_end|>

* The section wrapper is optional (bare calls are accepted).
* The call id is the header itself when it reads ``functions.NAME:IDX`` (the id the model's
  chat template expects back in the tool result); otherwise a fresh ``call_…`` id.
* Arguments are the exact text between the argument token and ``<|tool_call_end|>``
  (empty means ``{}``); they must be a JSON object naming a declared tool.
* Inside a section, whitespace-only runs between calls are dropped; prose is kept
  verbatim. The decision waits for the first non-whitespace character, so it does not
  depend on the chunking. A section cut short keeps its prose.
* A rejected, interrupted or unterminated call emits ``ParseFailure`` and the text
  ``header arguments`` without control tokens. Stray control tokens are dropped.
"""
from __future__ import annotations

import re

from proxy.canonical import Event

from .base import TokenParser, emit_text

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_BEGIN_ALT = "<|tool_call_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
SECTION_END_ALT = "<|tool_call_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
TOKENS = (SECTION_BEGIN, SECTION_BEGIN_ALT, SECTION_END, SECTION_END_ALT, CALL_BEGIN, ARG_BEGIN, CALL_END)
_HEADER = re.compile(r"^(?:functions?\.)?(?P<name>[^\s:]+?)(?::(?P<idx>\d+))?$")

TEXT, SECTION, HEADER, ARGS = "text", "section", "header", "args"


class KimiParser(TokenParser):
    TOKENS = TOKENS
    name = "kimi"

    def __init__(self, tools=None, new_id=None):
        super().__init__(tools, new_id)
        self.state = TEXT
        self.in_section = False
        self.header = ""
        self.args = ""

    def _content(self, out: list[Event], text: str) -> None:
        if self.state == TEXT:
            emit_text(out, text)
        elif self.state == SECTION:
            self._prose(out, text)
        elif self.state == HEADER:
            self.header += text
        else:
            self.args += text

    def _token(self, out: list[Event], token: str) -> None:
        in_call = self.state in (HEADER, ARGS)
        if token in (SECTION_BEGIN, SECTION_BEGIN_ALT):
            if in_call:
                self._abort_call(out, "call interrupted by a new section")
            self.state = SECTION
        elif token in (SECTION_END, SECTION_END_ALT):
            if in_call:
                self._close_call(out)
            self.state = TEXT
        elif token == CALL_BEGIN:
            if in_call:
                self._abort_call(out, "call interrupted by another call")
            self.in_section = self.state == SECTION
            self.state, self.header, self.args = HEADER, "", ""
        elif token == ARG_BEGIN and self.state == HEADER:
            self.state = ARGS
        elif token == CALL_END and in_call:
            self._close_call(out)
        # any other token out of place is dropped: it must never reach the client

    def _after_call(self) -> None:
        self.state = SECTION if self.in_section else TEXT
        self.header, self.args = "", ""

    def _display(self) -> str:
        return " ".join(part for part in (self.header.strip(), self.args.strip()) if part)

    def _raw(self) -> str:
        raw = CALL_BEGIN + self.header
        return raw + ARG_BEGIN + self.args if self.state == ARGS else raw

    def _close_call(self, out: list[Event]) -> None:
        if self.state == ARGS:
            self._end_call(out)
        else:
            self._abort_call(out, "call header without arguments")

    def _end_call(self, out: list[Event]) -> None:
        header = self.header.strip()
        match = _HEADER.match(header)
        name = match.group("name") if match else header
        call_id = header if match and match.group("idx") is not None and header.startswith("functions.") else None
        arguments = self.args if self.args.strip() else "{}"
        self.emit_call(out, name, arguments, raw=self._raw() + CALL_END, display=self._display(), call_id=call_id)
        self._after_call()

    def _abort_call(self, out: list[Event], reason: str) -> None:
        self.emit_failure(out, reason, self._raw(), self._display())
        self._after_call()

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._content(out, self.buf)
        if self.state in (HEADER, ARGS):
            self._abort_call(out, "unterminated tool call")
        self.buf, self.pending_ws, self.run_has_prose, self.state = "", "", False, TEXT
        return out
