"""Shared event types, schema checks and streaming helpers for the tool-call text parsers.

Every parser has the same shape::

    parser = get_parser("kimi", tools)      # tools: OpenAI-style tool specs (or None)
    events = parser.feed(chunk)             # any chunking; returns list[Event]
    events += parser.finish()               # flushes what was held back

Events are the canonical stream events (``proxy.canonical``), in the order produced:

* ``TextDelta(text)``: visible text. Never contains the format's control tokens.
* ``ReasoningDelta(text)``: reasoning text (kimi_k3 ``think`` elements, the ``<think>`` splitter).
* ``ToolCallStart(index, id, name)``, ``ToolCallArgsDelta(index, text)``,
  ``ToolCallEnd(index, id, name, arguments)``: one complete, validated call, back to back.
  ``text`` and ``arguments`` are the model's raw argument string, byte for byte (formats
  that have no JSON text build it once, see each module). ``index`` counts accepted calls
  from 0 per parser; the pipeline renumbers them among the turn's native calls.
* ``ParseFailure(reason, raw)``: a call was rejected (unknown tool, invalid JSON, malformed
  or unterminated markup). ``raw`` is the source text of the call; the parser also emits a
  ``TextDelta`` with a readable, control-token-free rendering of it. Count these in metrics.

Hold-back rule: while no full control token is in the buffer, a parser emits everything
except the longest suffix that is a proper prefix of a control token.
"""
from __future__ import annotations

import json
import secrets
from typing import Callable, Iterable

from proxy.canonical import (Event, ParseFailure, ReasoningDelta, TextDelta, ToolCallArgsDelta,
                             ToolCallEnd, ToolCallStart)


IdFactory = Callable[[], str]


def random_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def tool_names(tools: Iterable[dict] | None) -> frozenset[str] | None:
    """Names declared in OpenAI Chat, Responses or Anthropic tool specs; None = do not check."""
    if tools is None:
        return None
    names = set()
    for spec in tools:
        if not isinstance(spec, dict):
            continue
        fn = spec.get("function")
        name = fn.get("name") if isinstance(fn, dict) else spec.get("name")
        if isinstance(name, str):
            names.add(name)
    return frozenset(names)


def tool_parameters(tools: Iterable[dict] | None) -> dict[str, dict]:
    """name -> JSON-schema ``parameters`` (or ``input_schema``) of each declared tool."""
    params = {}
    for spec in tools or ():
        if not isinstance(spec, dict):
            continue
        fn = spec.get("function") if isinstance(spec.get("function"), dict) else spec
        schema = fn.get("parameters", fn.get("input_schema"))
        if isinstance(fn.get("name"), str) and isinstance(schema, dict):
            params[fn["name"]] = schema
    return params


def check_call(names: frozenset[str] | None, name: str, arguments: str) -> str | None:
    """Why a call must be rejected, or None. Arguments must be a JSON object."""
    if not name:
        return "missing tool name"
    if names is not None and name not in names:
        return f"unknown tool {name!r}"
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        return f"invalid JSON arguments for {name!r}: {exc.msg}"
    if not isinstance(value, dict):
        return f"arguments for {name!r} are not a JSON object"
    return None


def held_suffix_len(buf: str, tokens: Iterable[str]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of some token.

    Runs on every text delta: a held suffix starts where buf holds the token's first
    character, so only those places are tried (str.find), not every length."""
    best = 0
    for token in tokens:
        if len(token) < 2:
            continue
        start = buf.find(token[0], max(0, len(buf) - len(token) + 1))
        while 0 <= start < len(buf) - best:
            if token.startswith(buf[start:]):
                best = len(buf) - start
                break
            start = buf.find(token[0], start + 1)
    return best


def next_token(buf: str, tokens: Iterable[str]) -> tuple[str, str | None, str]:
    """Split buf at its earliest full token: (before, token, after).

    Without a full token: (safe, None, held), where held may still start a token.
    """
    tokens = tuple(tokens)
    best_pos, best_tok = -1, None
    for token in tokens:
        pos = buf.find(token)
        if pos >= 0 and (best_pos < 0 or pos < best_pos or (pos == best_pos and len(token) > len(best_tok))):
            best_pos, best_tok = pos, token
    if best_tok is not None:
        return buf[:best_pos], best_tok, buf[best_pos + len(best_tok):]
    keep = held_suffix_len(buf, tokens)
    return buf[:len(buf) - keep], None, buf[len(buf) - keep:]


class Parser:
    """Base class: schema checks, call ids and call emission. Subclasses implement feed/finish."""

    name = "base"

    def __init__(self, tools: list[dict] | None = None, new_id: IdFactory | None = None):
        self.tool_names = tool_names(tools)
        self.tool_params = tool_parameters(tools)
        self.new_id = new_id or random_call_id
        self.num_calls = 0

    def feed(self, text: str) -> list[Event]:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError

    def emit_call(self, out: list[Event], name: str, arguments: str, *, raw: str,
                  display: str, call_id: str | None = None) -> bool:
        """Append a validated call, or a ParseFailure plus ``display`` as text. True if accepted."""
        reason = check_call(self.tool_names, name, arguments)
        if reason is not None:
            self.emit_failure(out, reason, raw, display)
            return False
        index = self.num_calls
        self.num_calls += 1
        call_id = call_id or self.new_id()
        out.append(ToolCallStart(index, call_id, name))
        out.append(ToolCallArgsDelta(index, arguments))
        out.append(ToolCallEnd(index, call_id, name, arguments))
        return True

    @staticmethod
    def emit_failure(out: list[Event], reason: str, raw: str, display: str) -> None:
        out.append(ParseFailure(reason, raw))
        if display:
            out.append(TextDelta(display))


class TokenParser(Parser):
    """A parser driven by control tokens: text between tokens goes to `_content`, each token to
    `_token`; a suffix that could start a token is held back until the next feed."""

    TOKENS: tuple[str, ...] = ()

    def __init__(self, tools: list[dict] | None = None, new_id: IdFactory | None = None):
        super().__init__(tools, new_id)
        self.buf = ""
        self.pending_ws = ""        # whitespace in a run between tokens, not yet known to be prose
        self.run_has_prose = False

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self.buf += text
        while True:
            before, token, after = next_token(self.buf, self.TOKENS)
            self._content(out, before)
            self.buf = after
            if token is None:
                return out
            self.pending_ws, self.run_has_prose = "", False
            self._token(out, token)

    def _prose(self, out: list[Event], text: str) -> None:
        """Text between calls (a calls section): whitespace-only runs are dropped, prose is
        kept verbatim. The decision waits for the first non-whitespace character, so it does
        not depend on the chunking."""
        if not self.run_has_prose and not text.strip():
            self.pending_ws += text
            return
        emit_text(out, self.pending_ws + text)
        self.pending_ws, self.run_has_prose = "", True

    def _content(self, out: list[Event], text: str) -> None:
        raise NotImplementedError

    def _token(self, out: list[Event], token: str) -> None:
        raise NotImplementedError


def emit_text(out: list[Event], text: str, reasoning: bool = False) -> None:
    if text:
        out.append(ReasoningDelta(text) if reasoning else TextDelta(text))
