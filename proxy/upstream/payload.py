"""Canonical request -> the OpenAI Chat Completions payload sent upstream.

Leading system messages (Anthropic `system`, Responses `instructions` and leading
developer items) merge into one system message joined by a blank line, bytes kept;
later system messages stay in place. Assistant turns go through `restore` (the
reasoning ledger) so the engine sees its own reasoning and raw argument bytes again.
"""
from __future__ import annotations

from typing import Callable

from proxy import canonical as c

Restore = Callable[[c.Message, int], "dict | None"]  # (assistant message, its index in the request)


def build_payload(req: c.Request, *, model: str, reasoning_field: str,
                  restore: Restore | None = None, effort: str | None = None) -> dict:
    is_continued = req.passthrough.get("continue_final_message") is True
    payload: dict = {"model": model,
                     "messages": _messages(req.messages, reasoning_field, restore, is_continued),
                     "stream": req.stream}
    if req.tools:
        payload["tools"] = [tool_to_openai(t) for t in req.tools]
        if req.tool_choice is not None:
            payload["tool_choice"] = req.tool_choice
        if req.parallel_tool_calls is not None:
            payload["parallel_tool_calls"] = req.parallel_tool_calls
    for key, value in (("max_tokens", req.max_tokens), ("temperature", req.temperature),
                       ("top_p", req.top_p), ("top_k", req.top_k)):
        if value is not None:
            payload[key] = value
    if req.stop:
        payload["stop"] = list(req.stop)
    effort = req.reasoning_effort or effort
    if effort and req.thinking_enabled is not False:
        payload["reasoning_effort"] = effort
    if req.stream:
        payload["stream_options"] = {"include_usage": True, **(
            {"continuous_usage_stats": True} if req.continuous_usage else {})}
    for key, value in req.passthrough.items():
        payload.setdefault(key, value)
    return payload


def tool_to_openai(tool: c.ToolSpec) -> dict:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}


def _messages(messages, reasoning_field: str, restore: Restore | None,
              is_continued: bool = False) -> list[dict]:
    """is_continued: the reply continues the final message (an Anthropic prefill), so that
    message is the client's own text, never a ledger row's (which may hold the turn the
    client cut short and edited)."""
    out: list[dict] = []
    leading = []
    i = 0
    while i < len(messages) and messages[i].role == "system":
        leading.append(messages[i].text())
        i += 1
    if any(leading):
        out.append({"role": "system", "content": "\n\n".join(t for t in leading if t)})
    for index in range(i, len(messages)):
        msg = messages[index]
        if msg.role == "system":
            out.append({"role": "system", "content": msg.text()})
        elif msg.role == "user":
            out.append(_user(msg))
        elif msg.role == "tool":
            out.extend(_tool_results(msg))
        else:
            is_own = is_continued and index == len(messages) - 1
            restored = restore(msg, index) if restore and not is_own else None
            built = restored if restored is not None else assistant_from_echo(msg, reasoning_field)
            if built is not None:
                out.append(built)
    return out


def _user(msg: c.Message) -> dict:
    parts = [p for p in msg.parts if isinstance(p, (c.Text, c.Image))]
    entry: dict = {"role": "user"}
    if msg.name:
        entry["name"] = msg.name
    if all(isinstance(p, c.Text) for p in parts) and len(parts) <= 1:
        entry["content"] = parts[0].text if parts else ""
    else:
        entry["content"] = [{"type": "text", "text": p.text} if isinstance(p, c.Text)
                            else {"type": "image_url", "image_url": {"url": p.as_url()}}
                            for p in parts]
    return entry


def _tool_results(msg: c.Message) -> list[dict]:
    out, images = [], []
    for res in msg.of(c.ToolResult):
        content = f"[tool error] {res.content}" if res.is_error else res.content
        entry = {"role": "tool", "tool_call_id": res.tool_call_id, "content": content}
        if res.name:
            entry["name"] = res.name
        out.append(entry)
        images.extend(res.images)
    if images:  # Chat tool messages cannot carry images: show them in a user turn
        out.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": img.as_url()}} for img in images]})
    return out


def assistant_from_echo(msg: c.Message, reasoning_field: str) -> dict | None:
    """Rebuild an assistant turn from what the client echoed (no ledger hit)."""
    text = msg.text()
    reasoning = "".join(p.text for p in msg.of(c.Reasoning) if not p.redacted)
    calls = msg.of(c.ToolCall)
    if not text and not calls and not reasoning:
        return None
    entry: dict = {"role": "assistant", "content": text}
    if reasoning:
        if reasoning_field == "inline":
            entry["content"] = f"<think>{reasoning}</think>{text}"
        elif reasoning_field not in ("none", "auto"):
            entry[reasoning_field] = reasoning
        elif reasoning_field == "auto":
            entry["reasoning_content"] = reasoning
    if calls:
        entry["tool_calls"] = [{"id": t.id, "type": "function",
                                "function": {"name": t.name, "arguments": t.arguments}} for t in calls]
    return entry
