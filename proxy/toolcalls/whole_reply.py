"""Shared driver for formats where the whole reply is the call list (``json``, ``pythonic``).

The reply is held only while its beginning could still be a call. As soon as the prefix
rules it out (for example ``[link](…)``), everything held is emitted and the rest streams
through. A reply that does look like a call is held to the end, except that prose after
a complete call expression sends it all out as text at once.
"""
from __future__ import annotations

from proxy.canonical import Event

from .base import Parser, emit_text

MAYBE, YES, NO = "maybe", "yes", "no"


class WholeReplyParser(Parser):
    """Subclasses define ``prefix_state(text)``, ``has_trailing_text(text)`` and ``parse(text, out)``."""

    def __init__(self, tools=None, new_id=None):
        super().__init__(tools, new_id)
        self.buf = ""
        self.state = MAYBE

    def prefix_state(self, text: str) -> str:
        raise NotImplementedError

    def has_trailing_text(self, text: str) -> bool:
        raise NotImplementedError

    def parse(self, text: str, out: list[Event]) -> None:
        raise NotImplementedError

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        if self.state == NO:
            emit_text(out, text)
            return out
        self.buf += text
        if self.state == MAYBE:
            self.state = self.prefix_state(self.buf)
        if self.state == YES and self.has_trailing_text(self.buf):
            self.state = NO
        if self.state == NO:
            emit_text(out, self.buf)
            self.buf = ""
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self.state == YES:
            self.parse(self.buf, out)
        else:
            emit_text(out, self.buf)
        self.buf, self.state = "", MAYBE
        return out
