"""``json``: the whole reply is a call object or an array of call objects, optionally fenced.

    {"name": "get_weather", "arguments": {"city": "Beijing"}}
    ```json
    [{"name": "a", "arguments": {}}, {"function": {"name": "b", "arguments": "{}"}}]
    ```

The reply is held only while its start could be a call: optional fence (```` ``` ```` or
```` ```json ````), optional ``[``, ``{`` and a first key among ``name``, ``function``,
``arguments``, ``parameters``, ``type``. Anything else (``[link](…)``, ``{"a": 1}``,
```` ```python ````) streams out at once. Arguments keep the model's raw JSON bytes.
Trailing prose after the JSON makes the whole reply text. At the end, a held reply that
is valid JSON but not a call list (no ``arguments``/``parameters``) is an ordinary answer
and becomes text; invalid or truncated JSON, an unknown tool or invalid argument JSON also
become text, with a ``ParseFailure``.
"""
from __future__ import annotations

import json

from proxy.canonical import Event, TextDelta

from .jsonraw import array_elements, call_from_object
from .whole_reply import MAYBE, NO, YES, WholeReplyParser

FENCE = "```"
CALL_KEYS = ("name", "function", "arguments", "parameters", "type")
_DECODER = json.JSONDecoder()


def split_fence(text: str) -> tuple[str | None, str]:
    """(state, json text): strips a leading fence line; state MAYBE/NO when undecided or wrong."""
    text = text.lstrip()
    if not text.startswith(FENCE):
        return (MAYBE if FENCE.startswith(text) and text else None), text
    line, newline, rest = text[len(FENCE):].partition("\n")
    lang = line.strip()
    if not newline:
        return (MAYBE if "json".startswith(lang) else NO), ""
    return (None if lang in ("", "json") else NO), rest


def json_prefix_state(text: str) -> str:
    fence_state, text = split_fence(text)
    if fence_state is not None:
        return fence_state
    text = text.lstrip()
    if text.startswith("["):
        text = text[1:].lstrip()
    if not text:
        return MAYBE
    if text[0] != "{":
        return NO
    text = text[1:].lstrip()
    if not text:
        return MAYBE
    if text[0] != '"':
        return NO
    key, closed, _ = text[1:].partition('"')
    if closed:
        return YES if key in CALL_KEYS else NO
    return MAYBE if any(k.startswith(key) for k in CALL_KEYS) else NO


def strip_closing_fence(text: str, fenced: bool) -> str | None:
    text = text.strip()
    if not fenced:
        return text
    return text[:-len(FENCE)].strip() if text.endswith(FENCE) else None


def _is_json(text: str | None) -> bool:
    try:
        json.loads(text or "")
    except ValueError:
        return False
    return True


class JsonParser(WholeReplyParser):
    name = "json"

    prefix_state = staticmethod(json_prefix_state)

    def has_trailing_text(self, text: str) -> bool:
        fenced = text.lstrip().startswith(FENCE)
        _, body = split_fence(text)
        body = body.lstrip()
        try:
            _, end = _DECODER.raw_decode(body)
        except ValueError:
            return False
        rest = body[end:].strip()
        return bool(rest) and not (fenced and (FENCE.startswith(rest) or rest == FENCE))

    def parse(self, text: str, out: list[Event]) -> None:
        fenced = text.lstrip().startswith(FENCE)
        body = strip_closing_fence(split_fence(text)[1], fenced)
        items = None if body is None else array_elements(body)
        items = items if items is not None else ([body] if body is not None else None)
        calls = [call_from_object(item, require_arguments=True) for item in items or []]
        if not calls or any(c is None for c in calls):
            if _is_json(body):
                out.append(TextDelta(text))   # JSON, but not a call list: an ordinary answer
            else:
                self.emit_failure(out, "reply started like a JSON tool call but is not valid JSON", text, text)
            return
        for item, (name, arguments) in zip(items, calls):
            self.emit_call(out, name, arguments, raw=item, display=item.strip())
