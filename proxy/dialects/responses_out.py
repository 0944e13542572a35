"""OpenAI Responses egress: the response envelope, its items, and the event stream.

Every event carries `type` and a `sequence_number` (0, 1, 2, ... per response, error
events included). One item is open at a time; output indices have no gaps; the terminal
event (`response.completed`, `.incomplete` or `.failed`) lists exactly the items
announced. Non-stream bodies are built by the same item builder.
"""
from __future__ import annotations

from typing import Iterator

from proxy import canonical as c
from proxy.dialects import common as d, freeform
from proxy.errors import ProxyError, openai_code

INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _seq(turn: d.Turn) -> int:
    n = turn.extra.get("seq", 0)
    turn.extra["seq"] = n + 1
    return n


def _event(turn: d.Turn, kind: str, **fields) -> tuple:
    return kind, {"type": kind, **fields, "sequence_number": _seq(turn)}


def usage_body(u: c.Usage) -> dict:
    return {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_input_tokens},
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens}}


def envelope(turn: d.Turn, status: str, output: list, usage: c.Usage | None,
             finish: str | None = None, error: dict | None = None) -> dict:
    echo = turn.extra.get("echo", {})
    text = "".join(p["text"] for item in output if item["type"] == "message"
                   for p in item["content"] if p.get("type") == "output_text")
    reason = INCOMPLETE.get(finish or "")
    return {"id": turn.id, "object": "response", "created_at": turn.created, "status": status,
            "model": turn.client_model, "output": output, "output_text": text,
            "usage": usage_body(usage) if usage is not None else None,
            "parallel_tool_calls": echo.get("parallel_tool_calls", True),
            "tool_choice": echo.get("tool_choice", "auto"), "tools": echo.get("tools", []),
            "instructions": echo.get("instructions"), "metadata": echo.get("metadata", {}),
            "previous_response_id": echo.get("previous_response_id"), "store": echo.get("store", True),
            "incomplete_details": {"reason": reason} if reason and status == "incomplete" else None,
            "error": error}


def final_status(finish: str) -> str:
    return "incomplete" if finish in INCOMPLETE else "completed"


def _item_id(turn: d.Turn, prefix: str, index: int) -> str:
    return f"{prefix}_{turn.id.removeprefix('resp_')}_{index}"


def reasoning_item(turn, index, text, sig, status, redacted=False) -> dict:
    summary = [] if redacted or not text else [{"type": "summary_text", "text": text}]
    return {"type": "reasoning", "id": _item_id(turn, "rs", index), "summary": summary,
            "encrypted_content": sig, "status": status}


def message_item(turn, index, text, status, logprobs=()) -> dict:
    content = [] if text is None else [_output_text(turn, text, logprobs)]
    return {"type": "message", "id": _item_id(turn, "msg", index), "role": "assistant",
            "status": status, "content": content}


def text_logprobs(entries, text: str) -> list:
    """The entries of the text's own tokens: the run whose bytes spell the text. A whole reply's
    logprobs also hold its reasoning's and its tool calls' tokens (a stream pairs each delta
    with its own). All of them when no run spells it."""
    target, spelled = text.encode(), [_spelled(e) for e in entries]
    starts, ends, offset = {}, {}, 0  # byte offset -> the first entry starting / ending there
    for i, piece in enumerate(spelled):
        starts.setdefault(offset, i)
        offset += len(piece)
        ends.setdefault(offset, i)
    joined = b"".join(spelled)
    at = joined.find(target)
    while at != -1:
        if at in starts and at + len(target) in ends:
            return list(entries[starts[at]:ends[at + len(target)] + 1])
        at = joined.find(target, at + 1)
    return list(entries)


def _spelled(entry) -> bytes:
    """A logprobs entry's bytes (its `token` when it has none)."""
    if not isinstance(entry, dict):
        return b""
    try:
        return bytes(entry["bytes"])
    except (KeyError, TypeError, ValueError):
        return str(entry.get("token", "")).encode("utf-8", "replace")


def _output_text(turn: d.Turn, text: str, logprobs) -> dict:
    """An output_text part; with its tokens' logprobs (Chat's entries) when the request asked."""
    part = {"type": "output_text", "text": text, "annotations": []}
    if turn.extra.get("logprobs"):
        part["logprobs"] = list(logprobs)
    return part


def call_item(turn, index, call_id, name, arguments, status) -> dict:
    spec = turn.extra.get("tools_by_name", {}).get(name)
    if spec is not None and spec.kind == "custom":
        return {"type": "custom_tool_call", "id": _item_id(turn, "ctc", index), "call_id": call_id,
                "name": name, "input": freeform.raw_input(arguments) if status == "completed" else "",
                "status": status}
    item = {"type": "function_call", "id": _item_id(turn, "fc", index), "call_id": call_id,
            "name": name, "arguments": arguments, "status": status}
    if spec is not None and spec.namespace:
        item["namespace"] = spec.namespace
    return item


def render_response(turn: d.Turn, req: c.Request, resp: c.Response, policy) -> dict:
    if turn.extra.get("compaction"):
        from proxy.dialects import responses_compact
        return responses_compact.render(turn, resp, envelope, usage_body)
    output = []
    if policy.reasoning == "responses_item":
        for r in resp.reasoning():
            if r.text or r.signature:
                output.append(reasoning_item(turn, len(output), r.text, r.signature, "completed", r.redacted))
    if resp.text():
        output.append(message_item(turn, len(output), resp.text(), "completed",
                                   text_logprobs(resp.logprobs or (), resp.text())))
    for t in resp.tool_calls():
        output.append(call_item(turn, len(output), t.id, t.name, t.arguments, "completed"))
    final = envelope(turn, final_status(resp.finish_reason), output, resp.usage, resp.finish_reason)
    turn.extra["final"] = final  # what responses_state.complete stores
    return final


class _Items:
    """The stream's item state: announced items and the one open item."""

    def __init__(self, turn: d.Turn):
        self.turn = turn
        self.done: list[dict] = []
        turn.extra["announced"] = self.done
        self.kind: str | None = None
        self.buf: list[str] = []
        self.logprobs: list = []  # the open message's, when the request asked
        self.call: tuple | None = None

    def open(self, kind: str, make_item, call: tuple | None = None) -> Iterator[tuple]:
        """make_item(output_index) builds the item once the previous one is closed."""
        yield from self.close()
        item = make_item(len(self.done))
        self.kind, self.buf, self.call, self.item, self.logprobs = kind, [], call, item, []
        yield _event(self.turn, "response.output_item.added", output_index=len(self.done), item=item)
        if kind == "message":
            yield self._part("response.content_part.added", "")
        elif kind == "reasoning":
            yield _event(self.turn, "response.reasoning_summary_part.added", item_id=item["id"],
                         output_index=len(self.done), summary_index=0,
                         part={"type": "summary_text", "text": ""})

    def _part(self, kind: str, text: str) -> tuple:
        return _event(self.turn, kind, item_id=self.item["id"], output_index=len(self.done),
                      content_index=0, part=_output_text(self.turn, text, self.logprobs))

    def delta(self, text: str, logprobs: tuple = ()) -> tuple:
        self.buf.append(text)
        if self.kind == "message" and self.turn.extra.get("logprobs"):
            self.logprobs.extend(logprobs)
            return _event(self.turn, "response.output_text.delta", item_id=self.item["id"],
                          output_index=len(self.done), content_index=0, delta=text,
                          logprobs=list(logprobs))
        kind = {"reasoning": "response.reasoning_summary_text.delta", "message": "response.output_text.delta",
                "call": "response.function_call_arguments.delta"}[self.kind]
        extra = {"summary_index": 0} if self.kind == "reasoning" else {} if self.kind == "call" else {"content_index": 0}
        if self.kind == "call" and self.item["type"] == "custom_tool_call":
            kind = "response.custom_tool_call_input.delta"
        return _event(self.turn, kind, item_id=self.item["id"], output_index=len(self.done), **extra, delta=text)

    def close(self, signature: str | None = None) -> Iterator[tuple]:
        if self.kind is None:
            return
        turn, index, text, item_id = self.turn, len(self.done), "".join(self.buf), self.item["id"]
        if self.kind == "reasoning":
            yield _event(turn, "response.reasoning_summary_text.done", item_id=item_id, output_index=index,
                         summary_index=0, text=text)
            yield _event(turn, "response.reasoning_summary_part.done", item_id=item_id, output_index=index,
                         summary_index=0, part={"type": "summary_text", "text": text})
            item = reasoning_item(turn, index, text, signature, "completed")
        elif self.kind == "message":
            logprobs = {"logprobs": self.logprobs} if turn.extra.get("logprobs") else {}
            yield _event(turn, "response.output_text.done", item_id=item_id, output_index=index,
                         content_index=0, text=text, **logprobs)
            yield self._part("response.content_part.done", text)
            item = message_item(turn, index, text, "completed", self.logprobs)
        else:
            call_id, name = self.call
            item = call_item(turn, index, call_id, name, text, "completed")
            if item["type"] == "custom_tool_call":
                yield _event(turn, "response.custom_tool_call_input.done", item_id=item_id,
                             output_index=index, input=item["input"])
            else:
                yield _event(turn, "response.function_call_arguments.done", item_id=item_id,
                             output_index=index, arguments=text)
        self.kind = None
        yield _event(turn, "response.output_item.done", output_index=index, item=item)
        self.done.append(item)


def stream(turn: d.Turn, req: c.Request, events, policy) -> Iterator:
    if turn.extra.get("compaction"):
        from proxy.dialects import responses_compact
        yield from responses_compact.stream(turn, events, _event, envelope)
        return
    skeleton = envelope(turn, "in_progress", [], None)
    yield _event(turn, "response.created", response=skeleton)
    yield _event(turn, "response.in_progress", response=skeleton)
    items, shows_reasoning = _Items(turn), policy.reasoning == "responses_item"
    # a text delta waits for its chunk's logprobs only when the request asked for them
    paired = _paired(events) if turn.extra.get("logprobs") else ((ev, ()) for ev in events)
    for ev, logprobs in paired:
        if ev is d.KEEPALIVE:
            yield d.KEEPALIVE
        elif isinstance(ev, c.ReasoningDelta) and shows_reasoning:
            if items.kind != "reasoning":
                yield from items.open("reasoning", lambda i: reasoning_item(turn, i, "", None, "in_progress"))
            yield items.delta(ev.text)
        elif isinstance(ev, c.ReasoningEnd) and items.kind == "reasoning":
            yield from items.close(ev.signature)
        elif isinstance(ev, c.TextDelta):
            if items.kind != "message":
                yield from items.open("message", lambda i: message_item(turn, i, None, "in_progress"))
            yield items.delta(ev.text, logprobs)
        elif isinstance(ev, c.LogprobsDelta) and items.kind == "message":
            items.logprobs.extend(ev.content)  # tokens whose text the parser holds back
        elif isinstance(ev, c.ToolCallStart):
            yield from items.open("call", lambda i, ev=ev: call_item(turn, i, ev.id, ev.name, "", "in_progress"),
                                  (ev.id, ev.name))
        elif isinstance(ev, c.ToolCallArgsDelta) and items.kind == "call":
            yield items.delta(ev.text)
        elif isinstance(ev, c.ToolCallEnd):
            yield from items.close()
        elif isinstance(ev, c.StreamEnd):
            yield from items.close()
            status = final_status(ev.finish_reason)
            final = envelope(turn, status, items.done, ev.usage, ev.finish_reason)
            turn.extra["final"] = final
            yield _event(turn, f"response.{status}", response=final)


def _paired(events) -> Iterator[tuple]:
    """(event, logprobs): a TextDelta with the LogprobsDelta that follows it (the same upstream
    chunk's tokens, pipeline.py), which is then no event of its own; the others with ()."""
    held = None
    try:
        for ev in events:
            if held is not None:
                is_pair = isinstance(ev, c.LogprobsDelta)
                yield held, ev.content if is_pair else ()
                held = None
                if is_pair:
                    continue
            if isinstance(ev, c.TextDelta):
                held = ev
            else:
                yield ev, ()
    except Exception:  # the upstream failed: the text it sent before still reaches the client
        if held is not None:
            yield held, ()
        raise
    if held is not None:
        yield held, ()


def failed_frames(turn: d.Turn, err: ProxyError) -> list:
    kind = openai_code(err)
    error = {"code": kind, "message": err.message}
    final = envelope(turn, "failed", list(turn.extra.get("announced", [])), None, error=error)
    return [_event(turn, "error", code=kind, message=err.message, param=err.param),
            _event(turn, "response.failed", response=final)]
