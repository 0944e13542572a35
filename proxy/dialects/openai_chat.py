"""OpenAI Chat Completions <-> canonical.

Ingress keeps system/developer messages in place, carries `reasoning_content` (or
`reasoning`) of echoed assistant turns, keeps tool-call arguments verbatim and rejects
`n` > 1. Egress: unnamed `data:` chunks, a role opener first, reasoning by policy,
tool calls per index, a finish chunk, the usage chunk only when the client asked for it
(`stream_options.include_usage`), then `[DONE]`.

Custom tools (`{"type": "custom", "custom": {name, description, format}}`, a Lark or regex
grammar or free text) go upstream as freeform.py's functions of one `input` string, constrained
by the grammar; their calls come back as `{"type": "custom", "custom": {name, input}}`, the raw
input streamed whole when the call ends (the upstream writes it JSON-escaped).
"""
from __future__ import annotations

import json
from typing import Iterator

from proxy import canonical as c
from proxy.dialects import common as d, freeform
from proxy.dialects.common import nothing_to_keep as complete, request_as_parsed as prepare  # noqa: F401 - API
from proxy.errors import InvalidRequest, ProxyError, openai_body

NAME = "openai_chat"
TURN_ID_PREFIX = "chatcmpl-"
INPUT_FIELD = "messages"
INTERLEAVED_CALLS = True  # tool_calls deltas carry their index
CONSUMED = {"messages", "model", "stream", "stream_options", "tools", "tool_choice", "max_tokens",
            "max_completion_tokens", "temperature", "top_p", "top_k", "stop", "reasoning_effort",
            "parallel_tool_calls", "metadata", "n", "user", "functions", "function_call"}
FINISH = {"tool_calls": "tool_calls", "length": "length", "content_filter": "content_filter"}


# ---- ingress ---------------------------------------------------------------------------
def parse_request(body, policy) -> c.Request:
    body = d.require_object(body)
    n = body.get("n")
    if n is not None and n != 1:
        raise InvalidRequest("`n` must be 1: this server returns one choice per request", param="n")
    # OpenAI's deprecated function calling, once dropped unseen: (field, its successor, what
    # to send instead, the values that ask nothing)
    for legacy, successor, send, ask_nothing in (
            ("functions", "tools", "`tools`", (None, [])),
            ("function_call", "tool_choice", "`tools` and `tool_choice`", (None, "none", "auto"))):
        if body.get(legacy) not in ask_nothing:
            raise InvalidRequest(f"`{legacy}` is the deprecated form of `{successor}`, which this "
                                 f"server takes: send {send}", param=legacy)
    messages = tuple(_message(m, i) for i, m in enumerate(d.list_of_objects(body, "messages", True)))
    stream_options = body.get("stream_options")
    include_usage = stream_options.get("include_usage") if isinstance(stream_options, dict) else None
    max_tokens = d.opt_int(body, "max_completion_tokens") or d.opt_int(body, "max_tokens")
    tools, tool_choice = d.fit_tool_choice(
        tuple(t for t in (_tool(t, i) for i, t in enumerate(d.list_of_objects(body, "tools"))) if t),
        _tool_choice(body.get("tool_choice")))
    return c.Request(
        model=d.opt_str(body, "model") or "", messages=messages, tools=tools, tool_choice=tool_choice,
        max_tokens=max_tokens or policy.max_tokens,
        temperature=d.or_default(d.opt_float(body, "temperature"), policy.temperature),
        top_p=d.opt_float(body, "top_p"), top_k=d.opt_int(body, "top_k"),
        stop=d.stop_list(body.get("stop"), "stop"), stream=bool(d.opt_bool(body, "stream")),
        include_usage=include_usage if isinstance(include_usage, bool) else None,
        continuous_usage=include_usage is True and stream_options.get("continuous_usage_stats") is True,
        reasoning_effort=d.opt_str(body, "reasoning_effort") or policy.effort,
        parallel_tool_calls=d.opt_bool(body, "parallel_tool_calls"),
        metadata=body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        passthrough={k: v for k, v in body.items() if k not in CONSUMED})


def _message(m: dict, i: int) -> c.Message:
    role = m.get("role")
    if role in ("system", "developer"):
        return c.Message("system", tuple(_content(m.get("content"), i)))
    if role == "tool":
        content = m.get("content")
        text = content if isinstance(content, str) else "".join(
            p.text for p in _content(content, i) if isinstance(p, c.Text))
        return c.Message("tool", (c.ToolResult(str(m.get("tool_call_id") or ""), text,
                                               name=m.get("name") if isinstance(m.get("name"), str) else None),))
    if role == "assistant":
        return c.Message("assistant", tuple(_assistant_parts(m, i)))
    if role in ("user", "function"):
        name = m.get("name") if isinstance(m.get("name"), str) else None
        return c.Message("user", tuple(_content(m.get("content"), i)), name=name)
    raise InvalidRequest(f"`messages[{i}].role` must be system, developer, user, assistant or tool",
                         param=f"messages[{i}].role")


def _assistant_parts(m: dict, i: int) -> list:
    parts: list = []
    reasoning = m.get("reasoning_content") or m.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        parts.append(c.Reasoning(reasoning))
    parts.extend(_content(m.get("content"), i))
    for j, call in enumerate(m.get("tool_calls") or ()):
        custom = call.get("custom") if isinstance(call, dict) else None
        if isinstance(custom, dict) and isinstance(custom.get("name"), str):
            raw = custom.get("input") if isinstance(custom.get("input"), str) else ""
            parts.append(c.ToolCall(str(call.get("id") or f"call_{j}"), custom["name"],
                                    json.dumps({"input": raw}, ensure_ascii=False)))
            continue
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"`messages[{i}].tool_calls[{j}].function.name` is required")
        args = fn.get("arguments")
        args = args if isinstance(args, str) else ("{}" if args is None else json.dumps(args))
        parts.append(c.ToolCall(str(call.get("id") or f"call_{j}"), fn["name"], args))
    return parts


def _content(content, i: int) -> list:
    if content is None:
        return []
    if isinstance(content, str):
        return [c.Text(content)] if content else []
    if not isinstance(content, list):
        raise InvalidRequest(f"`messages[{i}].content` must be a string or a list of parts")
    parts = []
    for p in content:
        if isinstance(p, str):
            parts.append(c.Text(p))
        elif isinstance(p, dict) and isinstance(p.get("text"), str):
            parts.append(c.Text(p["text"]))
        elif isinstance(p, dict) and p.get("type") == "image_url":
            parts.append(_image(p.get("image_url"), i))
        elif isinstance(p, dict):  # a file, audio, ...: named where it was, never dropped unseen
            file = p.get("file") if isinstance(p.get("file"), dict) else {}
            name = file.get("filename") if isinstance(file.get("filename"), str) else ""
            kind = {"file": "file", "input_audio": "audio"}.get(p.get("type"), f"{p.get('type')!r} part")
            parts.append(c.Text(c.left_out(kind, name=name)))
    return parts


def _image(spec, i: int) -> c.Image:
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"`messages[{i}]` has an image_url part without a url")
    split = d.split_data_url(url)
    if split:
        return c.Image(split[0], split[1])
    if url.startswith(("http://", "https://")):
        ext = url.rsplit(".", 1)[-1].lower()
        mt = {"png": "image/png", "gif": "image/gif", "webp": "image/webp"}.get(ext, "image/jpeg")
        return c.Image(mt, url=url)
    return c.Image("image/png", url)


def _tool(t: dict, i: int) -> c.ToolSpec | None:
    if t.get("type") == "custom":
        custom = t.get("custom") if isinstance(t.get("custom"), dict) else {}
        if not isinstance(custom.get("name"), str):
            return None
        fmt = custom.get("format") if isinstance(custom.get("format"), dict) else {}
        grammar = fmt.get("grammar") if isinstance(fmt.get("grammar"), dict) else None
        return freeform.custom_spec(custom["name"], custom.get("description") or "",
                                    {**grammar, "type": "grammar"} if grammar else fmt,
                                    f"tools[{i}].custom.format")
    fn = t.get("function") if isinstance(t.get("function"), dict) else t
    if not isinstance(fn.get("name"), str):
        return None  # left out: the tools after it move up, so `source` keeps the client's index
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else None
    return c.ToolSpec(fn["name"], fn.get("description") or "", params or {"type": "object", "properties": {}},
                      source=f"tools[{i}].function.parameters" if fn is not t else f"tools[{i}].parameters")


def _tool_choice(choice):
    """A custom tool named: as the function it goes upstream as."""
    if isinstance(choice, dict) and choice.get("type") == "custom":
        custom = choice.get("custom") if isinstance(choice.get("custom"), dict) else {}
        return {"type": "function", "function": {"name": custom.get("name")}}
    return choice


# ---- egress ----------------------------------------------------------------------------
def finish_reason(reason: str) -> str:
    return FINISH.get(reason, "stop")


def usage_body(u: c.Usage) -> dict:
    return {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_input_tokens},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}}


def render_response(turn: d.Turn, req: c.Request, resp: c.Response, policy) -> dict:
    text, calls = resp.text(), resp.tool_calls()
    reasoning = "".join(r.text for r in resp.reasoning() if not r.redacted)
    message: dict = {"role": "assistant", "content": text if (text or not calls) else None}
    if reasoning and policy.reasoning == "inline_tags":
        message["content"] = f"<think>{reasoning}</think>{text}"
    elif reasoning and policy.reasoning == "reasoning_content":
        message["reasoning_content"] = reasoning
    if calls:
        custom = _custom_names(req)
        message["tool_calls"] = [{"id": t.id, "type": "custom",
                                  "custom": {"name": t.name, "input": freeform.raw_input(t.arguments)}}
                                 if t.name in custom else
                                 {"id": t.id, "type": "function",
                                  "function": {"name": t.name, "arguments": t.arguments}} for t in calls]
    return {"id": turn.id, "object": "chat.completion", "created": turn.created,
            "model": turn.client_model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": finish_reason(resp.finish_reason),
                         "logprobs": {"content": list(resp.logprobs)} if resp.logprobs else None}],
            "usage": usage_body(resp.usage)}


def stream(turn: d.Turn, req: c.Request, events, policy) -> Iterator:
    so_far = None  # with continuous_usage: the upstream's usage so far, once it sent any

    def chunk(delta: dict, finish=None) -> tuple:
        body = {"id": turn.id, "object": "chat.completion.chunk", "created": turn.created,
                "model": turn.client_model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return None, body if so_far is None else {**body, "usage": usage_body(so_far)}

    yield chunk({"role": "assistant", "content": ""})
    is_think_open = False
    custom, inputs = _custom_names(req), {}  # a custom call's index -> its arguments so far
    for ev in events:
        if ev is d.KEEPALIVE:
            yield d.KEEPALIVE
        elif isinstance(ev, c.UsageUpdate) and req.continuous_usage:
            so_far = ev.usage
        elif isinstance(ev, c.ReasoningDelta):
            if policy.reasoning == "reasoning_content":
                yield chunk({"reasoning_content": ev.text})
            elif policy.reasoning == "inline_tags":
                if not is_think_open:
                    is_think_open = True
                    yield chunk({"content": "<think>"})
                yield chunk({"content": ev.text})
        elif isinstance(ev, (c.ReasoningEnd, c.TextDelta, c.ToolCallStart, c.StreamEnd)) and is_think_open:
            is_think_open = False
            yield chunk({"content": "</think>"})
        if isinstance(ev, c.TextDelta):
            yield chunk({"content": ev.text})
        elif isinstance(ev, c.ToolCallStart) and ev.name in custom:
            inputs[ev.index] = []
            yield chunk({"tool_calls": [{"index": ev.index, "id": ev.id, "type": "custom",
                                         "custom": {"name": ev.name, "input": ""}}]})
        elif isinstance(ev, c.ToolCallStart):
            yield chunk({"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                         "function": {"name": ev.name, "arguments": ""}}]})
        elif isinstance(ev, c.ToolCallArgsDelta) and ev.index in inputs:
            inputs[ev.index].append(ev.text)
        elif isinstance(ev, c.ToolCallArgsDelta):
            yield chunk({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]})
        elif isinstance(ev, c.LogprobsDelta):
            frame = chunk({})
            frame[1]["choices"][0]["logprobs"] = {"content": list(ev.content)}
            yield frame
        elif isinstance(ev, c.StreamEnd):
            for index, parts in inputs.items():
                yield chunk({"tool_calls": [{"index": index, "custom": {
                    "input": freeform.raw_input("".join(parts))}}]})
            yield chunk({}, finish_reason(ev.finish_reason))
            if req.include_usage:  # as OpenAI: no captured client needs it without asking
                yield None, {"id": turn.id, "object": "chat.completion.chunk", "created": turn.created,
                             "model": turn.client_model, "choices": [], "usage": usage_body(ev.usage)}
    yield d.DONE


def _custom_names(req: c.Request) -> set[str]:
    return {t.name for t in req.tools if t.kind == "custom"}


def render_error(err: ProxyError) -> dict:
    return openai_body(err)


def stream_error(turn: d.Turn, err: ProxyError) -> list:
    body = openai_body(err)
    body["error"].pop("param", None)
    return [(None, body), d.DONE]
