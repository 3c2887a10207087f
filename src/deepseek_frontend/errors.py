"""Errors that already know their HTTP answer.

Every error the frontend raises on purpose derives from :class:`FrontendError`.
Each class carries the HTTP status and the OpenAI ``error.type`` it maps to, so
``api/`` turns any of them into a response without inspecting messages::

    FrontendError (500 internal_error)
    ├── RequestError (400 invalid_request_error)     -- also a ValueError
    │   ├── FormatError                              -- messages the format cannot render or parse
    │   ├── ContextLengthError (code context_length_exceeded)
    │   └── UnsupportedFeatureError                  -- valid request, but this engine/model cannot honour it
    ├── AuthenticationError (401 authentication_error)
    ├── ModelNotFoundError (404 not_found_error)
    ├── PayloadTooLargeError (413 invalid_request_error)
    ├── UnsupportedModelError (400 invalid_request_error) -- detected a family without an encoder
    └── EngineError (502 engine_error)
        ├── EngineUnavailableError (503 service_unavailable) -- before the first token: retry elsewhere
        │   └── NoHealthyWorkerError                    -- nothing left to retry on
        └── EngineStreamError (502 engine_error)         -- after the first token: terminal for the request

``param`` names the offending field with a JSON-path-like string (for example
``messages[3].tool_calls[0].function.arguments``) so a client can find it.
"""

from __future__ import annotations


class FrontendError(Exception):
    """Base class. ``status_code`` and ``error_type`` decide the HTTP answer."""

    status_code: int = 500
    error_type: str = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, param={self.param!r})"


class RequestError(FrontendError, ValueError):
    """The request is malformed or asks for something impossible (HTTP 400)."""

    status_code = 400
    error_type = "invalid_request_error"


class FormatError(RequestError):
    """The chat format cannot render these messages, or cannot parse a completion.

    The message names the message index and field at fault, e.g.
    ``messages[2].tool_calls[0].function.arguments: expected a JSON object``.
    """


class ContextLengthError(RequestError):
    """Prompt tokens plus requested output tokens exceed the model's context."""

    code = "context_length_exceeded"


class UnsupportedFeatureError(RequestError):
    """A valid request that this engine or model cannot honour (for example a
    constrained ``tool_choice`` on an engine without grammar support)."""


class UnsupportedModelError(RequestError):
    """The model family was detected but this frontend has no encoder for it."""


class AuthenticationError(FrontendError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFoundError(FrontendError):
    status_code = 404
    error_type = "not_found_error"
    code = "model_not_found"


class PayloadTooLargeError(FrontendError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class EngineError(FrontendError):
    """An engine worker misbehaved. Base of the engine failure tree."""

    status_code = 502
    error_type = "engine_error"


class EngineUnavailableError(EngineError):
    """The worker failed before producing the first token: safe to retry on another worker."""

    status_code = 503
    error_type = "service_unavailable"


class NoHealthyWorkerError(EngineUnavailableError):
    """No worker is healthy (or all retries were used)."""


class EngineStreamError(EngineError):
    """The worker failed after tokens were already streamed: the request cannot be retried."""
