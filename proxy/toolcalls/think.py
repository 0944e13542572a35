"""Inline ``<think>…</think>`` splitter (protocols.md §4.7), streaming-safe.

    splitter = ThinkSplitter(starts_in_reasoning=False)
    events = splitter.feed(chunk) + splitter.finish()   # TextDelta / ReasoningDelta

Each ``<think>`` switches to the reasoning channel and each ``</think>`` back to text; the
tags themselves are never emitted. A partial tag at the end of a chunk is held back, so a
tag split across chunks (``<th`` | ``ink>``) never leaks. ``starts_in_reasoning`` serves
templates that open ``<think>`` in the prompt, so the reply starts inside reasoning. A
``</think>`` seen in the text channel is dropped. Leftovers at finish go to the current
channel.
"""
from __future__ import annotations

from proxy.canonical import Event, ReasoningDelta, TextDelta

from .base import emit_text, next_token

OPEN, CLOSE = "<think>", "</think>"


class ThinkSplitter:
    def __init__(self, starts_in_reasoning: bool = False):
        self.is_reasoning = starts_in_reasoning
        self.buf = ""

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self.buf += text
        while True:
            before, token, after = next_token(self.buf, (OPEN, CLOSE))
            emit_text(out, before, self.is_reasoning)
            self.buf = after
            if token is None:
                return out
            self.is_reasoning = token == OPEN

    def finish(self) -> list[Event]:
        out: list[Event] = []
        emit_text(out, self.buf, self.is_reasoning)
        self.buf = ""
        return out


def split_think(text: str) -> tuple[str, str]:
    """Whole-string helper: (reasoning, visible text) of a finished reply."""
    splitter = ThinkSplitter()
    events = splitter.feed(text) + splitter.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    visible = "".join(e.text for e in events if isinstance(e, TextDelta))
    return reasoning, visible
