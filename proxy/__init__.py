"""kimi-proxy: the protocol proxy of kimi-local.

One request through the code:

    server.py      gevent WSGIServer (TCP_NODELAY, headers + first body piece in one write)
    app.py         create_app: config, Services, guards, routes
    guards.py      request id, Host/Origin checks, API key; errors rendered by the route's dialect
    routes.py      JSON body (fastjson.py) -> clients/policy.resolve (clients/detect.py,
                   clients/presets.py) -> handler.run
    handler.py     one request's Context: dialects/<d>.parse_request -> canonical.Request
                   -> dialects/<d>.prepare -> upstream/payload.build_payload (state/ restores
                   reasoning from the ledger) -> upstream/client.py (http11.py; JSON or SSE)
                   -> pipeline.py (toolcalls/ parsers, <think> splitter, per-index native
                   tool calls) -> canonical events -> dialects/<d>.stream (frames; sse.py
                   encodes) or .render_response -> dialects/<d>.complete
    services.py    what the app holds: upstream, metrics.py, state/, cassettes/record.py;
                   ledger writes, the request log

Anthropic, OpenAI Chat and OpenAI Responses are three adapters around canonical.py;
no dialect module knows another. cassettes/replay.py re-runs recorded cassettes.
"""
__version__ = "0.1.0"
