"""API keys at the edge: which tenant a request comes from, before anything else runs.

With keys configured (``--api-key``, ``--keys-file``, or ``keys:`` in ``--config``), every route
except ``/health``, ``/live`` and ``/metrics`` (probes and scrapers carry no key) needs one, sent
as ``Authorization: Bearer KEY`` or ``x-api-key: KEY`` -- one key, presented unambiguously
(:func:`presented_key` states the rule; docs/serving.md, "API keys"). The key is checked against the server's
current :class:`~deepseek_frontend.keys.tenants.TenantTable` (read per request, so a reload's keys
apply to the next request) by its SHA-256 digest in constant time; the request then carries its
``Tenant`` (``scope["state"]["tenant"]``) and, for its log line, the tenant's name -- never the key.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from deepseek_frontend.errors import AuthenticationError

from .context import FrontendState, new_request_id
from .errors import error_response, shape_for
from .tracking import log_request_done

#: Paths that never require the API key.
PUBLIC_PATHS = frozenset({"/health", "/live", "/metrics"})


class AmbiguousCredentialsError(AuthenticationError):
    """A request whose credential headers do not name exactly one key (401, naming why)."""


def presented_key(headers: Any) -> bytes | None:
    """The one key a request presents, or None when it sends no credential header.

    The rule, the same wherever a key is read (the auth middleware, the owner of stored objects,
    ``/health``'s details): a key comes in ``Authorization: Bearer KEY`` or ``x-api-key: KEY``.
    A header sent twice with the same value counts once. Raises :class:`AmbiguousCredentialsError`
    when the headers name no single key: an ``Authorization`` header that is not ``Bearer`` and a
    token (empty, another scheme, a token with spaces), an empty ``x-api-key``, one header sent
    twice with different values, or both headers with different keys. No credential is ever
    silently preferred over another: which one a client meant is not ours to guess.

    ``headers`` is the ASGI scope's list of (name, value) byte pairs (names lower-case)."""
    bearer: bytes | None = None
    api_key: bytes | None = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            token = token.strip()
            if scheme.lower() != b"bearer" or not token or b" " in token or b"\t" in token:
                raise AmbiguousCredentialsError(
                    "Malformed Authorization header: expected 'Authorization: Bearer KEY'"
                )
            if bearer is not None and token != bearer:
                raise AmbiguousCredentialsError("Several Authorization headers with different keys")
            bearer = token
        elif name == b"x-api-key":
            key = value.strip()
            if not key:
                raise AmbiguousCredentialsError("Empty x-api-key header")
            if api_key is not None and key != api_key:
                raise AmbiguousCredentialsError("Several x-api-key headers with different keys")
            api_key = key
    if bearer is not None and api_key is not None and bearer != api_key:
        raise AmbiguousCredentialsError(
            "Authorization and x-api-key carry different keys: send one key, in one of them"
        )
    return bearer if bearer is not None else api_key


class AuthMiddleware:
    """Pure-ASGI API key check (no per-request task or body wrapping, unlike BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp, state: FrontendState, endpoints: frozenset[str] = frozenset()) -> None:
        self.app = app
        self._state = state
        #: paths counted under their own name; any other path is counted as "other" (bounded labels)
        self._endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        state = self._state
        tenants = state.tenants
        if tenants is None:
            await self.app(scope, receive, send)
            return
        try:
            presented = presented_key(scope["headers"])
        except AmbiguousCredentialsError as exc:
            presented, message = None, exc.message
        else:
            message = "Missing API key" if presented is None else "Incorrect API key provided"
        tenant = tenants.authenticate(presented) if presented is not None else None
        if tenant is not None:
            request_state = scope.setdefault("state", {})
            request_state["tenant"] = tenant
            request_state["api_key_name"] = tenant.name
            await self.app(scope, receive, send)
            return
        err = AuthenticationError(
            f"{message}: send one key, as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
        )
        path = scope["path"]
        response = error_response(err, shape_for(path, state.api_shapes).error_body)
        # A refused request is counted and logged like any other (the key itself never is).
        endpoint = path if path in self._endpoints else "other"
        state.metrics.requests.labels(endpoint, str(err.status_code), err.error_type).inc()
        log_request_done(new_request_id("auth"), endpoint, err.status_code, err.error_type, err.message, 0.0)
        await response(scope, receive, send)
