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
`encrypted_content` is `kcmp1.` + urlsafe base64 of {"summary": text}; one we cannot read
(OpenAI's own ciphertext) is left out of the prompt rather than refused.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Iterator

from proxy import canonical as c
from proxy.dialects import common as d

log = logging.getLogger("kimi.proxy")
ROUTE = "responses_compact"
PREFIX = "kcmp1."
ITEM_TYPES = ("compaction", "compaction_summary")
INSTRUCTION = (
    "Your context window is nearly full. Write a summary of the conversation so far that lets "
    "you continue the task without it: the user's goal and requests, decisions made, files and "
    "commands touched with their results, what is done and what is left. Reply with the "
    "summary only.")
SUMMARY_HEADER = "Summary of the earlier conversation (compacted):\n\n"


def encode(summary: str) -> str:
    raw = json.dumps({"summary": summary}, ensure_ascii=False).encode()
    return PREFIX + base64.urlsafe_b64encode(raw).decode()


def decode(encrypted: object) -> str | None:
    if not isinstance(encrypted, str) or not encrypted.startswith(PREFIX):
        return None
    try:
        body = json.loads(base64.urlsafe_b64decode(encrypted[len(PREFIX):].encode()))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    summary = body.get("summary") if isinstance(body, dict) else None
    return summary if isinstance(summary, str) else None


def message_of(item: dict) -> c.Message | None:
    """A compaction item from `input` -> the summary as a user message (None: nothing to use)."""
    summary = decode(item.get("encrypted_content"))
    if summary is None and isinstance(item.get("summary"), str):
        summary = item["summary"]
    if summary is None:
        log.info("a compaction item we cannot read (not ours) was left out of the prompt")
        return None
    return c.Message("user", (c.Text(SUMMARY_HEADER + summary),))


def kind_of(route: str, body: dict) -> str | None:
    """"route" (/v1/responses/compact), "trigger" (input ends in compaction_trigger) or None."""
    if route == ROUTE:
        return "route"
    items = body.get("input")
    last = items[-1] if isinstance(items, list) and items else None
    return "trigger" if isinstance(last, dict) and last.get("type") == "compaction_trigger" else None


def summary_request(req: c.Request, kind: str) -> c.Request:
    """The conversation plus the instruction; no tools, nothing stored."""
    ask = c.Message("user", (c.Text(INSTRUCTION),))
    return req.replace(messages=(*req.messages, ask), tools=(), tool_choice=None, parallel_tool_calls=None,
                       stream=req.stream and kind == "trigger", store=False, dropped_tools=())


def item(turn: d.Turn, summary: str) -> dict:
    return {"type": "compaction", "id": f"cmp_{turn.id.removeprefix('resp_')}",
            "encrypted_content": encode(summary)}


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
