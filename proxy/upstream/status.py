"""An upstream error status as the proxy's typed error, kind and Retry-After kept."""
from __future__ import annotations

import json
import re

from proxy.errors import ContextTooLong, ProxyError, RateLimited, UpstreamError, UpstreamUnavailable

LARGER_CONTEXT_HINT = ("Claude Code needs ~32k tokens and Codex ~10k: serve Kimi-Linear "
                       "(kimi-engine serve --model <kimi-linear dir> --max-context 65536) or put "
                       "kimi-proxy in front of a larger model (--upstream)")
STATUS_ERRORS = {400: ("invalid_request_error", None), 401: ("authentication_error", None),
                 403: ("permission_error", None), 404: ("not_found_error", None),
                 413: ("request_too_large", None), 422: ("invalid_request_error", None)}


# How the upstreams word an overflow: kimi-engine and vLLM ("maximum context length is M tokens.
# However, you requested N tokens" / "your messages resulted in [at least] N tokens"), SGLang
# ("The input (N tokens) is longer than the model's context length (M tokens)"); llama.cpp's
# server says type exceed_context_size_error, with the counts as fields.
_MAXIMUM = re.compile(r"(?:maximum context length is|context length \()\s*(\d+)")
_ASKED = re.compile(r"(?:you requested|resulted in(?: at least)?|The input \()\s*(\d+) tokens")


def overflow_counts(detail: str, error: dict) -> tuple[int | None, int | None]:
    """(tokens asked, context) from an overflow error, each None when it is not named.
    llama.cpp's server names them as fields: n_prompt_tokens, n_ctx."""
    asked, maximum = _ASKED.search(detail), _MAXIMUM.search(detail)
    tokens = int(asked.group(1)) if asked else error.get("n_prompt_tokens")
    limit = int(maximum.group(1)) if maximum else error.get("n_ctx")
    return (tokens if isinstance(tokens, int) else None), (limit if isinstance(limit, int) else None)


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
    elif code == "context_length_exceeded" or (isinstance(error, dict)
                                                and error.get("type") == "exceed_context_size_error"):
        tokens, maximum = overflow_counts(str(detail), error if isinstance(error, dict) else {})
        err = ContextTooLong(f"{message} (this model's context is {context or 'only a few thousand'} "
                             f"tokens; {LARGER_CONTEXT_HINT})", tokens=tokens, maximum=maximum or context)
        err.status = status
    else:
        err = UpstreamError(message, status=status)
        err.type = STATUS_ERRORS.get(status, (err.type,))[0]
    err.code = code or err.code
    if retry_after:
        err.headers = {"Retry-After": retry_after}
    return err
