"""Per-request bookkeeping: the in-flight gauge, the request counter by status and error type,
the end-to-end latency, the API key's usage and limits, the request's span and its one
"request done" log line.

* :class:`RequestTracker` -- one per request, finished once (:meth:`RequestTracker.finish`).
* :class:`KeyCharge` -- what a request owes its API key, settled when its generation ends.
* :func:`log_request_done` -- the "request done" line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deepseek_frontend._tracing import RequestTrace
    from deepseek_frontend.fleet.metrics import FrontendMetrics, RequestFigures
    from deepseek_frontend.fleet.served_model import ServedModel
    from deepseek_frontend.keys.rate_limits import KeyUsageMetrics

log = logging.getLogger("deepseek_frontend.api")


class RequestTracker:
    """Per-request bookkeeping: in-flight gauge, status counter, e2e latency, one log line.

    ``finish`` is idempotent: the wrapper calls it for plain responses, a streaming
    response calls it when its body ends (``deferred`` set by the endpoint).
    """

    __slots__ = (
        "_done",
        "_release",
        "deferred",
        "endpoint",
        "grant",
        "key_name",
        "key_usage",
        "metrics",
        "model",
        "on_done",
        "request_id",
        "started",
        "stream_error",
        "stream_status",
        "trace",
    )

    def __init__(self, metrics: FrontendMetrics, endpoint: str, request_id: str) -> None:
        self.metrics = metrics
        self.endpoint = endpoint
        self.request_id = request_id
        self.started = time.perf_counter()
        self.deferred = False
        #: error type of an in-band error event a stream ended with ('' if none)
        self.stream_error = ""
        #: the status a stream that ended with an in-band error is counted and logged with: 200 (the
        #: response's own), or the error's where the stream failed for the server's own reason
        #: (a state store that could not be written: 503)
        self.stream_status = 200
        #: the API key's name in logs (api/logs.key_name), '' without API keys
        self.key_name = ""
        self._done = False
        #: gives the request's admission slot back (set once admitted)
        self._release: Callable[[], None] | None = None
        #: called once when the request is done (a large request's MemoryReleaser.finished)
        self.on_done: Callable[[], None] | None = None
        #: the request's spans (tracing on), ended by :meth:`finish`
        self.trace: RequestTrace | None = None
        #: the model the request was routed to (:meth:`route`)
        self.model: ServedModel | None = None
        #: the API key's rate-limit admission (rate_limits.Admitted), given back by :meth:`finish`
        self.grant: Any = None
        #: where the key's usage is counted (with API keys)
        self.key_usage: KeyUsageMetrics | None = None
        metrics.in_flight.labels(endpoint).inc()

    def release_with(self, release: Callable[[], None]) -> None:
        """Call ``release`` (the model's admission slot) when the request is done."""
        self._release = release

    def hand_over_admission(self) -> Callable[[], None] | None:
        """The request's admission slot, taken from the tracker (which then no longer gives it back):
        a background response holds it while its generation runs, after the request that queued
        it was answered, and calls the returned function once when it ends. None when the request
        holds no slot."""
        release, self._release = self._release, None
        return release

    def route(self, model: ServedModel) -> None:
        """The request goes to ``model``: from here on it is counted in that model's metrics."""
        if model.metrics is not self.metrics:
            self.metrics.in_flight.labels(self.endpoint).dec()
            self.metrics = model.metrics
            self.metrics.in_flight.labels(self.endpoint).inc()
        model.enter()
        self.model = model

    def finish(self, status: int, error_type: str = "", message: str = "") -> None:
        """Count the request by status and log its "request done" line (idempotent).

        ``message`` is the error message the client got (it names the field and what is
        wrong, never the API key or message contents), logged at the default level so an
        operator sees why a 4xx happened.
        """
        if self._done:
            return
        self._done = True
        release, self._release = self._release, None
        if release is not None:
            release()
        done, self.on_done = self.on_done, None
        if done is not None:
            done()
        m = self.metrics
        elapsed = time.perf_counter() - self.started
        m.in_flight.labels(self.endpoint).dec()
        m.requests.labels(self.endpoint, str(status), error_type).inc()
        m.e2e.observe(elapsed)
        figures = m.ledger.take(self.request_id)
        model, self.model = self.model, None
        if model is not None:
            model.leave()
        charge = self.hand_over_key_charge()
        if charge is not None:
            charge.settle(status, figures, model.name if model is not None else "")
        trace = self.trace
        if trace is not None:
            self.trace = None
            trace.finish(status, error_type, message, _span_figures(figures, self.key_name))
        log_request_done(
            self.request_id, self.endpoint, status, error_type, message, elapsed, figures, self.key_name
        )

    def hand_over_key_charge(self) -> KeyCharge | None:
        """What the request owes its API key (its limits' admission, its usage), taken from the
        tracker: a background response settles it when its generation ends, not when the request
        that queued it does. None without API keys (or when handed over already)."""
        grant, self.grant = self.grant, None
        usage, self.key_usage = self.key_usage, None
        if grant is None and usage is None:
            return None
        return KeyCharge(grant, usage, self.key_name)


class KeyCharge:
    """A request's debt to its API key: the rate limits' admission to give back with the tokens
    used, and the usage counters to add to. :meth:`settle` once, when the generation is over."""

    __slots__ = ("grant", "key_name", "usage")

    def __init__(self, grant: Any, usage: KeyUsageMetrics | None, key_name: str) -> None:
        self.grant = grant
        self.usage = usage
        self.key_name = key_name

    def settle(self, status: int, figures: RequestFigures | None, model: str) -> None:
        prompt = figures.prompt_tokens if figures is not None else 0
        cached = figures.cached_tokens if figures is not None else 0
        output = figures.completion_tokens if figures is not None else 0
        grant, self.grant = self.grant, None
        if grant is not None:
            grant.release(prompt + output)  # the key's tokens per minute count what was used
        if self.usage is not None and self.key_name:
            self.usage.record(self.key_name, model, str(status), prompt, cached, output)


def _span_figures(figures: RequestFigures | None, key_name: str) -> dict[str, Any]:
    """The server span's closing attributes (OpenTelemetry's GenAI names where there is one)."""
    out: dict[str, Any] = {}
    if key_name:
        out["deepseek.key_name"] = key_name
    if figures is not None:
        if figures.model:
            out["gen_ai.request.model"] = figures.model
        out["gen_ai.usage.input_tokens"] = figures.prompt_tokens
        out["gen_ai.usage.output_tokens"] = figures.completion_tokens
        out["deepseek.cached_tokens"] = figures.cached_tokens
        if figures.ttft is not None:
            out["deepseek.ttft_seconds"] = figures.ttft
    return out


def log_request_done(
    request_id: str,
    endpoint: str,
    status: int,
    error_type: str,
    message: str,
    seconds: float,
    figures: RequestFigures | None = None,
    key_name: str = "",
) -> None:
    """The one "request done" line of a request (INFO, WARNING for 5xx), with the error message if any.

    Fields: ``request_id``, ``endpoint``, ``status``, ``error_type``, ``model`` and ``key_name``
    (``-`` when unknown), ``prompt_tokens``, ``cached_tokens``, ``completion_tokens`` (0 when the
    request generated nothing), ``ttft_seconds`` (only when a token came) and ``seconds`` (total).
    """
    extra: dict[str, object] = {
        "request_id": request_id,
        "endpoint": endpoint,
        "status": status,
        "error_type": error_type or "-",
        "model": (figures.model if figures is not None else "") or "-",
        "key_name": key_name or "-",
        "prompt_tokens": figures.prompt_tokens if figures is not None else 0,
        "cached_tokens": figures.cached_tokens if figures is not None else 0,
        "completion_tokens": figures.completion_tokens if figures is not None else 0,
    }
    if figures is not None and figures.ttft is not None:
        extra["ttft_seconds"] = round(figures.ttft, 4)
    extra["seconds"] = round(seconds, 4)
    if message:
        extra["error"] = message
    log.log(logging.INFO if status < 500 else logging.WARNING, "request done", extra=extra)
