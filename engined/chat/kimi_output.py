"""Streaming parser for Kimi K2-family output (reference §4.3): text -> content, reasoning and
native tool calls, incrementally.

    <|tool_calls_section_begin|>                       (optional wrapper)
      <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{ARGS}<|tool_call_end|>
    <|tool_calls_section_end|>

A call's id and name are sent once the argument marker arrives; argument text streams as it
comes, byte for byte (never re-serialized). `<think>...</think>` becomes reasoning. Only a suffix
that could still grow into a marker is held back. Same feed()/finish()/tool_calls API and event
classes as engined.chat.output.OutputParser; feeding whole or split anywhere gives the same result.
"""
from __future__ import annotations

from engined.chat.output import ContentDelta, Delta, ReasoningDelta, ToolCallDelta, held_suffix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SECTION_OPEN, SECTION_CLOSE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_OPEN, ARGS_OPEN, CALL_CLOSE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def name_of(call_id: str) -> str:
    """'functions.get_weather:0' -> 'get_weather' (the id itself is echoed back verbatim)."""
    stem = call_id.strip().rpartition(":")[0] or call_id.strip()
    return stem.removeprefix("functions.")


class KimiOutputParser:
    def __init__(self, tools_enabled: bool, in_reasoning: bool = False):
        self._tools = tools_enabled
        self._mode = "reasoning" if in_reasoning else "content"
        self._buf = ""
        self._in_section = False
        self.tool_calls: list[dict] = []

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        out: list[Delta] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        while self._step(out, final=True):
            pass
        rest, self._buf = self._buf, ""
        if self._mode == "reasoning" and rest:
            out.append(ReasoningDelta(rest))
        elif self._mode == "args" and rest:
            self._args(rest, out)
        elif self._mode == "content" and rest:
            out.append(ContentDelta(rest))
        # an id cut off before its argument marker, or a dangling section, carries no call
        self._mode = "content"
        return out

    def _step(self, out: list[Delta], final: bool) -> bool:
        mode = self._mode
        if mode == "content":
            tags = (THINK_OPEN, SECTION_OPEN, CALL_OPEN) if self._tools else (THINK_OPEN,)
            return self._until(tags, out, ContentDelta, final)
        if mode == "reasoning":
            return self._until((THINK_CLOSE,), out, ReasoningDelta, final)
        if mode == "section":
            return self._step_section()
        if mode == "id":
            return self._step_id(out)
        return self._until((CALL_CLOSE,), out, None, final)

    def _until(self, tags, out, kind, final: bool) -> bool:
        """Emit text up to the first of `tags` (holding a possible partial tag), then switch."""
        found = [(self._buf.find(t), t) for t in tags if t in self._buf]
        if not found:
            keep = 0 if final else held_suffix(self._buf, tags)
            self._emit(self._buf[:len(self._buf) - keep], out, kind)
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        pos, tag = min(found)
        self._emit(self._buf[:pos], out, kind)
        self._buf = self._buf[pos + len(tag):]
        self._mode = {THINK_OPEN: "reasoning", THINK_CLOSE: "content", SECTION_OPEN: "section",
                      CALL_OPEN: "id", CALL_CLOSE: "section" if self._in_section else "content"}[tag]
        if tag in (SECTION_OPEN, CALL_OPEN):   # a call opened from content is a bare one
            self._in_section = tag == SECTION_OPEN
        return True

    def _emit(self, text: str, out, kind):
        if not text:
            return
        if kind is None:
            self._args(text, out)
        else:
            out.append(kind(text))

    def _step_section(self) -> bool:
        """Between calls inside a section: whitespace is dropped; a call or the close follows."""
        body = self._buf.lstrip()
        for tag, mode in ((CALL_OPEN, "id"), (SECTION_CLOSE, "content")):
            if body.startswith(tag):
                self._buf, self._mode = body[len(tag):], mode
                self._in_section = mode == "id"
                return True
        if body and not any(t.startswith(body) for t in (CALL_OPEN, SECTION_CLOSE)):
            self._mode, self._in_section = "content", False   # stray text: back to content
            return True
        return False

    def _step_id(self, out) -> bool:
        pos = self._buf.find(ARGS_OPEN)
        if pos < 0:
            return False
        call_id, self._buf = self._buf[:pos].strip(), self._buf[pos + len(ARGS_OPEN):]
        index = len(self.tool_calls)
        self.tool_calls.append({"id": call_id, "type": "function",
                                "function": {"name": name_of(call_id), "arguments": ""}})
        out.append(ToolCallDelta(index, call_id, name_of(call_id), ""))
        self._mode = "args"
        return True

    def _args(self, text: str, out):
        call = self.tool_calls[-1]
        call["function"]["arguments"] += text
        out.append(ToolCallDelta(len(self.tool_calls) - 1, None, None, text))
