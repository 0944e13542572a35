"""Helpers shared by the dialect adapters: the per-request turn identity, frame markers,
and small coercions with clear errors."""
from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field

from proxy.errors import InvalidRequest


class Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"<{self.name}>"


KEEPALIVE = Marker("keepalive")   # an SSE comment frame
DONE = Marker("done")             # Chat's `data: [DONE]`


@dataclass
class Turn:
    """Identity of one request as the client sees it."""
    client_model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    input_estimate: int = 0
    extra: dict = field(default_factory=dict)


def request_as_parsed(ctx, body: dict):
    """`prepare` of a dialect whose request needs nothing beyond its own body."""
    return ctx.req


def nothing_to_keep(ctx) -> None:
    """`complete` of a dialect that keeps nothing once its response is done."""


def new_hex(n: int = 24) -> str:
    return secrets.token_hex(n // 2)


def require_object(body, what: str = "request body") -> dict:
    if not isinstance(body, dict):
        raise InvalidRequest(f"{what} must be a JSON object, got {type(body).__name__}")
    return body


def opt_int(body: dict, key: str) -> int | None:
    value = _typed(body, key, (int, float, str), "an integer")
    if value is None:
        return None
    try:
        number = int(float(value)) if isinstance(value, str) else int(value)
    except (ValueError, OverflowError):
        raise InvalidRequest(f"`{key}` must be an integer", param=key) from None
    if number < 1:
        raise InvalidRequest(f"`{key}` must be at least 1", param=key)
    return number


def opt_float(body: dict, key: str) -> float | None:
    value = _typed(body, key, (int, float), "a number")
    if value is None:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidRequest(f"`{key}` must be a finite number", param=key)
    return float(value)


def opt_bool(body: dict, key: str) -> bool | None:
    return _typed(body, key, bool, "true or false")


def opt_str(body: dict, key: str) -> str | None:
    return _typed(body, key, str, "a string")


def _typed(body: dict, key: str, types, what: str):
    """body[key], None when absent or null; refused unless one of `types`. A JSON true or
    false is a bool only, never a number."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) != (types is bool) or not isinstance(value, types):
        raise InvalidRequest(f"`{key}` must be {what}", param=key)
    return value


def or_default(value, default):
    """The client's value, or the preset's default when the client gave none."""
    return default if value is None else value


def stop_list(value, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise InvalidRequest(f"`{key}` must be a string or a list of strings", param=key)


def list_of_objects(body: dict, key: str, required: bool = False) -> list:
    value = body.get(key)
    if value is None:
        if required:
            raise InvalidRequest(f"`{key}` is required", param=key)
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"`{key}` must be a list", param=key)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest(f"`{key}[{i}]` must be an object", param=f"{key}[{i}]")
    return value


def parse_args_object(raw: str) -> dict:
    """Arguments as an object for dialects that need one (invalid -> {}, scalar -> {"value"})."""
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {"value": value}


def split_data_url(url: str) -> tuple[str, str] | None:
    """`data:<mt>;base64,<payload>` -> (media type, payload)."""
    if not url.startswith("data:") or "," not in url:
        return None
    head, payload = url[5:].split(",", 1)
    media_type = head.split(";")[0] or "image/png"
    return media_type, payload


def fit_tool_choice(tools: tuple, choice, hosted: tuple[str, ...] = ()) -> tuple[tuple, object]:
    """(tools, tool_choice) as they go upstream, from the client's function tools and its choice
    in OpenAI Chat form, or an allowed_tools choice in either OpenAI form (Responses:
    {"type": "allowed_tools", "mode", "tools"}; Chat nests mode and tools in "allowed_tools"):
    that one keeps the tools it lists and goes as its mode. hosted: the names and types of the
    hosted tools left out (handler.py). A choice that forces a call where the request has no
    tool, or names one it does not have, is a 400, as OpenAI and Anthropic answer it; one that
    forces a hosted tool goes as auto, as the hosted tools themselves go: left out, never refused."""
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        tools, choice = _allowed_tools(tools, choice)
    function = choice.get("function") if isinstance(choice, dict) else None
    named = function.get("name") if isinstance(function, dict) else None
    if named is not None and not isinstance(named, str):
        raise InvalidRequest("`tool_choice` must name its tool with a string", param="tool_choice")
    if named is not None and named not in {t.name for t in tools}:
        if named in hosted:
            return tools, None
        raise InvalidRequest(f"`tool_choice` names {named!r}, which is not among `tools`",
                             param="tool_choice")
    if choice == "required" and not tools:
        if hosted:
            return tools, None
        raise InvalidRequest("`tool_choice` asks for a tool call, but the request has no tools: "
                             "send `tools`, or leave `tool_choice` out", param="tool_choice")
    return tools, choice


def _allowed_tools(tools: tuple, choice: dict) -> tuple[tuple, str]:
    spec = choice.get("allowed_tools", choice)  # Chat nests them, Responses does not
    listed = spec.get("tools") if isinstance(spec, dict) else None
    if (spec.get("mode") if isinstance(spec, dict) else None) not in ("auto", "required") \
            or not isinstance(listed, list) or not listed:
        raise InvalidRequest("an allowed_tools `tool_choice` needs `mode` ('auto' or 'required') "
                             "and a non-empty list of `tools`", param="tool_choice")
    names = set()
    for i, ref in enumerate(listed):  # {"type": "function", "name"}, or "function": {"name"}
        kind = ref.get("type") if isinstance(ref, dict) else None
        if not isinstance(kind, str):
            raise InvalidRequest(f"`tool_choice.allowed_tools.tools[{i}]` must be an object with "
                                 "a `type`", param="tool_choice")
        if kind not in ("function", "custom"):
            continue  # a hosted tool: left out with the rest
        inner = ref[kind] if isinstance(ref.get(kind), dict) else ref
        if not isinstance(inner.get("name"), str):
            raise InvalidRequest(f"`tool_choice.allowed_tools.tools[{i}]` must name its {kind} "
                                 "with a string", param="tool_choice")
        names.add(inner["name"])
    missing = sorted(names - {t.name for t in tools})
    if missing:
        raise InvalidRequest(f"`tool_choice.allowed_tools` lists {missing[0]!r}, which is not "
                             "among `tools`", param="tool_choice")
    return tuple(t for t in tools if t.name in names), spec["mode"]
