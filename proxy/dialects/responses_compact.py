"""OpenAI Responses compaction: `POST /v1/responses/compact`, the `compaction_trigger` input
item, and the `compaction` items that come back in later `input`.

    /v1/responses/compact      -> {"object": "response.compaction", "output": [the input's
                                  user messages..., compaction item], "usage"} (Codex's
                                  remote compaction replaces its history with `output`)
    input ending in {"type": "compaction_trigger"} on /v1/responses (Codex's
                                  remote_compaction_v2) -> a response whose one output item
                                  is the compaction item, streamed or not
    {"type": "compaction" | "compaction_summary", "encrypted_content"} in later input
                               -> a user message carrying the summary

Codex 0.171 (tests/fixtures/live-clients/codex-compact*.jsonl.gz) sends the trigger when its
provider is named "OpenAI" and needs exactly one compaction item back; for any other provider
it summarises with an ordinary turn. Some users report builds that call the compact route.
Either way the model is asked once, without tools, to summarise the conversation. Our
`encrypted_content` is `kcmp2.` + zlib JSON {"summary": text} sealed as reasoning signatures
are (proxy.state.signatures: AES-GCM under the ledger's secret, bound to the prefix and the
request's owner), so the summary is not readable from it and another API key's item does not
open. One we cannot open (OpenAI's own ciphertext, another key's, a forged one, or an older
readable `kcmp1.`) is left out of the prompt rather than refused.
"""
from __future__ import annotations

import json
import logging
import zlib
from typing import Callable, Iterator

from proxy import canonical as c
from proxy.dialects import common as d
from proxy.state.signatures import MAX_BLOB, MAX_INFLATED, Sealer, bounded_inflate

log = logging.getLogger("kimi.proxy")
ROUTE = "responses_compact"
PREFIX = "kcmp2."
ITEM_TYPES = ("compaction", "compaction_summary")
INSTRUCTION = (
    "Your context window is nearly full. Write a summary of the conversation so far that lets "
    "you continue the task without it: the user's goal and requests, decisions made, files and "
    "commands touched with their results, what is done and what is left. Reply with the "
    "summary only.")
SUMMARY_HEADER = "Summary of the earlier conversation (compacted):\n\n"


def encode(summary: str, sealer: Sealer, owner: str = "") -> str:
    """The summary sealed for owner; one too long for a token loses its tail."""
    while True:
        raw = json.dumps({"summary": summary}, ensure_ascii=False).encode()
        blob = zlib.compress(raw, 6)
        if len(blob) <= MAX_BLOB and len(raw) <= MAX_INFLATED:
            return sealer.seal(blob, owner, PREFIX)
        summary = summary[:len(summary) * 3 // 4]


def decode(encrypted: object, sealer: Sealer, owner: str = "") -> str | None:
    """The summary encode() sealed for owner, or None; never raises."""
    blob = sealer.unseal(encrypted, owner, PREFIX)
    raw = bounded_inflate(blob) if blob is not None else None
    try:
        body = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    summary = body.get("summary") if isinstance(body, dict) else None
    return summary if isinstance(summary, str) else None


def opener(ctx) -> Callable[[object], str | None]:
    """decode() for this request: the ledger's sealer and the request's owner."""
    sealer, owner = ctx.services.reasoning.sealer, ctx.owner
    return lambda encrypted: decode(encrypted, sealer, owner)


def in_input(items: list) -> bool:
    return any(isinstance(i, dict) and i.get("type") in ITEM_TYPES for i in items)


def message_of(item: dict, open_summary: Callable[[object], str | None] | None) -> c.Message | None:
    """A compaction item from `input` -> the summary as a user message (None: nothing to use).
    Without open_summary (parsing before the request's owner is known) sealed items wait."""
    summary = open_summary(item.get("encrypted_content")) if open_summary else None
    if summary is None and isinstance(item.get("summary"), str):
        summary = item["summary"]
    if summary is None:
        if open_summary:
            log.info("a compaction item we cannot open (not sealed for this key) was left out of the prompt")
        return None
    return c.Message("user", (c.Text(SUMMARY_HEADER + summary),))


def kind_of(route: str, body: dict) -> str | None:
    """"route" (/v1/responses/compact), "trigger" (input ends in compaction_trigger) or None."""
    if route == ROUTE:
        return "route"
    items = body.get("input")
    last = items[-1] if isinstance(items, list) and items else None
    return "trigger" if isinstance(last, dict) and last.get("type") == "compaction_trigger" else None


def prepare(ctx, req: c.Request, body: dict) -> c.Request:
    """A compaction request (the route or a trigger) becomes the summary request, and its turn
    learns how to seal the summary for this request's owner."""
    kind = kind_of(ctx.route, body)
    if not kind:
        return req
    sealer, owner = ctx.services.reasoning.sealer, ctx.owner
    ctx.turn.extra["compaction"] = kind
    ctx.turn.extra["seal_summary"] = lambda summary: encode(summary, sealer, owner)
    return summary_request(req, kind)


def summary_request(req: c.Request, kind: str) -> c.Request:
    """The conversation plus the instruction; no tools, nothing stored."""
    ask = c.Message("user", (c.Text(INSTRUCTION),))
    return req.replace(messages=(*req.messages, ask), tools=(), tool_choice=None, parallel_tool_calls=None,
                       stream=req.stream and kind == "trigger", store=False, dropped_tools=())


def item(turn: d.Turn, summary: str) -> dict:
    return {"type": "compaction", "id": f"cmp_{turn.id.removeprefix('resp_')}",
            "encrypted_content": turn.extra["seal_summary"](summary)}


def render(turn: d.Turn, resp: c.Response, envelope, usage_body) -> dict:
    """The non-stream body: the compact route's object, or a Responses envelope."""
    compacted = item(turn, _summary(resp))
    if turn.extra["compaction"] == "trigger":
        return envelope(turn, "completed", [compacted], resp.usage)
    kept = [i for i in turn.extra.get("input_items", [])
            if isinstance(i, dict) and i.get("type", "message") == "message" and i.get("role") == "user"]
    return {"id": turn.id, "object": "response.compaction", "created_at": turn.created,
            "output": [*kept, compacted], "usage": usage_body(resp.usage)}


def stream(turn: d.Turn, events, event, envelope) -> Iterator:
    """created, in_progress, then at the end the one compaction item and response.completed."""
    skeleton = envelope(turn, "in_progress", [], None)
    yield event(turn, "response.created", response=skeleton)
    yield event(turn, "response.in_progress", response=skeleton)
    for ev in events:
        if ev is d.KEEPALIVE:
            yield d.KEEPALIVE
        elif isinstance(ev, c.StreamEnd):
            compacted = item(turn, _summary(ev.response))
            turn.extra["announced"] = [compacted]
            yield event(turn, "response.output_item.added", output_index=0, item=compacted)
            yield event(turn, "response.output_item.done", output_index=0, item=compacted)
            final = envelope(turn, "completed", [compacted], ev.usage)
            turn.extra["final"] = final
            yield event(turn, "response.completed", response=final)


def _summary(resp: c.Response) -> str:
    return resp.text().strip() or "".join(r.text for r in resp.reasoning()).strip()
