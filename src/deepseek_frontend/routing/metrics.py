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

A prefill/decode deployment has one router per role: every family above then carries a ``role``
label (``prefill``, ``decode``) besides its own; an aggregated one's families have no ``role``.

Overload rejections (429) are counted where they happen (admission control, the pool's
per-worker limit) and exported by ``api/metrics.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from deepseek_frontend.routing.router import Router

__all__ = ["RoutingCollector"]

PREFIX = "deepseek_frontend"


class RoutingCollector:
    """Register on a ``CollectorRegistry`` to export ``router``'s state, or, given ``{role: router}``,
    every role's router with a ``role`` label (see module docstring)."""

    def __init__(self, router: Router | Mapping[str, Router]) -> None:
        self.router = router

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        if isinstance(self.router, Mapping):
            routers = [((role,), r) for role, r in self.router.items()]
            role: list[str] = ["role"]
        else:
            routers, role = [((), self.router)], []

        def counter(name: str, text: str, *labels: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", text, labels=[*role, *labels])

        def gauge(name: str, text: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=[*role, *labels])

        decisions = counter("routing_decisions", "Worker choices by reason.", "reason")
        seconds = counter("routing_choose_seconds", "Seconds spent choosing workers.")
        chosen = counter("routing_choose", "Worker choices made.")
        migrations = counter("migrations", "Responses continued on another worker after a failure.")
        families = {
            "prompt_tokens": counter("worker_prompt_tokens", "Prompt tokens routed to the worker.", "worker"),
            "cached_tokens": counter(
                "worker_cached_tokens", "Prompt tokens the worker reported served from its cache.", "worker"
            ),
            "predicted_cached_tokens": counter(
                "worker_predicted_cached_tokens",
                "Prompt tokens the router expected the worker to have cached.",
                "worker",
            ),
            "cached_token_rate": gauge(
                "worker_cached_token_rate",
                "Cached prompt tokens / prompt tokens on the worker since start.",
                "worker",
            ),
            "indexed_blocks": gauge(
                "worker_kv_indexed_blocks", "KV blocks the router believes the worker caches.", "worker"
            ),
        }
        events = {
            "events": counter("kv_events", "KV events applied.", "source"),
            "gaps": counter("kv_event_gaps", "Sequence gaps seen.", "source"),
            "replays": counter("kv_event_replays", "Replays requested.", "source"),
            "restarts": counter("kv_event_restarts", "Publisher restarts detected.", "source"),
            "clears": counter("kv_event_clears", "Times the source's blocks were dropped.", "source"),
        }
        for labels, r in routers:
            for reason, n in sorted(r.decisions.items()):
                decisions.add_metric([*labels, reason], n)
            seconds.add_metric(list(labels), r.choose_seconds)
            chosen.add_metric(list(labels), r.choose_count)
            migrations.add_metric(list(labels), r.migrations)
            for url, stats in sorted(r.worker_stats().items()):
                for key, family in families.items():
                    family.add_metric([*labels, url], stats[key])
            for source, stats in sorted(r.event_stats().items()):
                for key, family in events.items():
                    family.add_metric([*labels, source], stats[key])
        yield from (decisions, seconds, chosen, migrations, *families.values(), *events.values())
