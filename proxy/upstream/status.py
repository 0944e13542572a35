"""An upstream error status as the proxy's typed error, kind and Retry-After kept."""
from __future__ import annotations

import json

from proxy.errors import ProxyError, RateLimited, UpstreamError, UpstreamUnavailable

LARGER_CONTEXT_HINT = ("Claude Code needs ~32k tokens and Codex ~10k: serve Kimi-Linear "
                       "(kimi-engine serve --model <kimi-linear dir> --max-context 32768) or put "
                       "kimi-proxy in front of a larger model (--upstream)")
STATUS_ERRORS = {400: ("invalid_request_error", None), 401: ("authentication_error", None),
                 403: ("permission_error", None), 404: ("not_found_error", None),
                 413: ("request_too_large", None), 422: ("invalid_request_error", None)}


def status_error(status: int, body, headers: dict | None = None,
                  context: int | None = None) -> ProxyError:
    """The upstream's error status as the matching typed error: its status, its kind (rate
    limit, context overflow, ...) and its Retry-After."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        detail = error.get("message") or json.dumps(error)
    else:
        detail = body if isinstance(body, str) else json.dumps(body)
    message = f"upstream returned {status}: {str(detail)[:500]}"
    code = error.get("code") if isinstance(error, dict) and isinstance(error.get("code"), str) else None
    retry_after = (headers or {}).get("retry-after")
    if status == 429:
        err: ProxyError = RateLimited(message)
    elif status in (502, 503, 504):
        return UpstreamUnavailable(message, retry_after=retry_after or 1)
    elif code == "context_length_exceeded":
        err = UpstreamError(f"{message} (this model's context is {context or 'only a few thousand'} "
                            f"tokens; {LARGER_CONTEXT_HINT})", status=status)
        err.type = "invalid_request_error"
    else:
        err = UpstreamError(message, status=status)
        err.type = STATUS_ERRORS.get(status, (err.type,))[0]
    err.code = code or err.code
    if retry_after:
        err.headers = {"Retry-After": retry_after}
    return err
