"""``passthrough`` (alias ``none``): text in, text out; the upstream's native tool_calls are the only calls."""
from __future__ import annotations

from proxy.canonical import Event

from .base import Parser, emit_text


class PassthroughParser(Parser):
    name = "passthrough"

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        emit_text(out, text)
        return out

    def finish(self) -> list[Event]:
        return []
