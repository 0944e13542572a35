"""Side requests: an agent's short tool-less calls beside its turn, such as a thread title.

opencode asks for a title with the agent's full ``max_tokens`` (32000) although the answer is a
line. A small local model can ramble on until its context is full, holding the engine's cache
while the agent turn that follows waits in the queue: on the default model opencode's title
request generated 5,566 tokens and its 7.7k-token agent turn timed out. The proxy caps such a
request at ``side-max-tokens`` (kimi-local.conf(5)).

A side request has no tools and its first system text matches a row of ``SIDE_TASKS``. Each
row comes from a live capture (../shared/fixtures/live-clients/).
"""
from __future__ import annotations

import logging
import re

from proxy import canonical as c

log = logging.getLogger("kimi.proxy")

SIDE_TASKS: tuple[tuple[str, re.Pattern], ...] = (
    # opencode 1.18, every dialect: opencode-{chat,responses,anthropic}-text.jsonl.gz
    ("title", re.compile(r"^\s*You are a title generator\b")),
)


def side_task(req: c.Request) -> str | None:
    """The side task's name ("title"), or None for anything else (any request with tools)."""
    if req.tools:
        return None
    system = next((m.text() for m in req.messages if m.role == "system"), "")
    return next((name for name, pattern in SIDE_TASKS if pattern.search(system)), None)


def cap_side_request(payload: dict, req: c.Request, limit: int) -> dict:
    """The upstream payload with max_tokens at most ``limit`` for a side request (0: no cap)."""
    task = side_task(req) if limit else None
    if task is None:
        return payload
    key = next((k for k in ("max_tokens", "max_completion_tokens") if payload.get(k)), "max_tokens")
    if payload.get(key) and payload[key] <= limit:
        return payload
    log.info("%s request: max_tokens %s capped at %d (side-max-tokens)", task, payload.get(key), limit)
    return {**payload, key: limit}
