"""OpenAI Responses <-> canonical (ingress, errors; egress lives in responses_out.py).

Ingress: `instructions`, string or item-list `input`, developer/system items kept in
place, reasoning items (`encrypted_content` is the signature), function_call and
function_call_output, custom (freeform) tools and their calls, `namespace` tools
flattened into their functions, client-executed `tool_search` as a function, the named
`tool_choice` form translated, and `previous_response_id` resolved (`prepare`, with
the store in responses_state.py). Compaction (`/v1/responses/compact`, the
`compaction_trigger` item, compaction items in `input`) lives in responses_compact.py.
Hosted tools (web_search, image_generation, file_search, ...) run at OpenAI, so they are
not offered to the engine. Client-only keys are not forwarded upstream.
"""
from __future__ import annotations

import json

from proxy import canonical as c
from proxy.dialects import common as d, freeform, responses_compact, responses_state
from proxy.dialects.responses_out import render_response, stream  # noqa: F401 - dialect API
from proxy.dialects.responses_state import complete  # noqa: F401 - dialect API
from proxy.errors import InvalidRequest, ProxyError, openai_body

NAME = "openai_responses"
TURN_ID_PREFIX = "resp_"
INPUT_FIELD = "input"
INTERLEAVED_CALLS = False  # one output item open at a time
CONSUMED = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
            "max_output_tokens", "temperature", "top_p", "top_k", "reasoning", "store", "stream",
            "previous_response_id", "metadata", "include", "text", "prompt_cache_key",
            "client_metadata", "truncation", "user", "service_tier", "background", "safety_identifier",
            "stream_options", "prompt", "max_tool_calls", "conversation", "top_logprobs"}
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")
ECHOED = ("tools", "tool_choice", "parallel_tool_calls", "instructions", "metadata", "previous_response_id", "store")
# the Chat field -> the Responses one it came from, to name it in an upstream error
FORMAT_FIELDS = (("response_format.json_schema.schema", "text.format.schema"), ("response_format", "text.format"))


# Objects that live at OpenAI, named by id: this server has none, and answering without them
# (the conversation's history, the stored prompt's instructions) would answer another request
KEPT_AT_OPENAI = (("conversation", "this server keeps no conversations: send the history in "
                   "`input`, or chain responses with `previous_response_id`"),
                  ("prompt", "this server keeps no stored prompt templates: send the instructions "
                   "and input themselves"))


def parse_request(body, policy) -> c.Request:
    body = d.require_object(body)
    for key, instead in KEPT_AT_OPENAI:
        if body.get(key) is not None:
            raise InvalidRequest(f"`{key}` names an object kept at OpenAI; {instead}", param=key)
    messages: list[c.Message] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions.strip():
        messages.append(c.Message("system", (c.Text(instructions),)))
    messages.extend(parse_input(body.get("input")))
    reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
    effort = reasoning.get("effort") if isinstance(reasoning.get("effort"), str) else None
    response_format = _response_format(body.get("text"))
    dropped = tuple(str(t.get("type")) for t in d.list_of_objects(body, "tools")
                    if t.get("type") not in USABLE_TOOL_TYPES)
    tools, tool_choice = d.fit_tool_choice(tuple(_tools(d.list_of_objects(body, "tools"))),
                                           _tool_choice(body.get("tool_choice")), dropped)
    return c.Request(
        model=d.opt_str(body, "model") or "", messages=tuple(messages),
        tools=tools, dropped_tools=dropped, tool_choice=tool_choice,
        max_tokens=d.opt_int(body, "max_output_tokens") or policy.max_tokens,
        temperature=d.or_default(d.opt_float(body, "temperature"), policy.temperature),
        top_p=d.opt_float(body, "top_p"), top_k=d.opt_int(body, "top_k"),
        stream=bool(d.opt_bool(body, "stream")),
        reasoning_effort=(None if effort == "none" else effort) or policy.effort,
        thinking_enabled=False if effort == "none" else None,
        parallel_tool_calls=d.opt_bool(body, "parallel_tool_calls"),
        metadata=body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        passthrough={**{k: v for k, v in body.items() if k not in CONSUMED}, **response_format,
                     **_logprobs(body)},
        client_fields=FORMAT_FIELDS if response_format else (),
        previous_response_id=d.opt_str(body, "previous_response_id"),
        store=d.opt_bool(body, "store"), truncation=_truncation(body))


def prepare(ctx, body: dict) -> c.Request:
    """The keys the envelope echoes, the tools by name, this turn's input items (stored with
    the response), and the stored history of `previous_response_id` before the new input."""
    req, turn = ctx.req, ctx.turn
    turn.extra["echo"] = {k: body[k] for k in ECHOED if k in body}
    turn.extra["logprobs"] = req.passthrough.get("logprobs") is True
    turn.extra["tools_by_name"] = {t.name: t for t in req.tools}
    items = body.get("input")
    items = [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else list(items or [])
    turn.extra["input_items"] = items
    summaries = responses_compact.opener(ctx)  # compaction items open for this request's owner
    lead = [m for m in req.messages[:1] if m.role == "system" and body.get("instructions")]
    new = req.messages[len(lead):]
    if responses_compact.in_input(items):
        new = tuple(parse_input(body.get("input"), summaries))
    if req.previous_response_id:
        history = responses_state.history(ctx.services, req.previous_response_id, ctx.owner)
        new = (*parse_input(history, summaries), *new)
    req = req.replace(messages=(*lead, *new))
    # /v1/responses/compact, or Codex's compaction_trigger item: summarise instead
    return responses_compact.prepare(ctx, req, body)


def _truncation(body: dict) -> str | None:
    value = d.opt_str(body, "truncation")
    if value not in (None, "auto", "disabled"):
        raise InvalidRequest("`truncation` must be 'auto' or 'disabled'", param="truncation")
    return value


def _logprobs(body: dict) -> dict:
    """`include: ["message.output_text.logprobs"]` or `top_logprobs` (0-20) -> Chat's logprobs
    fields: the output_text parts then carry their tokens' logprobs."""
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise InvalidRequest("`top_logprobs` must be an integer from 0 to 20", param="top_logprobs")
    include = body.get("include")
    if top is None and not (isinstance(include, list) and "message.output_text.logprobs" in include):
        return {}
    return {"logprobs": True, "top_logprobs": top or 0}


def _response_format(text) -> dict:
    """Responses `text.format` -> Chat `response_format` (structured output)."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_schema", "json_object"):
        return {}
    if fmt["type"] == "json_object":
        return {"response_format": {"type": "json_object"}}
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", **spec}}}


def parse_input(value, summaries=None) -> list[c.Message]:
    """`input` -> messages; summaries opens compaction items (responses_compact.opener)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [c.Message("user", (c.Text(value),))]
    if not isinstance(value, list):
        raise InvalidRequest("`input` must be a string or a list of items", param="input")
    out: list[c.Message] = []
    assistant: list = []  # consecutive reasoning/message/call items form one assistant turn
    for i, item in enumerate(value):
        if isinstance(item, str):
            item = {"type": "message", "role": "user", "content": item}
        if not isinstance(item, dict):
            raise InvalidRequest(f"`input[{i}]` must be an object", param=f"input[{i}]")
        part = _assistant_part(item)
        if part is not None:
            assistant.extend(part)
            continue
        msg = _other_item(item, summaries)
        if msg is None:
            continue
        if assistant:
            out.append(c.Message("assistant", tuple(assistant)))
            assistant = []
        out.append(msg)
    if assistant:
        out.append(c.Message("assistant", tuple(assistant)))
    return out


def _assistant_part(item: dict) -> list | None:
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message" and item.get("role") == "assistant":
        return _parts(item.get("content"))
    if kind == "reasoning":
        summary = item.get("summary") if isinstance(item.get("summary"), list) else []
        texts = [s.get("text", "") for s in summary if isinstance(s, dict) and isinstance(s.get("text"), str)]
        if not texts and isinstance(item.get("content"), list):
            texts = [s.get("text", "") for s in item["content"] if isinstance(s, dict) and isinstance(s.get("text"), str)]
        sig = item.get("encrypted_content") if isinstance(item.get("encrypted_content"), str) else None
        return [c.Reasoning("\n".join(texts), sig)] if texts or sig else []
    if kind == "function_call":
        args = item.get("arguments")
        args = args if isinstance(args, str) else json.dumps(args if args is not None else {})
        return [c.ToolCall(str(item.get("call_id") or item.get("id") or ""), str(item.get("name") or ""), args)]
    if kind == "custom_tool_call":
        raw = json.dumps({"input": str(item.get("input") or "")}, ensure_ascii=False)
        return [c.ToolCall(str(item.get("call_id") or item.get("id") or ""), str(item.get("name") or ""), raw)]
    return None


def _other_item(item: dict, summaries) -> c.Message | None:
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        parts = tuple(_parts(item.get("content")))
        return c.Message("system" if role in ("system", "developer") else "user", parts)
    if kind in ("function_call_output", "custom_tool_call_output"):
        text, images = _tool_output(item.get("output"))
        return c.Message("tool", (c.ToolResult(str(item.get("call_id") or ""), text, images=images),))
    if kind in responses_compact.ITEM_TYPES:
        return responses_compact.message_of(item, summaries)
    return None  # hosted-tool items and item_reference carry nothing the engine can use


def _parts(content) -> list:
    if isinstance(content, str):
        return [c.Text(content)] if content else []
    parts = []
    for p in content if isinstance(content, list) else ():
        if not isinstance(p, dict):
            continue
        if p.get("type") in TEXT_PARTS and isinstance(p.get("text"), str):
            parts.append(c.Text(p["text"]))
        elif p.get("type") == "refusal" and isinstance(p.get("refusal"), str):
            parts.append(c.Text(p["refusal"]))
        elif p.get("type") == "input_image":
            url = p.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if isinstance(url, str) and url:
                split = d.split_data_url(url)
                parts.append(c.Image(*split) if split else c.Image("image/jpeg", url=url))
            else:  # a file_id: kept at OpenAI
                parts.append(c.Text(c.left_out("image", "(a file_id)" if p.get("file_id") else "(no url)")))
        elif p.get("type") in UNREADABLE_PARTS:
            name = p.get("filename") if isinstance(p.get("filename"), str) else ""
            parts.append(c.Text(c.left_out(UNREADABLE_PARTS[p["type"]], name=name)))
    return parts


UNREADABLE_PARTS = {"input_file": "file", "input_audio": "audio"}  # -> the left_out text's kind


def _tool_output(output) -> tuple[str, tuple]:
    """A tool's output -> (its text, its images): a list of parts keeps its text, its images
    (with URLs) and, for a file or audio, the text that stands for it."""
    if isinstance(output, str):
        return output, ()
    if not isinstance(output, list):
        return json.dumps(output), ()
    texts, images = [], []
    for o in output:
        if isinstance(o, str):
            texts.append(o)
        elif isinstance(o, dict) and isinstance(o.get("text"), str):
            texts.append(o["text"])
        elif isinstance(o, dict):  # the line for a file stands on its own
            for part in _parts([o]):
                (images if isinstance(part, c.Image) else texts).append(
                    part if isinstance(part, c.Image) else f"\n{part.text}\n")
    return "".join(texts).strip("\n") if texts else "", tuple(images)


USABLE_TOOL_TYPES = ("function", "namespace", "custom", "tool_search", None)


def _tools(tools: list[dict]) -> list[c.ToolSpec]:
    """Each spec's `source` is where the client sent its schema, numbered as the client did."""
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type")
        if kind == "namespace":
            nested = [(k, x) for k, x in enumerate(t.get("tools") or ()) if isinstance(x, dict)]
            out.extend(_function(x, f"tools[{i}].tools[{k}]", namespace=str(t.get("name") or ""))
                       for k, x in nested)
        elif kind == "custom" and isinstance(t.get("name"), str):
            out.append(freeform.custom_spec(t["name"], t.get("description") or "", t.get("format"),
                                            f"tools[{i}].format"))
        elif kind in ("function", "tool_search", None):
            out.append(_function(t, f"tools[{i}]"))
    return [t for t in out if t is not None]


def _function(t: dict, where: str, namespace: str | None = None) -> c.ToolSpec | None:
    fn = t.get("function") if isinstance(t.get("function"), dict) else t
    where += ".function" if fn is not t else ""
    name = fn.get("name") or (t.get("type") if t.get("type") == "tool_search" else None)
    if not isinstance(name, str):
        return None
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else None
    return c.ToolSpec(name, fn.get("description") or "", params or {"type": "object", "properties": {}},
                      namespace=namespace, source=f"{where}.parameters")


def _tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if choice in ("auto", "none", "required") or isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return choice
    return None


def render_error(err: ProxyError) -> dict:
    return openai_body(err)


def stream_error(turn: d.Turn, err: ProxyError) -> list:
    from proxy.dialects.responses_out import failed_frames
    return failed_frames(turn, err)
