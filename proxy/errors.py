"""One exception family, with an HTTP status and an error type; rendered once per dialect.

Error types follow the OpenAI/Anthropic public sets:
  invalid_request_error 400, authentication_error 401, permission_error 403,
  not_found_error 404, request_too_large 413, rate_limit_error 429,
  api_error 500/502, overloaded_error 503 (Anthropic) / service_unavailable (OpenAI).
OpenAI bodies carry `code` too: the type, or a finer code (context_length_exceeded,
rate_limit_exceeded) when the error has one.
"""
from __future__ import annotations


class ProxyError(Exception):
    status, type = 500, "api_error"
    code: str | None = None   # OpenAI's `code` when it says more than the type (context_length_exceeded)
    headers: dict = {}

    def __init__(self, message: str, *, param: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if status is not None:
            self.status = status


class InvalidRequest(ProxyError):
    status, type = 400, "invalid_request_error"


class AuthError(ProxyError):
    status, type = 401, "authentication_error"


class Forbidden(ProxyError):
    status, type = 403, "permission_error"


class NotFound(ProxyError):
    status, type = 404, "not_found_error"


class MethodNotAllowed(ProxyError):
    status, type = 405, "invalid_request_error"


class TooLarge(ProxyError):
    """Connection: close, so the server drains a bounded part of the body, not all of it."""
    status, type = 413, "request_too_large"
    headers = {"Connection": "close"}


class RateLimited(ProxyError):
    status, type = 429, "rate_limit_error"
    code = "rate_limit_exceeded"


class ClientGone(ProxyError):
    """The client closed its connection; nobody reads this answer (logged as 499)."""
    status, type = 499, "api_error"


class UpstreamError(ProxyError):
    """The upstream answered with an error status (carried through) or a bad body."""
    status, type = 502, "api_error"


class ContextTooLong(UpstreamError):
    """The upstream refused a prompt longer than its context (code context_length_exceeded).
    ``tokens`` (asked) and ``maximum`` (the context) when the upstream's message names them.

    On a later turn the Anthropic dialect leads with "prompt is too long: N tokens > M
    maximum", the wording Claude Code reads to compact its history. A first turn that does not
    fit cannot be compacted (``is_first_turn``, set by the route): its message leads with what
    to serve instead, which Claude Code then prints as it is."""
    status, type = 400, "invalid_request_error"
    code = "context_length_exceeded"
    is_first_turn = False

    def __init__(self, message: str, *, tokens: int | None = None, maximum: int | None = None):
        super().__init__(message)
        self.tokens, self.maximum = tokens, maximum


class UpstreamUnavailable(ProxyError):
    """The upstream cannot be reached: 503 plus Retry-After."""
    status, type = 503, "overloaded_error"

    def __init__(self, message: str, retry_after: int | str = 1):
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after)}


class UpstreamTimeout(UpstreamUnavailable):
    status = 504


def openai_type(err: ProxyError) -> str:
    """OpenAI names for the types that differ from Anthropic's."""
    return {"overloaded_error": "service_unavailable", "not_found_error": "not_found_error",
            "request_too_large": "invalid_request_error",
            "rate_limit_error": "rate_limit_exceeded"}.get(err.type, err.type)


def openai_code(err: ProxyError) -> str:
    return err.code or openai_type(err)


def anthropic_body(err: ProxyError) -> dict:
    message = err.message
    if isinstance(err, ContextTooLong) and err.tokens and err.maximum and not err.is_first_turn:
        message = f"prompt is too long: {err.tokens} tokens > {err.maximum} maximum. {message}"
    return {"type": "error", "error": {"type": err.type, "message": message}}


def openai_body(err: ProxyError) -> dict:
    return {"error": {"message": err.message, "type": openai_type(err), "param": err.param,
                      "code": openai_code(err)}}


NESTED_TOO_DEEPLY = "request body is nested too deeply"


def from_exception(exc: BaseException) -> ProxyError:
    """Any exception as a ProxyError (unexpected ones become a 500 without a traceback).
    A RecursionError comes from a body nested deeper than the stack: the client's error."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, RecursionError):
        return InvalidRequest(NESTED_TOO_DEEPLY)
    return ProxyError(f"internal error: {type(exc).__name__}: {exc}")
