"""Dialect adapters. Each module exposes the same small set of functions:

    parse_request(body: dict, policy) -> canonical.Request     (raises InvalidRequest)
    render_response(turn, req, resp, policy) -> dict            (the non-stream body)
    stream(turn, req, events, policy) -> Iterator[Frame]        (frames: (event|None, data) or markers)
    render_error(err) -> dict                                   (the JSON error body)
    stream_error(turn, err) -> list[Frame]                      (the in-stream error frames)

Translation is always dialect -> canonical -> dialect; no module imports another dialect.
"""
from proxy.dialects import anthropic, openai_chat, openai_responses

BY_NAME = {"anthropic": anthropic, "openai_chat": openai_chat, "openai_responses": openai_responses}
