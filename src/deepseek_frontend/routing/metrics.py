"""Prometheus view of the router, read at scrape time (no per-request metric work).

Exported (prefix ``deepseek_frontend_``):

* ``routing_decisions_total{reason}`` -- why each worker was chosen (``kv-overlap``, ``kv-load``,
  ``session``, ``session-new``, ``session-moved``, ``least-outstanding``, ``round-robin``,
  ``single-candidate``);
* ``routing_choose_seconds_total`` / ``routing_choose_total`` -- time spent choosing;
* ``worker_prompt_tokens_total{worker}``, ``worker_cached_tokens_total{worker}`` (as the engine
  reported them), ``worker_cached_token_rate{worker}`` (their ratio) and
  ``worker_predicted_cached_tokens_total{worker}`` (what the router expected);
* ``worker_kv_indexed_blocks{worker}`` -- blocks the router believes the worker caches;
* ``migrations_total`` -- streams continued on another worker;
* ``kv_events_total{source}``, ``kv_event_gaps_total{source}``, ``kv_event_replays_total{source}``,
  ``kv_event_restarts_total{source}``, ``kv_event_clears_total{source}``.

Overload rejections (429) are counted where they happen (admission control, the pool's
per-worker limit) and exported by ``api/metrics.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from deepseek_frontend.routing.router import Router

__all__ = ["RoutingCollector"]

PREFIX = "deepseek_frontend"


class RoutingCollector:
    """Register on a ``CollectorRegistry`` to export ``router``'s state."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        r = self.router
        decisions = CounterMetricFamily(
            f"{PREFIX}_routing_decisions", "Worker choices by reason.", labels=["reason"]
        )
        for reason, n in sorted(r.decisions.items()):
            decisions.add_metric([reason], n)
        yield decisions
        yield CounterMetricFamily(
            f"{PREFIX}_routing_choose_seconds", "Seconds spent choosing workers.", value=r.choose_seconds
        )
        yield CounterMetricFamily(f"{PREFIX}_routing_choose", "Worker choices made.", value=r.choose_count)
        yield CounterMetricFamily(
            f"{PREFIX}_migrations",
            "Responses continued on another worker after a failure.",
            value=r.migrations,
        )
        families = {
            "prompt_tokens": CounterMetricFamily(
                f"{PREFIX}_worker_prompt_tokens", "Prompt tokens routed to the worker.", labels=["worker"]
            ),
            "cached_tokens": CounterMetricFamily(
                f"{PREFIX}_worker_cached_tokens",
                "Prompt tokens the worker reported served from its cache.",
                labels=["worker"],
            ),
            "predicted_cached_tokens": CounterMetricFamily(
                f"{PREFIX}_worker_predicted_cached_tokens",
                "Prompt tokens the router expected the worker to have cached.",
                labels=["worker"],
            ),
            "cached_token_rate": GaugeMetricFamily(
                f"{PREFIX}_worker_cached_token_rate",
                "Cached prompt tokens / prompt tokens on the worker since start.",
                labels=["worker"],
            ),
            "indexed_blocks": GaugeMetricFamily(
                f"{PREFIX}_worker_kv_indexed_blocks",
                "KV blocks the router believes the worker caches.",
                labels=["worker"],
            ),
        }
        for url, stats in sorted(r.worker_stats().items()):
            for key, family in families.items():
                family.add_metric([url], stats[key])
        yield from families.values()
        events = {
            "events": CounterMetricFamily(f"{PREFIX}_kv_events", "KV events applied.", labels=["source"]),
            "gaps": CounterMetricFamily(f"{PREFIX}_kv_event_gaps", "Sequence gaps seen.", labels=["source"]),
            "replays": CounterMetricFamily(
                f"{PREFIX}_kv_event_replays", "Replays requested.", labels=["source"]
            ),
            "restarts": CounterMetricFamily(
                f"{PREFIX}_kv_event_restarts", "Publisher restarts detected.", labels=["source"]
            ),
            "clears": CounterMetricFamily(
                f"{PREFIX}_kv_event_clears", "Times the source's blocks were dropped.", labels=["source"]
            ),
        }
        for source, stats in sorted(r.event_stats().items()):
            for key, family in events.items():
                family.add_metric([source], stats[key])
        yield from events.values()
