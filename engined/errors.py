"""One exception family for everything a request can get wrong, rendered once at the edge.

Each class carries its HTTP status and OpenAI error type; `body()` is the OpenAI envelope
`{"error": {"message", "type", "param", "code"}}`.
"""


class EngineError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


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


class InternalError(EngineError):
    status = 500
    type = "server_error"
    code = "internal_error"
