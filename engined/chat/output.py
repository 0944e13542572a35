"""Streaming parser: generated text -> content, reasoning and tool-call deltas.

Three modes. In content, `<think>` switches to reasoning and (with tools) `<tool_call>`
to a call; in reasoning, `</think>` switches back. Only a suffix that could still grow
into a tag is held back, so `[link]` or `<b>` streams at once. A call body is held
until `</tool_call>`; it becomes a native tool call when it is one JSON object with a
string "name" and object "arguments" (whose raw text is kept byte for byte), and plain
content otherwise. Feeding the text whole or split anywhere gives the same result.
"""
from __future__ import annotations

import dataclasses
import json
import secrets
import string

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_ID_ALPHABET = string.ascii_letters + string.digits


@dataclasses.dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclasses.dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclasses.dataclass(frozen=True)
class ToolCallDelta:
    index: int
    id: str | None
    name: str | None
    arguments: str


Delta = ContentDelta | ReasoningDelta | ToolCallDelta


def held_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a tag."""
    longest = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:k]):
                longest = k
                break
    return longest


def _members(text: str) -> dict[str, str]:
    """Raw source text of each top-level member of a JSON object already known to be valid."""
    decoder, members, i = json.JSONDecoder(), {}, 1
    skip = lambda j: len(text) - len(text[j:].lstrip())  # noqa: E731 - index after whitespace
    while text[skip(i)] != "}":
        key, i = decoder.raw_decode(text, skip(i))
        start = skip(skip(i) + 1)                        # past the ':'
        _, i = decoder.raw_decode(text, start)
        members[key] = text[start:i]
        i = skip(i) + (text[skip(i)] == ",")
    return members


def parse_call(body: str) -> tuple[str, str] | None:
    """(name, raw arguments JSON) of a hermes call body, or None if it is not one."""
    text = body.strip()
    try:
        call, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None
    if end != len(text) or not isinstance(call, dict):
        return None
    name, key = call.get("name"), "arguments" if "arguments" in call else "parameters"
    arguments = call.get(key, {})
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):          # a double-encoded model: the string is the JSON
        return name, arguments
    if not isinstance(arguments, dict):
        return None
    return name, _members(text).get(key, "{}")


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


class OutputParser:
    def __init__(self, tools_enabled: bool, in_reasoning: bool = False):
        """in_reasoning: the prompt already opened <think>, so output starts as reasoning."""
        self._open_tags = (THINK_OPEN, CALL_OPEN) if tools_enabled else (THINK_OPEN,)
        self._mode = "reasoning" if in_reasoning else "content"
        self._buf = ""
        self._is_after_call = False
        self._space_after_call = ""   # whitespace right after a call: sent only if content follows
        self.tool_calls: list[dict] = []

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        out: list[Delta] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        while self._step(out):
            pass
        rest, self._buf = self._buf, ""
        if self._mode == "reasoning" and rest:
            out.append(ReasoningDelta(rest))
        elif self._mode == "call":
            self._end_call(rest, closed=False, out=out)
        else:
            self._content(rest, out)
        self._mode = "content"
        return out

    def _step(self, out: list[Delta]) -> bool:
        """Consume what can be decided now; True when a tag was crossed and more may follow."""
        if self._mode == "content":
            return self._step_content(out)
        if self._mode == "reasoning":
            return self._step_reasoning(out)
        return self._step_call(out)

    def _step_content(self, out: list[Delta]) -> bool:
        found = [(self._buf.find(tag), tag) for tag in self._open_tags if tag in self._buf]
        if not found:
            keep = held_suffix(self._buf, self._open_tags)
            self._content(self._buf[:len(self._buf) - keep], out)
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        pos, tag = min(found)
        self._content(self._buf[:pos], out)
        self._buf = self._buf[pos + len(tag):]
        self._mode = "reasoning" if tag == THINK_OPEN else "call"
        return True

    def _step_reasoning(self, out: list[Delta]) -> bool:
        pos = self._buf.find(THINK_CLOSE)
        end = pos if pos >= 0 else len(self._buf) - held_suffix(self._buf, (THINK_CLOSE,))
        if end:
            out.append(ReasoningDelta(self._buf[:end]))
        if pos < 0:
            self._buf = self._buf[end:]
            return False
        self._buf, self._mode = self._buf[pos + len(THINK_CLOSE):], "content"
        return True

    def _step_call(self, out: list[Delta]) -> bool:
        body = self._buf.lstrip()
        if body and body[0] != "{":            # not JSON: the tag was just text
            self._mode = "content"
            self._content(CALL_OPEN, out)
            return True
        pos = self._buf.find(CALL_CLOSE)
        if pos < 0:
            return False
        body, self._buf = self._buf[:pos], self._buf[pos + len(CALL_CLOSE):]
        self._mode = "content"
        self._end_call(body, closed=True, out=out)
        return True

    def _end_call(self, body: str, closed: bool, out: list[Delta]) -> None:
        parsed = parse_call(body)
        if parsed is None:
            self._content(CALL_OPEN + body + (CALL_CLOSE if closed else ""), out)
            return
        name, arguments = parsed
        call_id, index = new_call_id(), len(self.tool_calls)
        self.tool_calls.append({"id": call_id, "type": "function",
                                "function": {"name": name, "arguments": arguments}})
        out.append(ToolCallDelta(index, call_id, name, arguments))
        self._is_after_call, self._space_after_call = True, ""

    def _content(self, text: str, out: list[Delta]) -> None:
        if not text:
            return
        if self._is_after_call:
            text = self._space_after_call + text
            if not text.strip():
                self._space_after_call = text
                return
            self._is_after_call, self._space_after_call = False, ""
        out.append(ContentDelta(text))
