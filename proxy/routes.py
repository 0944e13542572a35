"""HTTP routes. Views parse the body, pick the policy and hand over to the handler."""
from __future__ import annotations

import functools
import json
import logging
import re
import time

from flask import Blueprint, current_app, g, request

from proxy import fastjson, handler
from proxy.clients import policy as policy_mod
from proxy.dialects import anthropic, openai_chat, openai_responses, responses_state
from proxy.errors import NESTED_TOO_DEEPLY, InvalidRequest, TooLarge
from proxy.guards import is_authorized, key_owner
from proxy.upstream.payload import build_payload

bp = Blueprint("kimi", __name__)
log = logging.getLogger("kimi.proxy")
# The model routes, each POST at /v1/PATH and /PATH: view name, PATH, dialect, handler route.
# responses/compact is Codex's remote compaction (proxy/dialects/responses_compact.py).
MODEL_ROUTES = [("chat_completions", "chat/completions", openai_chat, "chat"),
                ("messages", "messages", anthropic, "messages"),
                ("responses", "responses", openai_responses, "responses"),
                ("responses_compact", "responses/compact", openai_responses, "responses_compact")]
DIALECT_OF_VIEW = {**{view: dialect for view, _, dialect, _ in MODEL_ROUTES},
                   "count_tokens": anthropic, "get_response": openai_responses,
                   "delete_response": openai_responses, "list_input_items": openai_responses}
# the others belong to no dialect


def request_dialect():
    """The dialect module of the route this request matched, or None."""
    endpoint = request.endpoint or ""
    return DIALECT_OF_VIEW.get(endpoint.removeprefix(bp.name + "."))


SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \ud800-\udfff, in JSON's own escapes


def read_body() -> bytes:
    """The request body; 413 past the limit. A chunked body has no Content-Length for
    Flask to check, and its stream stops silently at the limit: one more byte tells."""
    raw = request.get_data(cache=False)
    limit = current_app.config["MAX_BODY_BYTES"]
    if request.content_length is None and len(raw) >= limit and request.environ["wsgi.input"].read(1):
        raise TooLarge(f"request body is larger than {limit} bytes")
    return raw


def json_body():
    raw = read_body()
    if not raw.strip():
        raise InvalidRequest("request body is empty; send a JSON object")
    try:
        body = fastjson.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"invalid JSON body: {exc}") from None
    except RecursionError:
        raise InvalidRequest(NESTED_TOO_DEEPLY) from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, got {type(body).__name__}")
    if (b"\\ud" in raw or b"\\uD" in raw) and SURROGATE_ESCAPE.search(raw) and not fastjson.is_utf8(body):
        raise InvalidRequest("invalid JSON body: a string holds an unpaired surrogate escape "
                             "(\\ud800-\\udfff); text must be valid Unicode")
    return body


def _model_request(dialect, route: str):
    body = json_body()
    policy = policy_mod.resolve(current_app.config, dialect.NAME, request.path, request.headers, body)
    info = None  # for a cassette only: the headers' copy and full_path cost microseconds
    if current_app.extensions["kimi"].recorder is not None:
        info = {"path": request.full_path.rstrip("?"), "headers": dict(request.headers), "body": body}
    return handler.run(dialect, policy, body, route, info)


def _add_model_route(view: str, path: str, dialect, route: str):
    model_view = functools.partial(_model_request, dialect, route)
    for prefix in ("/v1/", "/"):
        bp.add_url_rule(prefix + path, view, model_view, methods=["POST"])


for _row in MODEL_ROUTES:
    _add_model_route(*_row)


@bp.get("/v1/responses/<response_id>")
def get_response(response_id: str):
    return responses_state.stored(current_app.extensions["kimi"], response_id, key_owner())


@bp.get("/v1/responses/<response_id>/input_items")
def list_input_items(response_id: str):
    return responses_state.input_items(current_app.extensions["kimi"], response_id, key_owner(),
                                       request.args)


@bp.delete("/v1/responses/<response_id>")
def delete_response(response_id: str):
    return responses_state.delete_stored(current_app.extensions["kimi"], response_id, key_owner())


@bp.post("/v1/messages/count_tokens")
@bp.post("/messages/count_tokens")
def count_tokens():
    body = json_body()
    policy = policy_mod.resolve(current_app.config, "anthropic", "/v1/messages", request.headers, body)
    req = anthropic.parse_request({**body, "max_tokens": body.get("max_tokens") or 1}, policy)
    if not any(m.role != "system" for m in req.messages):
        raise InvalidRequest("there is nothing to count: send at least one message in `messages`")
    services = current_app.extensions["kimi"]
    req = services.sendable(req)  # counted as it will be sent
    payload = build_payload(req, model=current_app.config["MODEL"] or req.model,
                            reasoning_field=current_app.config["REASONING_FIELD"])
    count = services.upstream.tokenize(payload["messages"], payload.get("tools"), payload["model"])
    if count is None:
        count = max(1, len(json.dumps(payload["messages"]) + json.dumps(payload.get("tools", []))) // 4)
        log.warning("%s count_tokens: upstream has no /tokenize; returned an ESTIMATE of %d",
                    g.request_id, count)
    return {"input_tokens": count}


@bp.get("/v1/models")
@bp.get("/models")
def models():
    is_anthropic = "anthropic-version" in request.headers
    policy = policy_mod.resolve(current_app.config, "anthropic" if is_anthropic else "openai_chat",
                                "/v1/models", request.headers, None)
    names = list(dict.fromkeys([current_app.config["MODEL"] or "kimi-local", *policy.models]))
    data = [_model_card(n, is_anthropic) for n in names]
    if is_anthropic:
        return {"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
    return {"object": "list", "data": data}


@bp.get("/v1/models/<path:model_id>")
@bp.get("/models/<path:model_id>")
def model(model_id: str):
    """The SDKs' models.retrieve: any name is served (by the one upstream), as requests are."""
    return _model_card(model_id, "anthropic-version" in request.headers)


def _model_card(name: str, is_anthropic: bool) -> dict:
    if is_anthropic:
        return {"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "kimi-local"}


@bp.route("/", methods=["GET", "HEAD"])
def root():
    return {"name": "kimi-proxy", "routes": ["/v1/messages", "/v1/chat/completions", "/v1/responses"]}


@bp.get("/health")
def health():
    services = current_app.extensions["kimi"]
    is_ok, detail = services.upstream.health()
    body = {"status": "ok" if is_ok else "degraded"}
    if is_authorized(current_app.config.get("API_KEY")):
        body.update(upstream=services.upstream.url, engine=detail)
    return body, 200 if is_ok else 503


@bp.get("/metrics")
def metrics():
    services = current_app.extensions["kimi"]
    return current_app.response_class(services.metrics.render(), mimetype=services.metrics.content_type)
