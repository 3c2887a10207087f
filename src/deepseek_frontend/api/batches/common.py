"""What the Files and Batch endpoints share: the store check, the key's limits, the completion
window, metadata and list parameters."""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request

from deepseek_frontend.api.validation import check_string
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.errors import FrontendError, RequestError
from deepseek_frontend.fleet.batch_config import BatchLimits

__all__ = [
    "MAX_WINDOW_S",
    "ActiveBatchesError",
    "batch_limits",
    "completion_window_seconds",
    "query_limit",
    "require_store",
]

#: the longest completion window (OpenAI's only one, and Anthropic's 24 hours)
MAX_WINDOW_S = 24 * 3600
_WINDOW = re.compile(r"([1-9][0-9]*)([smh])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


class ActiveBatchesError(FrontendError):
    """The API key has as many unfinished batches as it may (429: it may create one once one ends)."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "too_many_active_batches"


def require_store(ctx: RequestContext) -> None:
    """Files and batches live in the state store: a 400 on a stateless server."""
    if not ctx.store.enabled:
        raise RequestError(
            "files and batches need stored state; this server is stateless (--state-store none)"
        )


def batch_limits(ctx: RequestContext) -> BatchLimits:
    """The batch limits of the request's API key (its entry's, else the ``--batch-*`` flags')."""
    return ctx.state.config.server.batches.limits_for(ctx.tenant)


def completion_window_seconds(raw: Any) -> int:
    """``completion_window``: ``24h`` (OpenAI's only value) or a shorter ``<n>h`` / ``<n>m`` / ``<n>s``;
    its seconds. Lines not run within it are reported ``batch_expired`` and the batch ``expired``."""
    window = check_string(raw, "completion_window")
    match = _WINDOW.fullmatch(window)
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)] if match else 0
    if not 0 < seconds <= MAX_WINDOW_S:
        raise RequestError(
            f"completion_window: expected '24h' (or a shorter '<n>h', '<n>m' or '<n>s'), got {window!r}",
            param="completion_window",
        )
    return seconds


def query_limit(request: Request, name: str, default: int, most: int) -> int:
    """The integer query parameter ``name`` (``limit``), 1 to ``most``; 400 naming it otherwise."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise RequestError(f"{name}: expected an integer, got {raw!r}", param=name) from None
    if not 1 <= value <= most:
        raise RequestError(f"{name}: expected 1 to {most}, got {value}", param=name)
    return value
