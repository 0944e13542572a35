"""An upstream error status as the proxy's typed error, kind and Retry-After kept.

A context overflow is recognised from each server's own error, whatever its wording:

    kimi-engine, OpenAI  code context_length_exceeded: "This model's maximum context length is M
                         tokens. However, you requested N tokens (...)" / "your messages resulted
                         in [at least] N tokens"
    vLLM                 type BadRequestError, param input_tokens: "... maximum context length is
                         M tokens. However, [you requested K output tokens and] your prompt
                         contains at least N input tokens[, for a total of at least T tokens]",
                         "You passed N input tokens and requested K output tokens. However, the
                         model's context length is only M tokens"; param input_text when it
                         refused on characters; "max_tokens=K cannot be greater than
                         max_model_len=M" when the completion alone cannot fit
    SGLang               a flat body {"object": "error", "message", "type", "code"}: "The input
                         (N tokens) is longer than the model's context length (M tokens)",
                         "Requested token count exceeds the model's maximum context length of M
                         tokens. You requested a total of T tokens: ..."
    llama.cpp            type exceed_context_size_error, with n_prompt_tokens and n_ctx as fields
"""
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

OVERFLOW_PARAMS = ("input_tokens", "input_text")  # vLLM's param on a prompt it cannot take
_OVERFLOW = re.compile(r"maximum context length|longer than the model's context length|context length is only"
                       r"|cannot be greater than max_model_len=|exceeds the available context size"
                       r"|larger than the max context size")
_MAXIMUM = re.compile(r"(?:maximum context length is|maximum context length of|context length is only"
                      r"|context length \(|max_model_len=(?:[a-z_]+=)?|context size \()\s*(\d+)")
_ASKED = [re.compile(p) for p in (  # the first that matches: the total asked before the prompt alone
    r"for a total of (?:at least )?(\d+) tokens",
    r"You requested a total of (\d+) tokens",
    r"you requested (\d+) tokens",
    r"resulted in (?:at least )?(\d+) tokens",
    r"prompt contains (?:at least )?(\d+) input tokens",
    r"(?:The input|request|input) \((\d+) tokens\)")]
_PASSED = re.compile(r"You passed (\d+) input tokens and requested (\d+) output tokens")


def overflow_counts(detail: str, error: dict) -> tuple[int | None, int | None]:
    """(tokens asked, context) from an overflow error, each None when it is not named.
    llama.cpp's server names them as fields: n_prompt_tokens, n_ctx."""
    maximum = _MAXIMUM.search(detail)
    passed = _PASSED.search(detail)
    if passed:
        tokens = int(passed.group(1)) + int(passed.group(2))
    else:
        asked = next((m for m in (p.search(detail) for p in _ASKED) if m), None)
        tokens = int(asked.group(1)) if asked else error.get("n_prompt_tokens")
    limit = int(maximum.group(1)) if maximum else error.get("n_ctx")
    return (tokens if isinstance(tokens, int) else None), (limit if isinstance(limit, int) else None)


def is_overflow(status: int, error: dict, detail: str) -> bool:
    if error.get("code") == "context_length_exceeded" or error.get("type") == "exceed_context_size_error":
        return True
    return 400 <= status < 500 and status != 429 and (error.get("param") in OVERFLOW_PARAMS
                                                      or _OVERFLOW.search(detail) is not None)


def context_too_long(message: str, tokens: int | None, maximum: int | None) -> ContextTooLong:
    """The overflow error, with what to serve instead (and the context, unless it is named)."""
    named = "" if maximum and f"maximum context length is {maximum} tokens" in message else \
        f"this model's context is {maximum or 'only a few thousand'} tokens; "
    return ContextTooLong(f"{message} ({named}{LARGER_CONTEXT_HINT})", tokens=tokens, maximum=maximum)


def mark_turn(err: ProxyError, messages) -> ProxyError:
    """A first turn cannot be compacted: its overflow says what to serve instead."""
    if isinstance(err, ContextTooLong) and isinstance(messages, list):
        err.is_first_turn = not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)
    return err


def error_of(body) -> dict | None:
    """The error object of a body: OpenAI's {"error": {...}}, or SGLang's flat ErrorResponse."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if error is None and body.get("object") == "error":
        return body
    return error if isinstance(error, dict) else None


def status_error(status: int, body, headers: dict | None = None,
                 context: int | None = None) -> ProxyError:
    """The upstream's error status as the matching typed error: its status, its kind (rate
    limit, context overflow, ...) and its Retry-After."""
    error = error_of(body)
    if error is not None:
        detail = error.get("message") or json.dumps(error)
    else:
        detail = body if isinstance(body, str) else json.dumps(body)
    detail = str(detail)
    message = f"upstream returned {status}: {detail[:500]}"
    code = error.get("code") if error is not None and isinstance(error.get("code"), str) else None
    retry_after = (headers or {}).get("retry-after")
    if status == 429:
        err: ProxyError = RateLimited(message)
    elif status in (502, 503, 504):
        return UpstreamUnavailable(message, retry_after=retry_after or 1)
    elif is_overflow(status, error or {}, detail):
        tokens, maximum = overflow_counts(detail, error or {})
        err = context_too_long(message, tokens, maximum or context)
        err.status = status
    else:
        param = error.get("param") if error is not None else None
        err = UpstreamError(message, status=status, param=param if isinstance(param, str) else None)
        err.type = STATUS_ERRORS.get(status, (err.type,))[0]  # param: the field it refused
    err.code = code or err.code
    if retry_after:
        err.headers = {"Retry-After": retry_after}
    return err
