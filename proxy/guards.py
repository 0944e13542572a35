"""Before every request: a request id, Host/Origin checks, a browser's CORS preflight, the
API key; after it, CORS headers for an allowed origin. And the one place errors are
rendered: by the dialect of the route that failed (its `render_error`)."""
from __future__ import annotations

import hmac
import logging
import re
import secrets

from flask import Flask, current_app, g, request
from werkzeug.exceptions import HTTPException

from proxy import config as config_mod
from proxy.state.store import owner_of
from proxy.errors import (NESTED_TOO_DEEPLY, AuthError, ContextTooLong, Forbidden,
                          MethodNotAllowed, NotFound, ProxyError, TooLarge, anthropic_body,
                          from_exception, openai_body)

log = logging.getLogger("kimi.proxy")
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
OPEN_PATHS = ("/health",)
CORS_METHODS = "GET, POST, DELETE, OPTIONS"
CORS_EXPOSED = "X-Request-Id, X-Kimi-Preset, Retry-After"
CORS_MAX_AGE_S = "600"
HEADER_NAMES = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+(?:[ \t]*,[ \t]*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*$")


def init_app(app: Flask, dialect_of) -> None:
    """dialect_of() names the dialect module of the request's route, or None (no dialect)."""
    app.extensions["kimi.dialect_of"] = dialect_of
    app.before_request(_request_id)
    app.before_request(_host_and_origin)
    app.before_request(_preflight)  # before the key: a browser sends its preflight without one
    app.before_request(_api_key)
    app.after_request(_echo_request_id)
    app.after_request(_cors)
    app.register_error_handler(ProxyError, render_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(RecursionError, _too_deep)
    app.register_error_handler(Exception, _unexpected)


def _routeless_body(err: ProxyError) -> dict:
    """The error body of a route no dialect owns (/health, /v1/models, 404s, 405s): Anthropic's
    shape on a /messages path and for the Anthropic models list, OpenAI's elsewhere."""
    is_anthropic = "/messages" in request.path or (
        re.match(r"^(?:/v1)?/models(?:/|$)", request.path) is not None
        and "anthropic-version" in request.headers)
    return anthropic_body(err) if is_anthropic else openai_body(err)


def render_error(err: ProxyError):
    ctx = g.get("context")
    if isinstance(err, ContextTooLong) and ctx is not None:  # compactable only after a reply
        err.is_first_turn = not any(m.role == "assistant" for m in ctx.req.messages)
    dialect = current_app.extensions["kimi.dialect_of"]()
    body = dialect.render_error(err) if dialect is not None else _routeless_body(err)
    resp = current_app.response_class(current_app.json.dumps(body), status=err.status,
                                      mimetype="application/json")
    for key, value in err.headers.items():
        resp.headers[key] = value
    if ctx is not None:
        ctx.status = err.status
        current_app.extensions["kimi"].log_request(ctx)
    return resp


def _http_error(exc: HTTPException):
    kinds = {404: NotFound, 405: MethodNotAllowed, 413: TooLarge}
    cls = kinds.get(exc.code)
    if cls is None:
        return render_error(ProxyError(exc.description or exc.name, status=exc.code or 500))
    message = {404: f"no route for {request.method} {request.path}",
               405: f"{request.method} is not allowed on {request.path}",
               413: f"request body is larger than {current_app.config['MAX_BODY_BYTES']} bytes"}[exc.code]
    return render_error(cls(message))


def _too_deep(exc: RecursionError):
    """A body that parsed but nests too deeply for a later step: a 400, not a traceback."""
    log.warning("%s %s: %s", g.get("request_id", "-"), request.path, NESTED_TOO_DEEPLY)
    return render_error(from_exception(exc))


def _unexpected(exc: Exception):
    log.exception("unexpected error on %s", request.path)
    return render_error(from_exception(exc))


def _request_id():
    given = request.headers.get("x-request-id", "")
    g.request_id = given if REQUEST_ID.match(given) else secrets.token_hex(16)  # uuid4().hex's shape, 4 us less


def _echo_request_id(resp):
    resp.headers["X-Request-Id"] = g.get("request_id", "")
    return resp


def _host_and_origin():
    cfg = current_app.config
    host = request.host or ""
    if not config_mod.is_loopback_host(host) and host.split(":")[0] not in cfg["ALLOW_HOST"] \
            and not cfg.get("API_KEY"):
        raise Forbidden(f"Host {host!r} is not a loopback name; allow it with the allow-host config key, or require a key (KIMI_PROXY_API_KEY)")
    origin = request.headers.get("Origin")
    if origin and origin not in cfg["ALLOW_ORIGIN"]:
        raise Forbidden(f"requests from browser origin {origin!r} are refused; allow it with the allow-origin config key")


def _preflight():
    """A browser's CORS preflight (OPTIONS with Access-Control-Request-Method) from an origin
    that _host_and_origin admitted: 204 with the methods, and the headers it asked for."""
    if request.method != "OPTIONS" or not request.headers.get("Origin") \
            or "Access-Control-Request-Method" not in request.headers:
        return None
    resp = current_app.response_class(status=204)
    resp.headers["Access-Control-Allow-Methods"] = CORS_METHODS
    asked = request.headers.get("Access-Control-Request-Headers", "").strip()
    if HEADER_NAMES.match(asked):
        resp.headers["Access-Control-Allow-Headers"] = asked
    resp.headers["Access-Control-Max-Age"] = CORS_MAX_AGE_S
    return resp


def _cors(resp):
    """Every answer, errors included, lets an allowed origin read it; caches key on Origin."""
    allowed = current_app.config["ALLOW_ORIGIN"]
    if not allowed:
        return resp
    resp.vary.add("Origin")
    origin = request.headers.get("Origin")
    if origin in allowed:
        resp.headers["Access-Control-Allow-Origin"] = origin
        resp.headers["Access-Control-Expose-Headers"] = CORS_EXPOSED
    return resp


def _api_key():
    key = current_app.config.get("API_KEY")
    if not key or request.path in OPEN_PATHS:
        return
    if not is_authorized(key):
        raise AuthError("missing or invalid API key (send Authorization: Bearer KEY or x-api-key: KEY)")


def is_authorized(key: str | None) -> bool:
    if not key:
        return True
    return hmac.compare_digest(presented_key().encode(), key.encode())


def presented_key() -> str:
    """The key this request sent (Authorization: Bearer, else x-api-key); "" for none."""
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")


def key_owner() -> str:
    """Who owns what this request stores and may read back (stored Responses, the reasoning
    ledger): a hash of the key it presented, whether or not the proxy requires one."""
    return owner_of(presented_key())
