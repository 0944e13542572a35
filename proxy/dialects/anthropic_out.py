"""Anthropic Messages egress: the non-stream message and the event stream.

Stream: message_start and a ping before the engine's first token, pings while it is
quiet, one content block open at a time with indices 0..n-1, the signature_delta inside
its thinking block, message_delta (with `stop_sequence`) and message_stop. Under
`thinking.display: "omitted"` a thinking block carries no text, only its signature.

A tool_use `input` is always an object. Arguments that are JSON but not an object (a server
answered a forced call with `"Paris"`) become {"value": ...}, streamed and not, logged once
per request. Streamed, a call's arguments are held until their first non-space character
says whether they are an object; an object streams on as it comes.
"""
from __future__ import annotations

import json
import logging
from typing import Iterator

from proxy import canonical as c
from proxy.dialects import common as d

log = logging.getLogger("kimi.proxy")
ID_PREFIX = "toolu_"
STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
        "stop_sequence": "stop_sequence", "content_filter": "refusal", "error": "end_turn"}


def to_client_id(engine_id: str) -> str:
    return ID_PREFIX + engine_id


def _shows_thinking(req: c.Request, policy) -> bool:
    return policy.reasoning == "thinking_blocks" and req.thinking_enabled is not False


def usage_body(u: c.Usage) -> dict:
    return {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": u.cached_input_tokens}


def render_response(turn: d.Turn, req: c.Request, resp: c.Response, policy) -> dict:
    content: list = []
    if _shows_thinking(req, policy):
        for r in resp.reasoning():
            content.append({"type": "redacted_thinking", "data": r.signature or ""} if r.redacted
                           else {"type": "thinking", "thinking": "" if req.is_reasoning_withheld else r.text,
                                 "signature": r.signature or ""})
    text = resp.text()
    reasoning = "".join(r.text for r in resp.reasoning() if not r.redacted)
    if policy.reasoning == "inline_tags" and reasoning and not req.is_reasoning_withheld:
        text = f"<think>{reasoning}</think>{text}"
    if text:
        content.append({"type": "text", "text": text})
    calls = resp.tool_calls()
    for t in calls:
        content.append({"type": "tool_use", "id": to_client_id(t.id), "name": t.name,
                        "input": d.parse_args_object(t.arguments)})
    _log_wrapped([t for t in calls if not _is_object_text(t.arguments)])
    usage = resp.usage if resp.usage.input_tokens else c.Usage(
        turn.input_estimate, resp.usage.output_tokens, resp.usage.cached_input_tokens)
    return {"id": turn.id, "type": "message", "role": "assistant", "model": turn.client_model,
            "content": content or [{"type": "text", "text": ""}],
            "stop_reason": STOP.get(resp.finish_reason, "end_turn"),
            "stop_sequence": resp.stop_sequence, "usage": usage_body(usage)}


def _is_object_text(raw: str) -> bool:
    """Whether arguments are (the start of) a JSON object, or nothing at all."""
    head = raw.lstrip()
    return not head or head[0] == "{"


def _log_wrapped(calls: list) -> None:
    if calls:
        log.warning("tool input is not a JSON object, sent as {\"value\": ...}: %s",
                    ", ".join(f"{t.name} {t.arguments[:80]!r}" for t in calls))


class _Blocks:
    """At most one open content block; indices 0..n-1 without gaps."""

    def __init__(self):
        self.num_blocks = 0
        self.open_kind: str | None = None

    def open(self, kind: str, block: dict) -> list:
        frames = self.close()
        self.open_kind = kind
        frames.append(("content_block_start", {"type": "content_block_start",
                                               "index": self.num_blocks, "content_block": block}))
        return frames

    def delta(self, delta: dict) -> tuple:
        return "content_block_delta", {"type": "content_block_delta", "index": self.num_blocks,
                                       "delta": delta}

    def close(self) -> list:
        if self.open_kind is None:
            return []
        self.open_kind = None
        self.num_blocks += 1
        return [("content_block_stop", {"type": "content_block_stop", "index": self.num_blocks - 1})]


def stream(turn: d.Turn, req: c.Request, events, policy) -> Iterator:
    yield "message_start", {"type": "message_start", "message": {
        "id": turn.id, "type": "message", "role": "assistant", "model": turn.client_model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": usage_body(c.Usage(turn.input_estimate))}}
    yield "ping", {"type": "ping"}
    is_inline = policy.reasoning == "inline_tags" and not req.is_reasoning_withheld
    out = _Stream(turn, _shows_thinking(req, policy), is_inline, req.is_reasoning_withheld)
    for ev in events:
        yield from out.on(ev)


class _Stream:
    """Canonical events -> Anthropic frames, one handler per event type."""

    def __init__(self, turn: d.Turn, shows_thinking: bool, is_inline: bool, is_withheld: bool = False):
        self.turn, self.shows_thinking, self.is_inline = turn, shows_thinking, is_inline
        self.is_withheld = is_withheld  # thinking.display "omitted": the block and signature, no text
        self.blocks = _Blocks()
        self.is_think_open = False
        self.held: list[str] | None = None  # a call's arguments until they show an object or not
        self.is_wrap_logged = False

    def on(self, ev) -> Iterator:
        if ev is d.KEEPALIVE:
            return iter([("ping", {"type": "ping"})])
        handler = getattr(self, "_" + type(ev).__name__, None)
        return handler(ev) if handler else iter(())

    def _ensure(self, kind: str, block: dict) -> Iterator:
        if self.blocks.open_kind != kind:
            yield from self.blocks.open(kind, block)

    def _ReasoningDelta(self, ev: c.ReasoningDelta) -> Iterator:
        if self.shows_thinking:
            yield from self._ensure("thinking", {"type": "thinking", "thinking": ""})
            if not self.is_withheld:
                yield self.blocks.delta({"type": "thinking_delta", "thinking": ev.text})
        elif self.is_inline:
            yield from self._ensure("text", {"type": "text", "text": ""})
            if not self.is_think_open:
                self.is_think_open = True
                yield self.blocks.delta({"type": "text_delta", "text": "<think>"})
            yield self.blocks.delta({"type": "text_delta", "text": ev.text})

    def _ReasoningEnd(self, ev: c.ReasoningEnd) -> Iterator:
        if self.blocks.open_kind == "thinking":  # the signature lands inside its own block
            yield self.blocks.delta({"type": "signature_delta", "signature": ev.signature or ""})
            yield from self.blocks.close()
        elif self.is_think_open:
            self.is_think_open = False
            yield self.blocks.delta({"type": "text_delta", "text": "</think>"})

    def _TextDelta(self, ev: c.TextDelta) -> Iterator:
        yield from self._ensure("text", {"type": "text", "text": ""})
        yield self.blocks.delta({"type": "text_delta", "text": ev.text})

    def _ToolCallStart(self, ev: c.ToolCallStart) -> Iterator:
        self.held = []
        yield from self.blocks.open("tool_use", {"type": "tool_use", "id": to_client_id(ev.id),
                                                 "name": ev.name, "input": {}})

    def _ToolCallArgsDelta(self, ev: c.ToolCallArgsDelta) -> Iterator:
        if self.held is None:
            yield self.blocks.delta({"type": "input_json_delta", "partial_json": ev.text})
            return
        self.held.append(ev.text)
        text = "".join(self.held)
        if text.lstrip()[:1] == "{":
            self.held = None  # an object: what was held goes out, the rest streams
            yield self.blocks.delta({"type": "input_json_delta", "partial_json": text})

    def _ToolCallEnd(self, ev: c.ToolCallEnd) -> Iterator:
        if self.held is not None:  # no object began: the whole arguments decide
            text = ev.arguments if ev.arguments.strip() else ""
            if not _is_object_text(text):
                if not self.is_wrap_logged:
                    self.is_wrap_logged = True
                    _log_wrapped([ev])
                text = json.dumps(d.parse_args_object(text), ensure_ascii=False)
            if text:
                yield self.blocks.delta({"type": "input_json_delta", "partial_json": text})
        self.held = None
        yield from self.blocks.close()

    def _StreamEnd(self, ev: c.StreamEnd) -> Iterator:
        yield from self.blocks.close()
        yield "message_delta", {"type": "message_delta", "delta": {
            "stop_reason": STOP.get(ev.finish_reason, "end_turn"), "stop_sequence": ev.stop_sequence},
            "usage": {"input_tokens": ev.usage.input_tokens or self.turn.input_estimate,
                      "output_tokens": ev.usage.output_tokens}}
        yield "message_stop", {"type": "message_stop"}
