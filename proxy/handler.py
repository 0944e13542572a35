"""One model request, for any dialect: parse -> canonical -> upstream -> canonical -> render.

    dialect.parse_request -> build_payload -> upstream (stream or JSON)
      -> Pipeline.run (canonical events) -> dialect.stream / dialect.render_response

Errors before a stream starts are raised (the app renders them with a real status);
after it starts they become the dialect's in-stream error frames and a clean close.
Closing the client stream closes the upstream connection, and so does the client leaving
while the upstream works (a non-stream answer, a queued request, a stream before its
first byte): the server's `kimi.watch_hangup` sees its socket close. What is particular to one
dialect (the Responses store, for one) happens in its `prepare` and `complete` hooks.
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
from proxy import client_fields, sse
from proxy.clients.side_tasks import cap_side_request
from proxy.dialects import common as d
from proxy.errors import InvalidRequest, UpstreamError, from_exception
from proxy.guards import key_owner
from proxy.metrics import tool_type_label
from proxy.pipeline import Options, Pipeline, chunks_from_json, one_call_at_a_time
from proxy.state.conversation import ConversationKeys
from proxy.toolcalls import get_parser
from proxy.upstream.payload import build_payload, tool_to_openai
from proxy.upstream.stream import Cancel

log = logging.getLogger("kimi.proxy")
_END = object()
LOGGED_TYPE_CHARS = 64  # of a client's tool type, in the log line
LOGGED_TYPES = 8


@dataclass
class Context:
    """One model request: what the handler's steps share (the dialect, the policy, the parsed
    request, the client-visible turn, the services) and what the request did, for the request
    log, metrics and cassettes."""
    route: str
    policy: object
    dialect: object = None            # the route's dialect module (proxy/dialects)
    services: object = None
    req: c.Request | None = None
    turn: d.Turn | None = None
    ledger_id: str = ""
    owner: str = ""                   # who may read back what it stores (proxy.guards.key_owner)
    conversation: ConversationKeys | None = None  # keys of the request's messages (reasoning ledger)
    opts: Options | None = None
    headers: dict = field(default_factory=dict)  # sent upstream
    payload: dict | None = None
    cancel: Cancel = field(default_factory=Cancel)  # fired when the client leaves
    stop_watch: object = lambda: None
    chunks: list = field(default_factory=list)
    upstream_response: dict | None = None
    frames: list = field(default_factory=list)
    status: int = 200
    started: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    request_id: str = "-"
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
    cfg, services = current_app.config, current_app.extensions["kimi"]
    req = dialect.parse_request(body, policy)
    turn = d.Turn(client_model=req.model or cfg["MODEL"] or "kimi-local",
                  id=dialect.TURN_ID_PREFIX + d.new_hex())
    ctx = Context(route, policy, dialect, services, req, turn, request_id=g.request_id,
                  request_info=request_info, is_recording=services.recorder is not None, owner=key_owner())
    ctx.req = req = dialect.prepare(ctx, body)
    _note_dropped_tools(ctx)
    if not any(m.role != "system" for m in req.messages):
        raise InvalidRequest(f"there is nothing to answer: send at least one user message in `{dialect.INPUT_FIELD}`")
    ctx.ledger_id = services.reasoning.new_turn()
    field_ = cfg["REASONING_FIELD"]
    model = upstream_model(cfg, policy, req.model, None if cfg["MODEL"] else services.served_model())
    ctx.conversation = keys = ConversationKeys(req.messages)  # the client's, whatever the upstream
    ctx.req = req = services.sendable(req)
    payload = build_payload(req, model=model, reasoning_field=field_, effort=policy.effort,
                            restore=lambda m, i: services.reasoning.restore(m, field_, keys.before(i), ctx.owner))
    payload = cap_side_request(payload, req, cfg["SIDE_MAX_TOKENS"])
    ctx.payload = services.fit_max_tokens(payload, request.content_length or 0, req.truncation == "auto")
    if services.served_info().get("is_llama_cpp"):  # it continues a final assistant turn by
        for flag in ("continue_final_message", "add_generation_prompt"):  # itself; with its
            ctx.payload.pop(flag, None)  # --no-prefill-assistant, these would close the turn
    turn.input_estimate = max(1, (request.content_length or 0) // 4)  # until the engine's real count
    ctx.started = time.monotonic()  # the request log, latency and TTFT count from here
    g.context = ctx
    ctx.opts = Options(client_model=turn.client_model,
                       parser=get_parser(policy.tool_parser, [tool_to_openai(t) for t in req.tools]),
                       split_think=field_ in ("auto", "inline"), stop=req.stop,
                       sign=lambda text: services.reasoning.sign(text, ctx.ledger_id, ctx.owner),
                       reasoning_key=None if field_ == "auto" else field_,
                       on_parse_failure=lambda why: services.metrics.parse_failures.labels(policy.tool_parser).inc())
    ctx.headers = {"X-Request-Id": g.request_id}
    watch = request.environ.get("kimi.watch_hangup")  # the gevent server's; absent in tests
    if watch is not None:
        ctx.stop_watch = watch(ctx.cancel.cancel)
    if not req.stream:
        try:
            return _json(ctx)
        except UpstreamError as exc:  # the engine names its fields: say the client's
            raise client_fields.rename(exc, req)
        finally:
            ctx.stop_watch()
    try:
        stream = services.upstream.open_stream(ctx.payload, ctx.headers, cancel=ctx.cancel)
    except BaseException as exc:  # raised before any byte is sent
        ctx.stop_watch()
        raise client_fields.rename(exc, req) if isinstance(exc, UpstreamError) else exc
    return Response(_encoded(ctx, stream, _frames(ctx, stream)),
                    headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
                             "X-Accel-Buffering": "no", "X-Kimi-Preset": policy.preset})


def _json(ctx: Context) -> Response:
    services, started = ctx.services, time.monotonic()
    body = services.upstream.chat(ctx.payload, ctx.headers, cancel=ctx.cancel)
    services.metrics.upstream_latency.labels(ctx.route).observe(time.monotonic() - started)
    ctx.upstream_response = body
    end = None
    for ev in Pipeline(ctx.opts).run(chunks_from_json(body)):
        end = ev if isinstance(ev, c.StreamEnd) else end
    services.record_turn(ctx.ledger_id, end.response, lambda: _conversation_key(ctx), ctx.owner)
    ctx.frames = ctx.dialect.render_response(ctx.turn, ctx.req, end.response, ctx.policy)
    ctx.dialect.complete(ctx)
    response = current_app.response_class(sse.dumps(ctx.frames), mimetype="application/json")
    response.call_on_close(lambda: ctx.services.done(ctx))  # the log line and cassette once
    return response                                         # the body is written (~30 us)


def _frames(ctx: Context, stream):
    def recorded(chunks):
        for chunk in chunks:
            if ctx.is_recording:
                ctx.chunks.append(chunk)
            yield chunk

    def finished(events):
        for ev in events:
            if ctx.first_token is None and isinstance(ev, (c.TextDelta, c.ReasoningDelta, c.ToolCallStart)):
                ctx.first_token = time.monotonic()  # the first model token the client can see
                ctx.services.metrics.ttft.labels(ctx.route).observe(ctx.first_token - ctx.started)
            if isinstance(ev, c.StreamEnd):
                ctx.services.record_turn(ctx.ledger_id, ev.response, lambda: _conversation_key(ctx), ctx.owner)
            yield ev

    events = finished(Pipeline(ctx.opts).run(recorded(stream)))
    if not ctx.dialect.INTERLEAVED_CALLS:
        events = one_call_at_a_time(events)
    interval = current_app.config["PING_INTERVAL_S"]  # 0 turns keep-alives off
    if interval and ctx.policy.ping_interval_s:
        interval = min(interval, ctx.policy.ping_interval_s)
    return ctx.dialect.stream(ctx.turn, ctx.req, with_keepalive(events, interval), ctx.policy)


def _conversation_key(ctx: Context):
    return ctx.conversation.before(len(ctx.req.messages))


def _done(ctx: Context) -> None:
    """The dialect keeps what it keeps (a stored Response), then the log line and the cassette."""
    ctx.dialect.complete(ctx)
    ctx.services.done(ctx)


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


def _encoded(ctx: Context, stream, frames):
    error = None
    try:
        for frame in frames:
            data = _encode(frame)
            if ctx.is_recording:
                ctx.frames.append(data)
            yield data
    except GeneratorExit:
        ctx.status = 499
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes an in-stream error
        if ctx.cancel.is_cancelled:  # the client left: nobody to tell
            ctx.status = 499
            return
        error = from_exception(exc)
        ctx.status = error.status
        log.warning("stream %s failed: %s", ctx.request_id, error.message)
        ctx.services.metrics.stream_errors.labels(ctx.route).inc()
        for frame in ctx.dialect.stream_error(ctx.turn, error):
            data = _encode(frame)
            if ctx.is_recording:
                ctx.frames.append(data)
            yield data
    finally:
        ctx.stop_watch()
        stream.close()
        ctx.services.metrics.upstream_latency.labels(ctx.route).observe(time.monotonic() - ctx.started)
        _done(ctx)


def _encode(frame) -> bytes:
    if frame is d.KEEPALIVE:
        return sse.COMMENT_KEEPALIVE
    if frame is d.DONE:
        return sse.encode_done()
    return sse.encode(*frame)


def _note_dropped_tools(ctx: Context) -> None:
    """Hosted tools run at the vendor: left out, never rejected (that would break the client)."""
    dropped = ctx.req.dropped_tools
    for kind in dropped:
        ctx.services.metrics.dropped_tools.labels(ctx.dialect.NAME, tool_type_label(kind)).inc()
    if dropped:  # the client's strings: repr'd (no raw CR/LF in the log), cut short, few
        shown = [kind[:LOGGED_TYPE_CHARS] for kind in dropped[:LOGGED_TYPES]]
        more = f" and {len(dropped) - LOGGED_TYPES} more" if len(dropped) > LOGGED_TYPES else ""
        log.info("hosted tools left out (the engine cannot run them): %r%s", shown, more)
