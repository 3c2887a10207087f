"""Prometheus metrics, one registry per app instance (tests run several apps in a process).

Names follow the serving field's shape (``<prefix>_requests_total``,
``..._time_to_first_token_seconds``...). Per-token work is kept cheap: latency
histograms are observed once per engine chunk, never per character, and token
counters are incremented once per request.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "deepseek_frontend"

#: Seconds. TTFT spans sub-millisecond (simulated engine) to tens of seconds (long prefill).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Seconds between chunks: decode steps are milliseconds.
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Tokenization / detokenization: microseconds to tens of milliseconds for a long prompt.
CODEC_BUCKETS = (0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Histogram:
    """A label-less Prometheus histogram for the event loop's thread: ``observe`` is one bisect.

    ``prometheus_client.Histogram`` takes a lock and updates every bucket object per
    observation (~5 us); the inter-token histogram is observed once per engine chunk of
    every stream, so it uses this instead. All observations must come from one thread
    (the server's event loop); scrapes run on the same loop. Exposed exactly like
    ``prometheus_client.Histogram`` (``_bucket{le=...}``, ``_sum``, ``_count``).
    """

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = tuple(sorted(buckets))
        self._counts = [0] * (len(self._bounds) + 1)  # last slot: above every bound (+Inf)
        self._sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    def collect(self) -> Iterator[Metric]:
        cumulative = 0
        buckets = []
        for bound, n in zip(self._bounds, self._counts, strict=False):
            cumulative += n
            buckets.append((_format_bound(bound), cumulative))
        buckets.append(("+Inf", cumulative + self._counts[-1]))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self._sum)

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation)


class _CacheCollector:
    """``<prefix>_cache_{entries,bytes}`` gauges and ``_cache_{hits,misses}_total`` counters by cache."""

    def __init__(self, stats: Callable[[], dict[str, dict[str, int]]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        families = (
            GaugeMetricFamily(
                f"{PREFIX}_cache_entries", "Entries in each prompt-id cache.", labels=["cache"]
            ),
            GaugeMetricFamily(
                f"{PREFIX}_cache_bytes", "Estimated bytes held by each prompt-id cache.", labels=["cache"]
            ),
            CounterMetricFamily(f"{PREFIX}_cache_hits", "Lookups served by each cache.", labels=["cache"]),
            CounterMetricFamily(f"{PREFIX}_cache_misses", "Lookups each cache missed.", labels=["cache"]),
        )
        for name, values in stats.items():
            for family, key in zip(families, ("entries", "bytes", "hits", "misses"), strict=True):
                family.add_metric([name], values[key])
        yield from families

    def describe(self) -> Iterator[Metric]:
        return iter(())


class _AdmissionCollector:
    """One model's admission control, read at scrape time (no per-request cost): the
    ``<prefix>_admission_{active,queued}`` gauges, ``_admission_rejected_total`` (429s), of them
    ``_admission_preempted_total`` (waiters a more important request took the place of), and
    ``_admission_expired_total`` (408s: deadlines that passed in the queue)."""

    def __init__(self, admission: Any) -> None:
        self._admission = admission

    def collect(self) -> Iterator[Metric]:
        adm = self._admission
        yield GaugeMetricFamily(
            f"{PREFIX}_admission_active", "Requests admitted and being served.", adm.active
        )
        yield GaugeMetricFamily(f"{PREFIX}_admission_queued", "Requests waiting for a slot.", adm.queued)
        yield CounterMetricFamily(
            f"{PREFIX}_admission_rejected", "Requests refused with 429 by admission control.", adm.rejected
        )
        yield CounterMetricFamily(
            f"{PREFIX}_admission_preempted",
            "Queued requests refused with 429 to make room for a more important one.",
            adm.preempted,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_admission_expired",
            "Queued requests answered 408 because their x-request-timeout-ms budget ran out.",
            adm.expired,
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())


class _ProcessCollector:
    """What the process shares between its models, read at scrape time: ``<prefix>_offload_pending``
    (long prompts queued or being prepared off the event loop), when the HTTP protocol's counters are
    given, ``_http_{header_timeouts,refused_connections,parser_errors}_total``, and with an arrival
    pacer ``_arrivals_held`` and ``_arrivals_started_total{kind=warm|cold}``.
    """

    def __init__(
        self,
        offload_pending: Callable[[], int],
        http_stats: Callable[[], dict[str, int] | None],
        arrivals: Any = None,
        http_counts: Callable[[], dict[str, int] | None] = lambda: None,
    ) -> None:
        self._offload_pending = offload_pending
        self._http_stats = http_stats
        self._arrivals = arrivals
        self._http_counts = http_counts

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            f"{PREFIX}_offload_pending",
            "Long prompts queued or being rendered and tokenized off the event loop.",
            self._offload_pending(),
        )
        stats = self._http_stats() or {}
        for key, text in (
            ("header_timeouts", "Connections closed for not sending a request head in time (408)."),
            ("refused_connections", "Connections refused over the open-connection limit (503)."),
            ("parser_errors", "Requests the HTTP parser rejected (400)."),
        ):
            yield CounterMetricFamily(f"{PREFIX}_http_{key}", text, stats.get(key, 0))
        counts = self._http_counts()
        if counts is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_http_connections_open",
                "Client connections open on this process (serve --workers N balances them).",
                counts["open"],
            )
        arrivals = self._arrivals
        if arrivals is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_arrivals_held",
                "Requests of new conversations held while follow-ups of recent ones are answered first.",
                arrivals.held,
            )
            started = CounterMetricFamily(
                f"{PREFIX}_arrivals_started",
                "Requests started by the HTTP protocol, by its verdict on their body's head.",
                labels=["kind"],
            )
            started.add_metric(["warm"], arrivals.warm)
            started.add_metric(["cold"], arrivals.cold)
            yield started

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _format_bound(bound: float) -> str:
    return repr(float(bound))


class RequestFigures:
    """What a request's "request done" log line reports beyond its status (see :class:`RequestLedger`)."""

    __slots__ = ("cached_tokens", "completion_tokens", "model", "prompt_tokens", "ttft")

    def __init__(self) -> None:
        self.model = ""
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        #: seconds from arrival to the first engine chunk of the earliest choice; None: no token came
        self.ttft: float | None = None


class RequestLedger:
    """Per-request figures the pipeline notes (first token, usage) for the request's log line.

    Keyed by request id; the request's tracker takes its entry when the request is done. Bounded:
    an entry nobody takes (a request that ended before its stream closed) is evicted after
    ``size`` newer ones, so the ledger never grows with traffic.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._entries: OrderedDict[str, RequestFigures] = OrderedDict()

    def _entry(self, request_id: str) -> RequestFigures:
        entry = self._entries.get(request_id)
        if entry is None:
            entry = self._entries[request_id] = RequestFigures()
            if len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return entry

    def first_token(self, request_id: str, seconds: float) -> None:
        """A choice's first engine chunk came ``seconds`` after the request arrived."""
        entry = self._entry(request_id)
        if entry.ttft is None or seconds < entry.ttft:
            entry.ttft = seconds

    def usage(self, request_id: str, model: str, prompt: int, cached: int, completion: int) -> None:
        """A choice ended: the prompt counts once per request, completions add up over choices."""
        entry = self._entry(request_id)
        entry.model = model
        entry.prompt_tokens = max(entry.prompt_tokens, prompt)
        entry.cached_tokens = max(entry.cached_tokens, cached)
        entry.completion_tokens += completion

    def take(self, request_id: str) -> RequestFigures | None:
        """The request's figures, removed from the ledger (None if nothing was noted)."""
        return self._entries.pop(request_id, None)


class FrontendMetrics:
    """All metrics of one server. ``render()`` gives the Prometheus text exposition.

    A server keeps one per served model (fleet/served_model.py), whose series ``/metrics`` labels
    with ``model`` (:func:`merge_labelled`), and one for what happens before a request is routed to
    a model; that one exports ``<prefix>_model_info{model="..."} 1`` per served model.
    """

    def __init__(self, registry: CollectorRegistry | None = None, models: Sequence[str] = ()) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ledger = RequestLedger()
        self.model_info = Gauge(
            f"{PREFIX}_model_info",
            "1 for each model this server serves (its served name).",
            ["model"],
            registry=r,
        )
        self.serve_models(models)
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Finished HTTP requests by endpoint, status code and error type ('' on success).",
            ["endpoint", "status", "error_type"],
            registry=r,
        )
        self.in_flight = Gauge(
            f"{PREFIX}_requests_in_flight", "Requests being served.", ["endpoint"], registry=r
        )
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Request arrival to first generated token leaving the frontend.",
            TTFT_BUCKETS,
            r,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Time between consecutive engine chunks of one stream (observed per chunk).",
            ITL_BUCKETS,
            r,
        )
        self.e2e = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds",
            "Request arrival to last byte.",
            E2E_BUCKETS,
            r,
        )
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens sent to engines.", registry=r)
        self.generation_tokens = Counter(
            f"{PREFIX}_generation_tokens", "Tokens generated by engines.", registry=r
        )
        self.tokenization = Histogram(
            f"{PREFIX}_tokenization_seconds",
            "Prompt render + tokenize time.",
            CODEC_BUCKETS,
            r,
        )
        self.detokenization = Histogram(
            f"{PREFIX}_detokenization_seconds",
            "Detokenize + parse time per request (sum over its chunks).",
            CODEC_BUCKETS,
            r,
        )
        self.worker_healthy = Gauge(
            f"{PREFIX}_worker_healthy", "1 when the worker passes health checks.", ["worker"], registry=r
        )
        self.worker_in_flight = Gauge(
            f"{PREFIX}_worker_in_flight", "Requests running on the worker.", ["worker"], registry=r
        )
        self.dropped_tool_calls = Counter(
            f"{PREFIX}_dropped_tool_calls",
            "Tool calls the model made to tools the request did not declare (dropped).",
            registry=r,
        )

    def serve_models(self, names: Iterable[str]) -> None:
        """``model_info`` names exactly ``names`` (at start, and after a reload)."""
        self.model_info.clear()
        for name in names:
            self.model_info.labels(name).set(1)

    def watch_caches(self, stats: Callable[[], dict[str, dict[str, int]]]) -> None:
        """Export the prompt-id caches' sizes and hit counts, read from ``stats()`` at each scrape."""
        self.registry.register(_CacheCollector(stats))

    def watch_admission(self, admission: Any) -> None:
        """Export a model's admission control (active, queued, refused), read at each scrape."""
        self.registry.register(_AdmissionCollector(admission))

    def watch_process(
        self,
        offload_pending: Callable[[], int],
        http_stats: Callable[[], dict[str, int] | None] = lambda: None,
        arrivals: Any = None,
        http_counts: Callable[[], dict[str, int] | None] = lambda: None,
    ) -> None:
        """Export the offload, HTTP-limit, open-connection and arrival figures the process's models
        share."""
        self.registry.register(_ProcessCollector(offload_pending, http_stats, arrivals, http_counts))

    def render(self) -> bytes:
        """Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


def merge_labelled(parts: Iterable[tuple[Mapping[str, str], str]]) -> dict[str, Metric]:
    """Prometheus text expositions -> their metric families merged by name, each sample of a part
    given that part's extra labels (the text format needs one block per family, with its type and
    help once). The families come back in first-seen order, ready for a collector to yield."""
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Metric] = {}
    for extra, text in parts:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
                merged.unit = family.unit
            for s in family.samples:
                labels = {**s.labels, **extra}
                merged.samples.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
    return families


def render_families(families: Iterable[Metric]) -> bytes:
    """Metric families as Prometheus text."""
    collected = list(families)

    class _Families:
        def collect(self) -> Iterator[Metric]:
            return iter(collected)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families())  # type: ignore[arg-type]
    return generate_latest(registry)
