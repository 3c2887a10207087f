"""Errors that already know their HTTP answer.

Every error the frontend raises on purpose derives from :class:`FrontendError`.
Each class carries the HTTP status and the OpenAI ``error.type`` it maps to, so
``api/`` turns any of them into a response without inspecting messages::

    FrontendError (500 internal_error)
    ├── RequestError (400 invalid_request_error)     -- also a ValueError
    │   ├── FormatError                              -- messages the format cannot render or parse
    │   ├── ContextLengthError (code context_length_exceeded)
    │   ├── UnsupportedFeatureError                  -- valid request, but this engine/model cannot honour it
    │   └── EngineRejectedRequestError (engine's 4xx)  -- the worker refused it: not retried, worker unharmed
    ├── AuthenticationError (401 authentication_error)
    ├── ModelNotFoundError (404 not_found_error)
    ├── PayloadTooLargeError (413 invalid_request_error)
    ├── RequestTimeoutError (408 invalid_request_error)  -- the client sent its body too slowly
    │   └── DeadlineExceededError (code deadline_exceeded) -- the request's own time budget ran out
    ├── OverloadedError (429 rate_limit_error)           -- admission control: retry after ``retry_after_s``
    ├── UnsupportedModelError (400 invalid_request_error) -- detected a family without an encoder
    ├── StoreUnavailableError (503 service_unavailable) -- the state store cannot be read or written
    │                                                     (disk full, locked, read-only, database down)
    ├── StoreBudgetError (413 invalid_request_error)     -- one object larger than the store's whole budget
    └── EngineError (502 engine_error)
        ├── EngineUnavailableError (503 service_unavailable) -- before the first token: retry elsewhere
        │   ├── WorkerSilentError                       -- no response headers in time: retry elsewhere
        │   └── NoHealthyWorkerError                    -- nothing left to retry on
        │       └── WorkersStartingError                -- no worker discovered yet (``Retry-After``)
        ├── EngineStreamError (502 engine_error)         -- after the first token: terminal for the request
        └── EngineTimeoutError (504 timeout_error)       -- the worker was too slow (first token, idle, total)

``param`` names the offending field with a JSON-path-like string (for example
``messages[3].tool_calls[0].function.arguments``) so a client can find it.

:class:`StartupError` is no HTTP answer: ``serve`` cannot start as configured, and says so in
one line naming what to fix (exit status 2).
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


class EngineRejectedRequestError(RequestError):
    """The engine worker refused the request as invalid: the client's error, not the worker's.

    Raised for an HTTP 4xx answer (429 excepted: that is the worker's load), for an in-stream
    error event whose ``code`` is below 500 or that says ``"retryable": false`` (the SGLang /
    vLLM shape ``{"error": {"message", "code", "retryable"}}``), and for SGLang's abort finish
    ``{"type": "abort", "status_code": 4xx}``. It is never retried on another worker and never
    counts against the worker's health. ``status_code`` is the engine's status (a 4xx, so the
    client sees what the engine said), ``message`` the engine's message prefixed with what
    rejected it.
    """

    code = "engine_rejected_request"

    def __init__(
        self, message: str, *, status_code: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, param=param, code=code)
        # an instance attribute shadows the class default; anything outside 4xx would
        # misreport a client error as a server one, so it falls back to 400
        self.status_code = status_code if 400 <= status_code < 500 and status_code != 429 else 400


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


class RequestTimeoutError(FrontendError):
    """The client did not send its request (headers or body) within the server's read timeout."""

    status_code = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class DeadlineExceededError(RequestTimeoutError):
    """The request's own time budget (``x-request-timeout-ms``, counted from its arrival) ran out
    before it was answered: still queued, waiting for its first token, or part-way through its
    answer (HTTP 408, or the API's error event once a stream has begun). The body was read whole,
    so the connection may carry another request."""

    code = "deadline_exceeded"


class OverloadedError(FrontendError):
    """Admission control refused the request: too many in flight and the queue is full (HTTP 429).

    ``retry_after_s`` is sent as the ``Retry-After`` header.
    """

    status_code = 429
    error_type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))


class KeyRateLimitError(OverloadedError):
    """The request's API key is past one of its limits (requests or tokens per minute, requests in
    flight): HTTP 429 with ``Retry-After`` and the protocol's rate-limit headers."""

    code = "rate_limit_exceeded"


class StoreUnavailableError(FrontendError):
    """The state store failed to read or write (its disk is full, its file locked or read-only, its
    database down or unreachable): the server's fault, HTTP 503 with ``Retry-After``.

    ``message`` says what failed in words a client may read (never a host, path or credential);
    the store logs the cause. ``retry_after_s`` is sent as ``Retry-After``."""

    status_code = 503
    error_type = "service_unavailable"
    code = "store_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))


class StoreBudgetError(FrontendError):
    """One object (a stored response, a conversation, kept reasoning) is larger than the state
    store's whole size budget (``--state-max-bytes``): it cannot be kept whatever is evicted
    (HTTP 413; sent with ``store: false`` it is not stored and works)."""

    status_code = 413
    error_type = "invalid_request_error"
    code = "store_budget_exceeded"


class EngineError(FrontendError):
    """An engine worker misbehaved. Base of the engine failure tree."""

    status_code = 502
    error_type = "engine_error"


class EngineUnavailableError(EngineError):
    """The worker failed before producing the first token: safe to retry on another worker."""

    status_code = 503
    error_type = "service_unavailable"


class WorkerSilentError(EngineUnavailableError):
    """The worker took the request but sent no response headers in time.

    SGLang and vLLM send the headers of a streamed generate before the prefill starts, so a worker
    that stays silent is not computing: it is wedged (or its HTTP server is). The pool ejects it
    and moves the requests still waiting on it to other workers.
    """


class NoHealthyWorkerError(EngineUnavailableError):
    """No worker is healthy (or all retries were used)."""


class WorkersStartingError(NoHealthyWorkerError):
    """No worker has answered its capability discovery yet (the server is starting): retry after
    ``retry_after_s`` (sent as ``Retry-After``)."""

    def __init__(self, message: str, *, retry_after_s: int = 2) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))


class EngineStreamError(EngineError):
    """The worker failed after tokens were already streamed: the request cannot be retried."""


class EngineTimeoutError(EngineError):
    """A worker missed a deadline: first token, idle time between tokens, or the whole request (HTTP 504).

    The engine request is aborted and the worker is charged a failure. Not retried: a first-token
    timeout already spent the client's patience on one worker.
    """

    status_code = 504
    error_type = "timeout_error"


class StartupError(Exception):
    """``serve`` cannot start as configured. ``str()`` is one line naming what to fix (a flag, a
    file, a worker, a service), printed as ``deepseek-frontend serve: <line>`` before exit status 2."""

    @classmethod
    def because(cls, what: str, exc: BaseException) -> StartupError:
        """``what`` (the step and the flag it comes from) failed with ``exc``: ``"<what>: <cause>"``
        on one line (:func:`describe`)."""
        return cls(f"{what}: {describe(exc)}")


def describe(exc: BaseException) -> str:
    """``exc`` as one line (whitespace folded): its message, after its type's name unless the
    message is meant to be read alone -- a :class:`StartupError`, a :class:`FrontendError`, a
    ``ValueError`` or ``RuntimeError`` (the library's words for a bad value), a bare ``Exception``
    -- so ``ConnectionRefusedError: [Errno 111] Connection refused`` keeps what it is."""
    text = " ".join(str(exc).split())
    plain = (
        isinstance(exc, StartupError | FrontendError | ValueError | RuntimeError) or type(exc) is Exception
    )
    if plain:
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
