"""One exception family for everything a request can get wrong, rendered once at the edge.

Each class carries its HTTP status and OpenAI error type; `body()` is the OpenAI envelope
`{"error": {"message", "type", "param", "code"}}`.
"""


class EngineError(Exception):
    status = 500
    type = "server_error"
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
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class PayloadTooLarge(EngineError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class NotFound(EngineError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class MethodNotAllowed(EngineError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class Unavailable(EngineError):
    """The engine is shutting down and takes no new work."""
    status = 503
    type = "server_error"
    code = "unavailable"


class QueueFull(EngineError):
    """--max-queue requests are already waiting: come back later."""
    status = 429
    type = "rate_limit_exceeded"  # as the proxy's OpenAI dialect names a 429
    code = "rate_limit_exceeded"
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
    status = 500
    type = "server_error"
    code = "internal_error"
