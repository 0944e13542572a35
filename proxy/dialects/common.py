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
