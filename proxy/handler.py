"""One model request, for any dialect: parse -> canonical -> upstream -> canonical -> render.

    dialect.parse_request -> build_payload -> upstream (stream or JSON)
      -> Pipeline.run (canonical events) -> dialect.stream / dialect.render_response

Errors before a stream starts are raised (the app renders them with a real status);
after it starts they become the dialect's in-stream error frames and a clean close.
Closing the client stream closes the upstream connection.
"""
from __future__ import annotations

import logging
import queue
import re
import threading
import time
from dataclasses import dataclass, field

from flask import Response, current_app, g, request

from proxy import canonical as c
from proxy import sse
from proxy.dialects import common as d
from proxy.errors import InvalidRequest, from_exception
from proxy.payload import build_payload, tool_to_openai
from proxy.pipeline import Options, Pipeline, chunks_from_json, one_call_at_a_time
from proxy.toolcalls import get_parser

log = logging.getLogger("kimi.proxy")
ID_PREFIX = {"anthropic": "msg_", "openai_chat": "chatcmpl-", "openai_responses": "resp_"}
_END = object()


@dataclass
class Exchange:
    """What one request did (for logs, metrics and cassettes)."""
    route: str
    policy: object
    payload: dict | None = None
    chunks: list = field(default_factory=list)
    upstream_response: dict | None = None
    frames: list = field(default_factory=list)
    status: int = 200
    started: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    request_id: str = "-"
    turn: object = None
    req: object = None
    request_info: dict | None = None
    is_recording: bool = False  # keep chunks and frames only for a cassette


def upstream_model(cfg: dict, policy, requested: str, served: str | None) -> str:
    """Alias -> preset passthrough -> small model -> --model -> the upstream's own name."""
    aliases = cfg["MODEL_ALIAS"]
    if requested in aliases:
        return aliases[requested]
    if policy.passthrough_model and re.search(policy.passthrough_model, requested or ""):
        return requested
    if cfg.get("SMALL_MODEL") and policy.small_model and re.search(policy.small_model, requested or ""):
        return cfg["SMALL_MODEL"]
    return cfg["MODEL"] or served or requested or "default"


def run(dialect, policy, body: dict, route: str, request_info: dict | None = None) -> Response:
    app, cfg = current_app, current_app.config
    services = app.extensions["kimi"]
    req = dialect.parse_request(body, policy)
    turn = d.Turn(client_model=req.model or cfg["MODEL"] or "kimi-local",
                  id=ID_PREFIX[dialect.NAME] + d.new_hex())
    req = services.prepare(dialect.NAME, req, body, turn)
    _note_dropped_tools(dialect.NAME, req, services)
    if not any(m.role != "system" for m in req.messages):
        raise InvalidRequest("there is nothing to answer: send at least one user message"
                             + (" in `input`" if dialect.NAME == "openai_responses" else " in `messages`"))
    ledger_id = services.reasoning.new_turn()
    field_ = cfg["REASONING_FIELD"]
    model = upstream_model(cfg, policy, req.model, None if cfg["MODEL"] else services.served_model())
    payload = build_payload(req, model=model, reasoning_field=field_,
                            restore=lambda m: services.reasoning.restore(m, field_), effort=policy.effort)
    payload = services.fit_max_tokens(payload, request.content_length or 0)
    turn.input_estimate = max(1, (request.content_length or 0) // 4)  # until the engine's real count
    ex = Exchange(route, policy, payload, request_id=g.request_id, turn=turn, req=req)
    ex.request_info = request_info
    ex.is_recording = services.recorder is not None
    g.exchange = ex
    opts = Options(client_model=turn.client_model,
                   parser=get_parser(policy.tool_parser, [tool_to_openai(t) for t in req.tools]),
                   split_think=field_ in ("auto", "inline"), stop=req.stop,
                   sign=lambda text: services.reasoning.sign(text, ledger_id),
                   reasoning_key=None if field_ == "auto" else field_,
                   on_parse_failure=lambda why: services.metrics.parse_failures.labels(policy.tool_parser).inc())
    headers = {"X-Request-Id": g.request_id}
    if not req.stream:
        return _json(dialect, policy, req, turn, opts, ex, services, headers, ledger_id)
    stream = services.upstream.open_stream(payload, headers)  # raises before any byte is sent
    frames = _frames(dialect, policy, req, turn, opts, ex, services, stream, ledger_id)
    return Response(_encoded(frames, dialect, turn, ex, services, stream),
                    headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
                             "X-Accel-Buffering": "no", "X-Kimi-Preset": policy.preset})


def _json(dialect, policy, req, turn, opts, ex, services, headers, ledger_id) -> Response:
    started = time.monotonic()
    body = services.upstream.chat(ex.payload, headers)
    services.metrics.upstream_latency.labels(ex.route).observe(time.monotonic() - started)
    ex.upstream_response = body
    end = None
    for ev in Pipeline(opts).run(chunks_from_json(body)):
        end = ev if isinstance(ev, c.StreamEnd) else end
    services.finish(dialect.NAME, req, turn, end.response, ledger_id, policy)
    out = dialect.render_response(turn, req, end.response, policy)
    services.after_response(dialect.NAME, req, turn, out)
    ex.frames = out
    services.done(ex)
    return current_app.response_class(sse.dumps(out), mimetype="application/json")


def _frames(dialect, policy, req, turn, opts, ex, services, stream, ledger_id):
    def recorded(chunks):
        for chunk in chunks:
            if ex.is_recording:
                ex.chunks.append(chunk)
            yield chunk

    def finished(events):
        for ev in events:
            if ex.first_token is None and isinstance(ev, (c.TextDelta, c.ReasoningDelta, c.ToolCallStart)):
                ex.first_token = time.monotonic()  # the first model token the client can see
                services.metrics.ttft.labels(ex.route).observe(ex.first_token - ex.started)
            if isinstance(ev, c.StreamEnd):
                services.finish(dialect.NAME, req, turn, ev.response, ledger_id, policy)
            yield ev

    events = finished(Pipeline(opts).run(recorded(stream)))
    if dialect.NAME != "openai_chat":
        events = one_call_at_a_time(events)
    interval = current_app.config["PING_INTERVAL_S"]  # 0 turns keep-alives off
    if interval and policy.ping_interval_s:
        interval = min(interval, policy.ping_interval_s)
    return dialect.stream(turn, req, with_keepalive(events, interval), policy)


def with_keepalive(events, interval_s: float):
    """Yield events; yield KEEPALIVE whenever the upstream is quiet for interval_s."""
    if not interval_s:
        yield from events
        return
    q: queue.Queue = queue.Queue(maxsize=64)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def pump():
        try:
            for ev in events:
                if not put(ev):
                    return
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(exc)

    threading.Thread(target=pump, daemon=True, name="kimi-proxy-pump").start()
    try:
        while True:
            try:
                item = q.get(timeout=interval_s)
            except queue.Empty:
                yield d.KEEPALIVE
                continue
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def _encoded(frames, dialect, turn, ex, services, stream):
    error = None
    try:
        for frame in frames:
            data = _encode(frame)
            if ex.is_recording:
                ex.frames.append(data)
            yield data
    except GeneratorExit:
        ex.status = 499
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes an in-stream error
        error = from_exception(exc)
        ex.status = error.status
        log.warning("stream %s failed: %s", ex.request_id, error.message)
        services.metrics.stream_errors.labels(ex.route).inc()
        for frame in dialect.stream_error(turn, error):
            data = _encode(frame)
            if ex.is_recording:
                ex.frames.append(data)
            yield data
    finally:
        stream.close()
        services.metrics.upstream_latency.labels(ex.route).observe(time.monotonic() - ex.started)
        services.done(ex)


def _encode(frame) -> bytes:
    if frame is d.KEEPALIVE:
        return sse.COMMENT_KEEPALIVE
    if frame is d.DONE:
        return sse.encode_done()
    return sse.encode(*frame)


def _note_dropped_tools(dialect: str, req, services) -> None:
    """Hosted tools run at the vendor: left out, never rejected (that would break the client)."""
    for kind in req.dropped_tools:
        services.metrics.dropped_tools.labels(dialect, kind).inc()
    if req.dropped_tools:
        log.info("hosted tools left out (the engine cannot run them): %s", ", ".join(req.dropped_tools))
