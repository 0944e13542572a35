"""Dialect adapters. Each module exposes the same small set of names:

    NAME, TURN_ID_PREFIX (the response id's prefix), INPUT_FIELD (where the messages are),
    INTERLEAVED_CALLS (False: the handler serializes parallel tool calls for it)
    parse_request(body: dict, policy) -> canonical.Request     (raises InvalidRequest)
    prepare(ctx, body) -> canonical.Request                     (the request with dialect state)
    complete(ctx)                                               (keep what the dialect keeps)
    render_response(turn, req, resp, policy) -> dict            (the non-stream body)
    stream(turn, req, events, policy) -> Iterator[Frame]        (frames: (event|None, data) or markers)
    render_error(err) -> dict                                   (the JSON error body)
    stream_error(turn, err) -> list[Frame]                      (the in-stream error frames)

Translation is always dialect -> canonical -> dialect; no module imports another dialect.
"""
