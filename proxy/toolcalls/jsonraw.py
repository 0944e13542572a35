"""Read a JSON call object while keeping each value's raw source text.

``object_members(text)`` returns ``{key: (value, raw_source)}`` for a top-level JSON object,
so a call's ``arguments`` can be forwarded as the exact bytes the model wrote.
``call_from_object`` understands the shapes models use for a call:
``{"name", "arguments"|"parameters"}`` and ``{"function": {...}}`` / ``{"function": "name"}``.
"""
from __future__ import annotations

import json

_DECODER = json.JSONDecoder()
_WS = " \t\r\n"


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def _items(text: str, open_: str, close: str, read) -> list | None:
    """The items of the JSON container (``{…}`` or ``[…]``) that is all of ``text``, or None.

    ``read(text, pos) -> (item, end)`` reads one member or element; it raises ValueError
    when there is none at ``pos``."""
    pos = _skip_ws(text, 0)
    if not text.startswith(open_, pos):
        return None
    items: list = []
    pos = _skip_ws(text, pos + 1)
    if text.startswith(close, pos):
        return items if _skip_ws(text, pos + 1) == len(text) else None
    try:
        while True:
            item, pos = read(text, pos)
            items.append(item)
            pos = _skip_ws(text, pos)
            if text.startswith(",", pos):
                pos = _skip_ws(text, pos + 1)
                continue
            return items if text.startswith(close, pos) and _skip_ws(text, pos + 1) == len(text) else None
    except ValueError:
        return None


def _member(text: str, pos: int) -> tuple[tuple[str, tuple[object, str]], int]:
    key, pos = _DECODER.raw_decode(text, pos)
    pos = _skip_ws(text, pos)
    if not isinstance(key, str) or not text.startswith(":", pos):
        raise ValueError("not an object member")
    start = _skip_ws(text, pos + 1)
    value, pos = _DECODER.raw_decode(text, start)
    return (key, (value, text[start:pos])), pos


def _element(text: str, pos: int) -> tuple[str, int]:
    _, end = _DECODER.raw_decode(text, pos)
    return text[pos:end], end


def object_members(text: str) -> dict[str, tuple[object, str]] | None:
    """Members of the JSON object that is all of ``text`` (surrounding whitespace allowed)."""
    members = _items(text, "{", "}", _member)
    return None if members is None else dict(members)


def _arguments_raw(members: dict[str, tuple[object, str]], require: bool) -> str | None:
    for key in ("arguments", "parameters"):
        if key in members:
            value, raw = members[key]
            if value is None:
                return "{}"
            return value if isinstance(value, str) else raw
    return None if require else "{}"


def call_from_object(text: str, require_arguments: bool = False) -> tuple[str, str] | None:
    """(name, raw arguments) of a call object, or None when ``text`` is not one.

    ``require_arguments``: an object without ``arguments``/``parameters`` is not a call
    (so a JSON answer such as ``{"name": "Ada", "age": 3}`` stays text).
    """
    members = object_members(text)
    if members is None:
        return None
    fn = members.get("function")
    if fn is not None and isinstance(fn[0], dict):
        return call_from_object(fn[1], require_arguments)
    name = members.get("name", fn)
    if name is None or not isinstance(name[0], str):
        return None
    arguments = _arguments_raw(members, require_arguments)
    return None if arguments is None else (name[0], arguments)


def array_elements(text: str) -> list[str] | None:
    """Raw source of each element of the JSON array that is all of ``text``."""
    return _items(text, "[", "]", _element)
