"""One exception family for everything a request can get wrong, rendered once at the edge.

Each class carries its HTTP status and OpenAI error type; `body()` is the OpenAI envelope
`{"error": {"message", "type", "param", "code"}}`.
"""


class EngineError(Exception):
    status, type = 500, "server_error"
    code: str | None = None
    retry_after_s: int | None = None  # sent as Retry-After when set

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class InvalidRequest(EngineError):
    status, type = 400, "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class PayloadTooLarge(EngineError):
    status, type, code = 413, "invalid_request_error", "payload_too_large"


class NotFound(EngineError):
    status, type, code = 404, "not_found_error", "not_found"


class MethodNotAllowed(EngineError):
    status, type, code = 405, "invalid_request_error", "method_not_allowed"


class Unavailable(EngineError):
    """The engine is shutting down and takes no new work."""
    status, type, code = 503, "server_error", "unavailable"


class QueueFull(EngineError):
    """--max-queue requests are already waiting: come back later."""
    # the type as the proxy's OpenAI dialect names a 429
    status, type, code = 429, "rate_limit_exceeded", "rate_limit_exceeded"
    retry_after_s = 5


class TooManyConnections(Unavailable):
    """--max-connections connections are open and none of them is idle."""
    code = "too_many_connections"
    retry_after_s = 1


class QueueTimeout(Unavailable):
    """The request waited --queue-timeout-s without starting; it was taken off the queue."""
    code = "queue_timeout"
    retry_after_s = 5


class InternalError(EngineError):
    status, type, code = 500, "server_error", "internal_error"
