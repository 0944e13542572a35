"""kimi-proxy: the protocol proxy of kimi-local.

One request through the code:

    server.py      gevent WSGIServer (TCP_NODELAY, headers + first body piece in one write)
    app.py         create_app: config, Services, guards, routes
    guards.py      request id, Host/Origin checks, API key; errors rendered per dialect
    routes.py      JSON body -> policy.resolve (detect.py + presets.py) -> handler.run
    handler.py     dialects/<d>.parse_request -> canonical.Request
                   -> payload.build_payload (state.py restores reasoning from the ledger)
                   -> upstream.py (http11.py; JSON or SSE) -> pipeline.py (toolcalls/ parsers,
                   <think> splitter, per-index native tool calls) -> canonical events
                   -> dialects/<d>.stream (frames; sse.py encodes) or .render_response
    services.py    ledger writes, stored Responses, metrics.py, the request log, recorder.py

Anthropic, OpenAI Chat and OpenAI Responses are three adapters around canonical.py;
no dialect module knows another. replay.py re-runs recorded cassettes.
"""
__version__ = "0.1.0"
