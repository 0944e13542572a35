"""Anthropic Messages <-> canonical.

Ingress: `system` blocks (less Claude Code's billing block), `role:"system"` messages kept
in place, thinking blocks with their signatures, tool_result blocks (with `is_error` and images) hoisted into a tool
message before the rest of the user turn, images, text documents, tool_choice,
`stop_sequences`, `thinking` (with `display: "omitted"`) and `output_config.effort`; a
final assistant turn with text (prefill) is continued, not answered anew; a missing
`max_tokens` is a 400, as the API documents. Server tools (typed tools such
as `web_search_20250305`) are not sent to the engine.
Egress lives in anthropic_out.py.
"""
from __future__ import annotations

import json
from proxy import canonical as c
from proxy.dialects import common as d
from proxy.dialects.anthropic_out import ID_PREFIX, render_response, stream, to_client_id  # noqa: F401 - API
from proxy.dialects.common import nothing_to_keep as complete, request_as_parsed as prepare  # noqa: F401 - API
from proxy.errors import InvalidRequest, ProxyError, anthropic_body

NAME = "anthropic"
TURN_ID_PREFIX = "msg_"
INPUT_FIELD = "messages"
INTERLEAVED_CALLS = False  # one tool_use block open at a time
EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
# Claude Code's first system block; a per-request `cch=` in it would defeat prefix reuse from
# token 0. It means nothing to the model, so it never goes upstream (detection reads the body).
BILLING_PREFIX = "x-anthropic-billing-header:"


def to_engine_id(client_id: str) -> str:
    return client_id[len(ID_PREFIX):] if client_id.startswith(ID_PREFIX) else client_id


# ---- ingress ---------------------------------------------------------------------------
def parse_request(body, policy) -> c.Request:
    body = d.require_object(body)
    messages = [*_system(body.get("system"))]
    for i, m in enumerate(d.list_of_objects(body, "messages", True)):
        messages.extend(_message(m, i))
    thinking = body.get("thinking") if isinstance(body.get("thinking"), dict) else None
    enabled = None if thinking is None else thinking.get("type") != "disabled"
    tools = [(t, _tool(t, i)) for i, t in enumerate(d.list_of_objects(body, "tools"))]
    output_format, output_source = _output_format(body)
    server = [t for t, spec in tools if spec is None]
    usable, tool_choice = d.fit_tool_choice(
        tuple(spec for _t, spec in tools if spec), _tool_choice(body.get("tool_choice")),
        tuple(str(t.get(key)) for t in server for key in ("type", "name")))
    return c.Request(
        model=d.opt_str(body, "model") or "", messages=tuple(messages),
        tools=usable, dropped_tools=tuple(str(t.get("type")) for t in server), tool_choice=tool_choice,
        max_tokens=_max_tokens(body),
        temperature=d.or_default(d.opt_float(body, "temperature"), policy.temperature),
        top_p=d.opt_float(body, "top_p"), top_k=d.opt_int(body, "top_k"),
        stop=d.stop_list(body.get("stop_sequences"), "stop_sequences"),
        stream=bool(d.opt_bool(body, "stream")),
        reasoning_effort=_effort(body, thinking) or policy.effort, thinking_enabled=enabled,
        is_reasoning_withheld=bool(thinking) and thinking.get("display") == "omitted",
        parallel_tool_calls=_parallel(body.get("tool_choice")),
        metadata=body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        passthrough={**output_format, **_prefill(messages)}, client_fields=output_source)


def _prefill(messages: list[c.Message]) -> dict:
    """A final assistant turn with text and no tool call is the Messages API's prefill: the
    reply continues that text. Upstream that is vLLM's continue_final_message, which the
    engine, vLLM and SGLang honour; without it the model would start a new reply."""
    last = messages[-1] if messages else None
    if last is None or last.role != "assistant" or not last.text() or last.of(c.ToolCall):
        return {}
    return {"continue_final_message": True, "add_generation_prompt": False}


def _max_tokens(body: dict) -> int:
    """Required by the Messages API: the official SDKs and every captured client send it."""
    if body.get("max_tokens") is None:
        raise InvalidRequest("`max_tokens` is required", param="max_tokens")
    return d.opt_int(body, "max_tokens")


def _output_format(body: dict) -> tuple[dict, tuple]:
    """Structured outputs (`output_format` or `output_config.format`) -> Chat `response_format`,
    and the field the client sent it in (an upstream error about the schema names that one)."""
    config = body.get("output_config") if isinstance(body.get("output_config"), dict) else {}
    fmt = body.get("output_format") or config.get("format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        return {}, ()
    sent = "output_format" if body.get("output_format") else "output_config.format"
    return ({"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}},
            (("response_format.json_schema.schema", f"{sent}.schema"), ("response_format", sent)))


def _effort(body: dict, thinking: dict | None) -> str | None:
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("effort") in EFFORT:
        return EFFORT[config["effort"]]
    budget = thinking.get("budget_tokens") if thinking else None
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        return "low" if budget <= 4096 else "medium" if budget <= 16384 else "high"
    return None


def _system(system) -> list[c.Message]:
    if system is None:
        return []
    if isinstance(system, str):
        return [c.Message("system", (c.Text(system),))] if system else []
    if not isinstance(system, list):
        raise InvalidRequest("`system` must be a string or a list of text blocks", param="system")
    return [c.Message("system", (c.Text(b["text"]),)) for b in system
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) and b["text"]
            and not b["text"].startswith(BILLING_PREFIX)]


def _message(m: dict, i: int) -> list[c.Message]:
    role, content = m.get("role"), m.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(blocks, list):
        raise InvalidRequest(f"`messages[{i}].content` must be a string or a list of blocks",
                             param=f"messages[{i}].content")
    blocks = [b for b in blocks if isinstance(b, dict)]
    if role == "assistant":
        parts = tuple(p for p in (_assistant_block(b) for b in blocks) if p is not None)
        return [c.Message("assistant", parts)] if parts else []
    if role == "system":
        return [c.Message("system", tuple(c.Text(b["text"]) for b in blocks if _is_text(b)))]
    if role != "user":
        raise InvalidRequest(f"`messages[{i}].role` must be user, assistant or system",
                             param=f"messages[{i}].role")
    results = [_tool_result(b) for b in blocks if b.get("type") == "tool_result"]
    rest = tuple(p for p in (_user_block(b) for b in blocks if b.get("type") != "tool_result") if p)
    out = [c.Message("tool", tuple(results))] if results else []
    return out + ([c.Message("user", rest)] if rest or not results else [])


def _is_text(b: dict) -> bool:
    return b.get("type") == "text" and isinstance(b.get("text"), str)


def _assistant_block(b: dict):
    kind = b.get("type")
    if _is_text(b):
        return c.Text(b["text"]) if b["text"] else None
    if kind == "thinking":
        return c.Reasoning(str(b.get("thinking") or ""), b.get("signature") or None)
    if kind == "redacted_thinking":
        return c.Reasoning("", b.get("data") or None, redacted=True)
    if kind == "tool_use":
        args = b.get("input")
        raw = args if isinstance(args, str) else json.dumps(args if args is not None else {}, ensure_ascii=False)
        return c.ToolCall(to_engine_id(str(b.get("id") or "")), str(b.get("name") or ""), raw)
    return None


def _user_block(b: dict):
    if _is_text(b):
        return c.Text(b["text"]) if b["text"] else None
    if b.get("type") == "image":
        return _image(b.get("source")) or c.Text(c.left_out("image", _source_kind(b)))
    text = _readable(b)
    return c.Text(text) if text else None


def _readable(b: dict) -> str | None:
    """A block other than text or image as the text the model reads: a search result's title,
    source and text, a document's text (a plain-text or content source), or what stands for
    content it cannot read; None for an empty block."""
    kind, title = b.get("type"), b.get("title") if isinstance(b.get("title"), str) else ""
    if kind == "search_result":
        source = b.get("source") if isinstance(b.get("source"), str) else ""
        return "\n".join(t for t in (title, source, _block_texts(b.get("content"))) if t) or None
    if kind == "document":
        src = b.get("source") if isinstance(b.get("source"), dict) else {}
        if src.get("type") == "text" and isinstance(src.get("data"), str):
            text = src["data"]
        elif src.get("type") == "content":
            text = _block_texts(src.get("content"))
        else:
            return c.left_out("document", _source_kind(b), title)
        return "\n".join(t for t in (title, text) if t) or None
    return c.left_out(f"{kind!r} block" if isinstance(kind, str) else "block")


def _block_texts(content) -> str:
    """A string, or a list of text blocks (and strings), as lines; other blocks as _readable
    reads them (an image among them: the line that stands for it)."""
    if isinstance(content, str):
        return content
    lines = []
    for p in content if isinstance(content, list) else ():
        if isinstance(p, str) or isinstance(p, dict) and _is_text(p):
            lines.append(p if isinstance(p, str) else p["text"])
        elif isinstance(p, dict):
            lines.append(c.left_out("image", _source_kind(p)) if p.get("type") == "image" else _readable(p) or "")
    return "\n".join(line for line in lines if line)


def _source_kind(b: dict) -> str:
    src = b.get("source") if isinstance(b.get("source"), dict) else {}
    media = src.get("media_type") if isinstance(src.get("media_type"), str) else ""
    kind = src.get("type") if isinstance(src.get("type"), str) else ""
    return f"({', '.join(x for x in (media, kind and 'source ' + kind) if x)})" if media or kind else ""


def _image(src) -> c.Image | None:
    if not isinstance(src, dict):
        return None
    if src.get("type") == "base64" and isinstance(src.get("data"), str):
        return c.Image(str(src.get("media_type") or "image/png"), src["data"])
    if src.get("type") == "url" and isinstance(src.get("url"), str):
        return c.Image("image/jpeg", url=src["url"])
    return None


def _tool_result(b: dict) -> c.ToolResult:
    content, texts, images = b.get("content"), [], []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and _is_text(part):
                texts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "image":
                img = _image(part.get("source"))
                images.extend([img] if img else [])
                texts.extend([] if img else [c.left_out("image", _source_kind(part))])
            elif isinstance(part, dict):
                texts.extend([text] if (text := _readable(part)) else [])
    elif content is not None:
        texts.append(json.dumps(content))
    return c.ToolResult(to_engine_id(str(b.get("tool_use_id") or "")), "\n".join(texts),
                        is_error=b.get("is_error") is True, images=tuple(images))


def _tool(t: dict, i: int) -> c.ToolSpec | None:
    if t.get("type") not in (None, "custom") or not isinstance(t.get("name"), str):
        return None  # Anthropic server tools run on Anthropic's side; the engine cannot
    schema = t.get("input_schema") if isinstance(t.get("input_schema"), dict) else None
    return c.ToolSpec(t["name"], t.get("description") or "", schema or {"type": "object", "properties": {}},
                      source=f"tools[{i}].input_schema")


def _tool_choice(choice):
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind)


def _parallel(choice) -> bool | None:
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
        return False
    return None


def render_error(err: ProxyError) -> dict:
    return anthropic_body(err)


def stream_error(turn: d.Turn, err: ProxyError) -> list:
    return [("error", anthropic_body(err))]
