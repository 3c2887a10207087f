"""Per-tenant rate limits: token buckets, in-flight counts, their headers, and usage by key.

Every tenant with limits has up to three:

* requests per minute -- a bucket of capacity ``requests_per_minute`` refilled at a sixtieth of it
  per second; admitting a request takes 1 from it;
* tokens per minute -- a bucket of capacity ``tokens_per_minute`` refilled likewise. Admitting a
  request *reserves* the most it may use (``admit(..., tokens=)``: its prompt estimate and output
  allowance, at most the capacity, at least 1) and refuses it when the bucket does not hold that
  much; when it is done (:meth:`Admission.release`) the reservation is settled against the prompt
  and output tokens it used: the rest goes back, an excess (a prompt longer than estimated) is
  taken, so the level may go below zero and the tenant then waits until the refill brings it back;
* concurrent requests -- the requests in flight, summed over every frontend process.

:meth:`RateLimiter.admit` checks all three at once and takes nothing when any of them refuses;
the :class:`Refusal` names the limit whose wait is longest (the earliest time a retry can succeed).
The bucket state lives in a :mod:`~deepseek_frontend.keys.limit_state` store: process memory, or
the mmap shared by ``serve --workers N``'s processes. A tenant without limits never touches it
(its requests in flight are counted in process memory, for a reload that gives it a limit).

Headers are computed from the buckets after the decision, in OpenAI's form (``x-ratelimit-*``,
resets as durations such as ``6m0s``) or Anthropic's (``anthropic-ratelimit-*``, resets as RFC 3339
UTC times): ``admit(..., protocol=)`` picks one, and :func:`openai_headers` /
:func:`anthropic_headers` render a :class:`LimitSnapshot` in either. A reset is the time until the
bucket is full again. Only the limits a tenant has produce headers; a refusal adds
``retry-after`` (whole seconds, at least 1).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .limit_state import LimitStateStats, LocalLimitState, SharedLimitState, TenantRecord
from .tenants import Tenant

__all__ = [
    "Admission",
    "KeyUsageMetrics",
    "LimitSnapshot",
    "LimitStateCollector",
    "RateLimiter",
    "Refusal",
    "anthropic_headers",
    "format_duration",
    "openai_headers",
]

Protocol = Literal["openai", "anthropic"]
LimitName = Literal["requests", "tokens", "concurrent_requests"]
#: seconds a request refused for too many in flight is told to wait (no refill time to compute)
CONCURRENCY_RETRY_S = 1.0
_LIMIT_WORDS: dict[LimitName, str] = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrent_requests": "concurrent requests",
}


@dataclass(frozen=True)
class LimitSnapshot:
    """A tenant's buckets at one moment, as headers show them (``None`` limit: no such limit)."""

    requests_limit: int | None = None
    requests_remaining: int = 0
    requests_reset_s: float = 0.0
    tokens_limit: int | None = None
    tokens_remaining: int = 0
    tokens_reset_s: float = 0.0
    #: ``time.time()`` when the snapshot was taken (Anthropic's resets are wall-clock times)
    wall_time: float = 0.0


def format_duration(seconds: float) -> str:
    """A duration as OpenAI's reset headers write it: ``120ms``, ``1s``, ``1.5s``, ``6m0s``, ``1h2m3s``
    (rounded up to the millisecond)."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, fraction = divmod(rest, 1000)
    text = f"{whole}.{fraction:03d}".rstrip("0") if fraction else str(whole)
    prefix = (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "")
    return f"{prefix}{text}s"


def _rfc3339(wall_time: float) -> str:
    # rounded up to the second: the bucket is full at that time, not a fraction before it
    return datetime.fromtimestamp(math.ceil(wall_time), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def openai_headers(snapshot: LimitSnapshot) -> dict[str, str]:
    headers: dict[str, str] = {}
    if snapshot.requests_limit is not None:
        headers["x-ratelimit-limit-requests"] = str(snapshot.requests_limit)
        headers["x-ratelimit-remaining-requests"] = str(snapshot.requests_remaining)
        headers["x-ratelimit-reset-requests"] = format_duration(snapshot.requests_reset_s)
    if snapshot.tokens_limit is not None:
        headers["x-ratelimit-limit-tokens"] = str(snapshot.tokens_limit)
        headers["x-ratelimit-remaining-tokens"] = str(snapshot.tokens_remaining)
        headers["x-ratelimit-reset-tokens"] = format_duration(snapshot.tokens_reset_s)
    return headers


def anthropic_headers(snapshot: LimitSnapshot) -> dict[str, str]:
    headers: dict[str, str] = {}
    if snapshot.requests_limit is not None:
        headers["anthropic-ratelimit-requests-limit"] = str(snapshot.requests_limit)
        headers["anthropic-ratelimit-requests-remaining"] = str(snapshot.requests_remaining)
        headers["anthropic-ratelimit-requests-reset"] = _rfc3339(
            snapshot.wall_time + snapshot.requests_reset_s
        )
    if snapshot.tokens_limit is not None:
        headers["anthropic-ratelimit-tokens-limit"] = str(snapshot.tokens_limit)
        headers["anthropic-ratelimit-tokens-remaining"] = str(snapshot.tokens_remaining)
        headers["anthropic-ratelimit-tokens-reset"] = _rfc3339(snapshot.wall_time + snapshot.tokens_reset_s)
    return headers


_RENDERERS: dict[str, Callable[[LimitSnapshot], dict[str, str]]] = {
    "openai": openai_headers,
    "anthropic": anthropic_headers,
}


class Admission:
    """An admitted request. Call :meth:`release` when it is done (more calls do nothing).

    ``reserved``: the tokens taken from the key's tokens bucket at admission, settled against the
    tokens the request used by :meth:`release`."""

    def __init__(
        self,
        limiter: RateLimiter | None,
        tenant: Tenant,
        reserved: int,
        snapshot: LimitSnapshot,
        headers: dict[str, str],
    ) -> None:
        self._limiter = limiter
        self._tenant = tenant
        self.reserved = reserved
        self.snapshot = snapshot
        self.headers = headers
        self.released = False

    def release(self, tokens_used: int = 0, now: float | None = None) -> None:
        """The request is done: its in-flight count goes, and the tokens it reserved are settled
        against ``tokens_used`` (prompt + output): what it did not use goes back to the key's
        tokens bucket, what it used beyond them is taken. Only the first call counts."""
        if self.released:
            return
        self.released = True
        if self._limiter is not None:
            self._limiter._release(self._tenant, self.reserved, max(0, tokens_used), now)


@dataclass(frozen=True)
class Refusal:
    """A refused request: which limit, when to retry, the message and headers for the 429."""

    limit: LimitName
    retry_after_s: float
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    snapshot: LimitSnapshot = field(default_factory=LimitSnapshot)


class RateLimiter:
    """Admits a tenant's requests within its limits.

    ``shared``: the state every frontend process shares (created before fork), with this process's
    ``process_index``; without it the state is this process's own. ``clock`` (seconds, monotonic)
    and ``wall_clock`` (``time.time``) may be replaced in tests; ``now`` arguments override
    ``clock`` for one call.

    Every key's requests in flight are counted, whatever its limits: in this process's memory for
    a key without limits (no lock, no slot of the shared state), and in the key's record too -- this
    process's entry set to this process's count at each admission and release -- for a key with
    limits. A reload that gives a key a concurrency limit calls :meth:`reconfigure`, which writes the
    requests of it already in flight into its record, so they count against the new limit.
    """

    def __init__(
        self,
        shared: SharedLimitState | None = None,
        process_index: int = 0,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._state: SharedLimitState | LocalLimitState = shared if shared is not None else LocalLimitState()
        if not 0 <= process_index < self._state.processes:
            raise ValueError(f"process index {process_index} out of range 0..{self._state.processes - 1}")
        self.process_index = process_index
        self._clock = clock
        self._wall_clock = wall_clock
        #: requests in flight in this process, by key name (every key; a name leaves at 0)
        self._local: dict[str, int] = {}
        #: keys whose record holds this process's in-flight count (written at each change)
        self._published: set[str] = set()

    def admit(
        self, tenant: Tenant, now: float | None = None, protocol: Protocol = "openai", tokens: int = 0
    ) -> Admission | Refusal:
        """Admit a request of ``tenant`` now, or refuse it; headers in ``protocol``'s form.

        ``tokens``: the most the request may use (its prompt estimate and output allowance,
        edge/reservation.py), reserved from the tokens bucket -- at most the bucket's capacity, at
        least 1. The request is admitted only when the bucket holds its whole reservation."""
        render = _RENDERERS[protocol]
        limits = tenant.limits
        name = tenant.name
        if limits.unlimited:
            self._local[name] = self._local.get(name, 0) + 1
            return Admission(self, tenant, 0, LimitSnapshot(), {})
        now = self._clock() if now is None else now
        rpm, tpm, most = limits.requests_per_minute, limits.tokens_per_minute, limits.concurrent_requests
        reserve = min(max(1, tokens), tpm) if tpm is not None else 0
        #: the limits that refuse: seconds until a retry can pass it, the limit, its usage for the message
        waits: list[tuple[float, LimitName, str]] = []
        with self._state.record(name, now) as record:
            own = self._local.get(name, 0)
            record.in_flight[self.process_index] = own  # exact: this process's own count
            requests, bucket = record.requests, record.tokens
            if rpm is not None:
                requests.refill(rpm, now)
                if requests.level < 1:
                    usage = f"limit {rpm}, used {rpm - max(0, math.floor(requests.level))}"
                    waits.append(((1 - requests.level) * 60.0 / rpm, "requests", usage))
            if tpm is not None:
                bucket.refill(tpm, now)
                if bucket.level < reserve:
                    usage = (
                        f"limit {tpm}, used {tpm - math.floor(bucket.level)}, this request may use {reserve}"
                    )
                    waits.append(((reserve - bucket.level) * 60.0 / tpm, "tokens", usage))
            in_flight = record.in_flight_total
            if most is not None and in_flight >= most:
                usage = f"limit {most}, in flight {in_flight}"
                waits.append((CONCURRENCY_RETRY_S, "concurrent_requests", usage))
            if not waits:
                if rpm is not None:
                    requests.level -= 1
                if tpm is not None:
                    bucket.level -= reserve
                self._local[name] = own + 1
                record.in_flight[self.process_index] = own + 1
                self._published.add(name)
            snapshot = self._snapshot(tenant, record)
        headers = render(snapshot)
        if not waits:
            return Admission(self, tenant, reserve, snapshot, headers)
        wait, limit, usage = max(waits, key=lambda refusing: refusing[0])
        retry_after_s = math.ceil(wait * 10 - 1e-9) / 10  # up to the tenth of a second the message shows
        headers["retry-after"] = str(max(1, math.ceil(retry_after_s)))
        message = (
            f"Rate limit reached for key '{name}' on {_LIMIT_WORDS[limit]}: {usage}; "
            f"retry in {retry_after_s:.1f} s"
        )
        return Refusal(limit, retry_after_s, message, headers, snapshot)

    def in_flight(self, tenant: Tenant, now: float | None = None) -> int:
        """The tenant's requests in flight: in every process for a key with limits, in this one for
        a key without."""
        if tenant.limits.unlimited and tenant.name not in self._published:
            return self._local.get(tenant.name, 0)
        return self._state.in_flight(tenant.name, self._clock() if now is None else now)

    def reconfigure(
        self, tenants: Iterable[Tenant], removed: Iterable[str], now: float | None = None
    ) -> None:
        """A reload swapped the keys in: ``tenants`` are the keys now, ``removed`` the names that went.

        A key that now has limits gets this process's requests of it in flight written into its
        record (a concurrency limit added by the reload counts them); a removed key's record is
        freed once nothing of it is in flight (:meth:`LocalLimitState.forget`)."""
        now = self._clock() if now is None else now
        for tenant in tenants:
            name = tenant.name
            if not tenant.limits.unlimited and self._local.get(name) and name not in self._published:
                with self._state.record(name, now) as record:
                    record.in_flight[self.process_index] = self._local[name]
                self._published.add(name)
        for name in removed:
            self._state.forget(name, now)

    def stats(self) -> LimitStateStats:
        return self._state.stats()

    def _release(self, tenant: Tenant, reserved: int, tokens_used: int, now: float | None) -> None:
        name = tenant.name
        left = max(0, self._local.get(name, 0) - 1)
        if left:
            self._local[name] = left
        else:
            self._local.pop(name, None)
        if name not in self._published and tenant.limits.unlimited:
            return  # counted in this process only: no lock
        now = self._clock() if now is None else now
        with self._state.record(name, now) as record:
            record.in_flight[self.process_index] = left
            bucket = record.tokens
            # the key's tokens bucket as it is now (a reload may have changed or dropped its limit)
            if bucket.capacity > 0 and (reserved or tokens_used):
                bucket.refill(bucket.capacity, now)
                bucket.level = min(bucket.capacity, bucket.level + reserved - tokens_used)
        if not left:
            self._published.discard(name)

    def _snapshot(self, tenant: Tenant, record: TenantRecord) -> LimitSnapshot:
        rpm, tpm = tenant.limits.requests_per_minute, tenant.limits.tokens_per_minute
        requests, tokens = record.requests.level, record.tokens.level
        return LimitSnapshot(
            requests_limit=rpm,
            requests_remaining=max(0, math.floor(requests)) if rpm else 0,
            requests_reset_s=max(0.0, (rpm - requests) * 60.0 / rpm) if rpm else 0.0,
            tokens_limit=tpm,
            tokens_remaining=max(0, math.floor(tokens)) if tpm else 0,
            tokens_reset_s=max(0.0, (tpm - tokens) * 60.0 / tpm) if tpm else 0.0,
            wall_time=self._wall_clock(),
        )


class KeyUsageMetrics:
    """Requests, tokens and rate-limit refusals by key name (and model) in ``/metrics``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "deepseek_frontend_key_requests",
            "Finished requests by API key name, model and HTTP status.",
            ["key", "model", "status"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "deepseek_frontend_key_prompt_tokens",
            "Prompt tokens by API key name and model.",
            ["key", "model"],
            registry=registry,
        )
        self.cached_tokens = Counter(
            "deepseek_frontend_key_cached_tokens",
            "Prompt tokens served from the prefix cache, by API key name and model.",
            ["key", "model"],
            registry=registry,
        )
        self.output_tokens = Counter(
            "deepseek_frontend_key_output_tokens",
            "Generated tokens by API key name and model.",
            ["key", "model"],
            registry=registry,
        )
        self.rate_limited = Counter(
            "deepseek_frontend_key_rate_limited",
            "Requests refused by a key's rate limit, by key name and limit.",
            ["key", "limit"],
            registry=registry,
        )

    def record(self, key: str, model: str, status: int | str, prompt: int, cached: int, output: int) -> None:
        """Count one finished request of ``key`` for ``model`` and its tokens."""
        self.requests.labels(key, model, str(status)).inc()
        self.prompt_tokens.labels(key, model).inc(max(0, prompt))
        self.cached_tokens.labels(key, model).inc(max(0, cached))
        self.output_tokens.labels(key, model).inc(max(0, output))

    def limited(self, key: str, limit: str) -> None:
        """Count one request of ``key`` refused by ``limit``."""
        self.rate_limited.labels(key, limit).inc()


class LimitStateCollector:
    """The limits' state in ``/metrics`` (a collector over :meth:`RateLimiter.stats`): the shared
    table's slots and those in use, and this process's records dropped and tenants kept in its own
    memory because the table was full (``keys/limit_state.py``)."""

    def __init__(self, limiter: RateLimiter) -> None:
        self._limiter = limiter

    def collect(self) -> Iterator[Metric]:
        stats = self._limiter.stats()
        yield GaugeMetricFamily(
            "deepseek_frontend_key_limit_slots",
            "Slots of the API keys' shared limits table (0: one process, no fixed table).",
            value=stats.slots,
        )
        yield GaugeMetricFamily(
            "deepseek_frontend_key_limit_records",
            "API keys whose limits' state is kept (shared table slots in use, or records in process memory).",
            value=stats.used,
        )
        yield CounterMetricFamily(
            "deepseek_frontend_key_limit_records_dropped",
            "Keys' limits records dropped: idle (buckets full, nothing in flight) or their key removed.",
            value=stats.dropped,
        )
        yield CounterMetricFamily(
            "deepseek_frontend_key_limit_overflows",
            "Keys whose limits were kept in process memory (held per process) because every slot "
            "of the shared table was busy.",
            value=stats.overflows,
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())
