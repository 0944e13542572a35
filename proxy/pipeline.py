"""Upstream OpenAI-Chat chunks -> canonical events (streamed and non-streamed alike).

A non-stream upstream JSON is first turned into equivalent chunks (`chunks_from_json`),
so both paths share one loop. Native tool calls are accumulated per `index`, so
interleaved parallel calls stay separate; canonical indices count calls in the order
they start. Reasoning is read from `reasoning_content`/`reasoning` and, when the
reasoning field is `auto` or `inline`, from `<think>` spans in the content. The matched
stop string comes from vLLM's `stop_reason` or SGLang's `matched_stop`.
"""
from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from proxy import canonical as c
from proxy.toolcalls.think import ThinkSplitter

FINISH_MAP = {"stop": "stop", "length": "length", "max_tokens": "length",
              "tool_calls": "tool_calls", "function_call": "tool_calls",
              "content_filter": "content_filter"}


@dataclass
class Options:
    client_model: str
    parser: object                       # a proxy.toolcalls parser (feed/finish)
    split_think: bool = False            # reasoning field auto|inline
    stop: tuple[str, ...] = ()
    sign: Callable[[str], str | None] = lambda text: None
    reasoning_key: str | None = "reasoning_content"  # where reasoning goes in upstream_message
    on_parse_failure: Callable[[str], None] = lambda reason: None


@dataclass
class _Native:
    id: str | None = None
    name: str = ""
    args: list = field(default_factory=list)
    is_args_begun: bool = False
    index: int | None = None  # canonical index once started


def chunks_from_json(body: dict) -> list[dict]:
    """A non-stream chat.completion as the chunks a stream would have carried."""
    ident = {"id": body.get("id"), "model": body.get("model")}
    choices = body.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    msg = choice.get("message") or {}
    out = []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")  # vLLM sent both during its rename
    if reasoning:
        out.append({**ident, "choices": [{"index": 0, "delta": {"reasoning_content": reasoning}}]})
    if msg.get("content"):
        out.append({**ident, "choices": [{"index": 0, "delta": {"content": msg["content"]}}]})
    for i, call in enumerate(msg.get("tool_calls") or []):
        if isinstance(call, dict):
            out.append({**ident, "choices": [{"index": 0, "delta": {"tool_calls": [{**call, "index": i}]}}]})
    final = {"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}
    if isinstance(choice.get("logprobs"), dict):
        final["logprobs"] = choice["logprobs"]
    for key in ("stop_reason", "matched_stop"):
        if key in choice:
            final[key] = choice[key]
    out.append({**ident, "choices": [final], "usage": body.get("usage")})
    return out


def usage_from(raw) -> c.Usage:
    if not isinstance(raw, dict):
        return c.Usage()
    num = lambda v: v if isinstance(v, int) and not isinstance(v, bool) else 0  # noqa: E731
    pd = raw.get("prompt_tokens_details") or {}
    cd = raw.get("completion_tokens_details") or {}
    return c.Usage(num(raw.get("prompt_tokens")), num(raw.get("completion_tokens")),
                   num(pd.get("cached_tokens")) if isinstance(pd, dict) else 0,
                   num(cd.get("reasoning_tokens")) if isinstance(cd, dict) else 0)


class Pipeline:
    """One upstream turn. `run(chunks)` yields canonical events ending in StreamEnd."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.splitter = ThinkSplitter() if opts.split_think else None
        self.id = "chatcmpl-" + secrets.token_hex(12)
        self.usage = c.Usage()
        self.finish: str | None = None
        self.stop_sequence: str | None = None
        self.segment: list[str] | None = None     # open reasoning segment
        self.reasoning_parts: list[c.Reasoning] = []
        self.text: list[str] = []
        self.native: dict[int, _Native] = {}
        self.parsed: dict[int, int] = {}          # parser index -> canonical index
        self.calls: dict[int, c.ToolCall] = {}    # canonical index -> finished call
        self.num_started = 0
        self.logprobs: list = []

    def run(self, chunks: Iterable[dict]) -> Iterator[c.Event]:
        started = False
        for chunk in chunks:
            if not started:
                started = True
                self.id = chunk.get("id") or self.id
                yield c.StreamStart(self.id, self.opts.client_model)
            yield from self._chunk(chunk)
        if not started:
            yield c.StreamStart(self.id, self.opts.client_model)
        yield from self._end()

    # -- per chunk ---------------------------------------------------------------------
    def _chunk(self, chunk: dict) -> Iterator[c.Event]:
        if chunk.get("usage"):
            self.usage = self.usage.merged(usage_from(chunk["usage"]))
            yield c.UsageUpdate(self.usage)
        choices = chunk.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            yield from self._reasoning(reasoning)
        content = _content_text(delta.get("content"))
        if content:
            yield from self._content(content)
        for position, frag in enumerate(delta.get("tool_calls") or ()):
            if isinstance(frag, dict):
                yield from self._native_fragment(frag, position)
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list) and logprobs["content"]:
            self.logprobs.extend(logprobs["content"])
            yield c.LogprobsDelta(tuple(logprobs["content"]))
        if choice.get("finish_reason"):
            self.finish = FINISH_MAP.get(choice["finish_reason"], "stop")
            matched = [choice.get(key) for key in ("stop_reason", "matched_stop")]  # vLLM's, SGLang's
            self.stop_sequence = next((m for m in matched if isinstance(m, str) and m in self.opts.stop), None)

    def _content(self, text: str) -> Iterator[c.Event]:
        yield from self._split(self.splitter.feed(text) if self.splitter else [c.TextDelta(text)])

    def _split(self, pieces: list) -> Iterator[c.Event]:
        """<think> spans are reasoning; the text around them goes through the tool-call parser."""
        for piece in pieces:
            if isinstance(piece, c.ReasoningDelta):
                yield from self._reasoning(piece.text)
            else:
                yield from self._parsed(self.opts.parser.feed(piece.text))

    def _reasoning(self, text: str) -> Iterator[c.Event]:
        if self.segment is None:
            self.segment = []
        self.segment.append(text)
        yield c.ReasoningDelta(text)

    def _close_reasoning(self) -> Iterator[c.Event]:
        if self.segment is None:
            return
        text, self.segment = "".join(self.segment), None
        part = c.Reasoning(text, self.opts.sign(text))
        self.reasoning_parts.append(part)
        yield c.ReasoningEnd(text, part.signature)

    def _parsed(self, events: list) -> Iterator[c.Event]:
        for ev in events:
            if isinstance(ev, c.ReasoningDelta):
                yield from self._reasoning(ev.text)
                continue
            if isinstance(ev, c.ParseFailure):
                self.opts.on_parse_failure(ev.reason)
                continue
            yield from self._close_reasoning()
            if isinstance(ev, c.TextDelta):
                self.text.append(ev.text)
                yield ev
            elif isinstance(ev, c.ToolCallStart):
                self.parsed[ev.index] = self._next_index()
                yield dataclasses.replace(ev, index=self.parsed[ev.index])
            elif isinstance(ev, c.ToolCallArgsDelta):
                yield dataclasses.replace(ev, index=self.parsed[ev.index])
            elif isinstance(ev, c.ToolCallEnd):
                yield self._finish_call(self.parsed[ev.index], ev.id, ev.name, ev.arguments)

    def _next_index(self) -> int:
        self.num_started += 1
        return self.num_started - 1

    def _finish_call(self, index: int, call_id: str, name: str, args: str) -> c.ToolCallEnd:
        self.calls[index] = c.ToolCall(call_id, name, args)
        return c.ToolCallEnd(index, call_id, name, args)

    # -- native tool calls ---------------------------------------------------------------
    def _native_fragment(self, frag: dict, position: int) -> Iterator[c.Event]:
        key = frag.get("index") if isinstance(frag.get("index"), int) else position  # index-less servers
        call = self.native.setdefault(key, _Native())
        if isinstance(frag.get("id"), str) and frag["id"] and call.id is None:
            call.id = frag["id"]
        fn = frag.get("function") if isinstance(frag.get("function"), dict) else {}
        name = fn.get("name")
        if isinstance(name, str) and name and name != call.name and (not call.is_args_begun or not call.name):
            call.name += name  # name pieces join until arguments begin; a repeated full name is ignored
        args = fn.get("arguments")
        if isinstance(args, (dict, list)):
            args = json.dumps(args)
        if isinstance(args, str):
            call.is_args_begun = True
            if args:
                call.args.append(args)
                if call.index is not None:
                    yield c.ToolCallArgsDelta(call.index, args)
        if call.index is None and call.name and call.is_args_begun:
            yield from self._start_native(key, call)

    def _start_native(self, key: int, call: _Native) -> Iterator[c.Event]:
        yield from self._close_reasoning()
        call.index = self._next_index()
        if call.id is None:
            call.id = f"call_{key}"
        yield c.ToolCallStart(call.index, call.id, call.name)
        if call.args:
            yield c.ToolCallArgsDelta(call.index, "".join(call.args))

    # -- end ---------------------------------------------------------------------------
    def _end(self) -> Iterator[c.Event]:
        if self.splitter:
            yield from self._split(self.splitter.finish())
        yield from self._parsed(self.opts.parser.finish())
        yield from self._close_reasoning()
        for key in sorted(self.native):
            call = self.native[key]
            if call.index is None and call.name:
                yield from self._start_native(key, call)
            if call.index is not None:
                yield self._finish_call(call.index, call.id, call.name, "".join(call.args))
        finish = self.finish or "stop"
        if self.calls and finish == "stop":
            finish = "tool_calls"
        if self.stop_sequence is not None and finish == "stop":
            finish = "stop_sequence"
        response = self._response(finish)
        yield c.StreamEnd(finish, response.usage, response, self.stop_sequence)

    def _response(self, finish: str) -> c.Response:
        text = "".join(self.text)
        reasoning = "".join(p.text for p in self.reasoning_parts)
        usage = self.usage
        if not usage.output_tokens:
            usage = usage.merged(c.Usage(output_tokens=max(1, (len(text) + len(reasoning)) // 4)))
        if not usage.reasoning_tokens and reasoning:
            usage = usage.merged(c.Usage(reasoning_tokens=max(1, len(reasoning) // 4)))
        calls = [self.calls[i] for i in sorted(self.calls)]
        parts = (*self.reasoning_parts, *([c.Text(text)] if text else []), *calls)
        return c.Response(self.id, self.opts.client_model, parts, finish, self.stop_sequence,
                          usage, self._upstream_message(text, reasoning, calls),
                          tuple(self.logprobs) if self.logprobs else None)

    def _upstream_message(self, text: str, reasoning: str, calls: list[c.ToolCall]) -> dict:
        msg = {"role": "assistant", "content": text}
        key = self.opts.reasoning_key
        if reasoning and key == "inline":
            msg["content"] = f"<think>{reasoning}</think>{text}"
        elif reasoning and key and key != "none":
            msg[key] = reasoning
        if calls:
            msg["tool_calls"] = [{"id": t.id, "type": "function",
                                  "function": {"name": t.name, "arguments": t.arguments}} for t in calls]
        return msg


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def one_call_at_a_time(events: Iterable[c.Event]) -> Iterator[c.Event]:
    """Reorder interleaved tool-call events so calls never overlap (Anthropic, Responses).

    The first call to start streams live; others are buffered until it ends, then
    flushed in start order. Concatenated deltas per call are unchanged.
    """
    active: int | None = None
    pending: dict[int, list] = {}
    for ev in events:
        index = getattr(ev, "index", None)
        if not isinstance(ev, (c.ToolCallStart, c.ToolCallArgsDelta, c.ToolCallEnd)):
            yield ev
            continue
        if active is None and isinstance(ev, c.ToolCallStart) and not pending:
            active = index
        if index != active:
            pending.setdefault(index, []).append(ev)
            continue
        yield ev
        if isinstance(ev, c.ToolCallEnd):
            active = None
            while pending:
                nxt = next(iter(pending))
                buffered = pending.pop(nxt)
                yield from buffered
                if not isinstance(buffered[-1], c.ToolCallEnd):
                    active = nxt
                    break
