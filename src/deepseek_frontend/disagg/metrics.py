"""Prometheus view of the prefill/decode orchestrator (disagg/pool.py), read at scrape time.

Exported (prefix ``deepseek_frontend_``):

* ``pd_requests_total{outcome}`` -- PD requests by how they ended, one outcome per client request
  whatever pairs it used (``ok``, ``migrated`` (finished by a continuation), ``client_gone``,
  ``rejected``, ``prefill_failed``, ``decode_failed``, ``transfer_timeout``, ``no_worker``, ``error``);
* ``pd_bootstrap_failures_total`` -- prefill legs that failed (handshake, prefill or KV send);
* ``pd_transfer_failures_total`` -- decode legs that failed before their first token, and pairs
  whose KV did not move within ``--pd-transfer-timeout``;
* ``pd_pair_retries_total`` -- pairs retried on other workers; ``pd_late_prefill_failures_total`` --
  prefill answers that were bad after the decode had started, or missing 30 s after its end;
* the timing histograms ``pd_<name>_seconds`` of :data:`~.parts.TIMINGS` (``first_token``,
  ``prefill``, ``decode_after_prefill``, ``prefill_lag``), each with what it measures as its help.
  None of them is "the KV transfer": SGLang's prefill answers only after it, so the frontend never
  sees where it starts; ``decode_after_prefill`` (vLLM) is the closest;
* ``pd_role_in_flight{role}`` / ``pd_role_healthy_workers{role}`` -- per-role load and admission
  (a refused worker is not admitted);
* ``pd_role_mismatches_total{role}`` -- discoveries of a worker reporting another role than the one
  it was given as (it then gets no leg).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from deepseek_frontend.engines.pool import WorkerPool

from .parts import OUTCOMES, TIMING_BUCKETS, TIMINGS, PdStats

__all__ = ["PdCollector", "PdSource"]

PREFIX = "deepseek_frontend"


class PdSource(Protocol):
    """What the collector reads of the orchestrator (``disagg/pool.py``'s DisaggregatedPool)."""

    @property
    def stats(self) -> PdStats:
        """The orchestrator's counters."""
        ...

    @property
    def prefill(self) -> WorkerPool:
        """The prefill role's pool."""
        ...

    @property
    def decode(self) -> WorkerPool:
        """The decode role's pool."""
        ...


class PdCollector:
    """Register on a ``CollectorRegistry`` to export a DisaggregatedPool's counters."""

    def __init__(self, pool: PdSource) -> None:
        self.pool = pool

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        stats = self.pool.stats
        outcomes = CounterMetricFamily(
            f"{PREFIX}_pd_requests", "Prefill/decode requests by outcome.", labels=["outcome"]
        )
        for outcome in OUTCOMES:
            outcomes.add_metric([outcome], stats.outcomes.get(outcome, 0))
        yield outcomes
        for name, text, value in (
            (
                "pd_bootstrap_failures",
                "Prefill legs that failed (bootstrap, prefill or KV send).",
                stats.bootstrap_failures,
            ),
            (
                "pd_transfer_failures",
                "Decode legs that failed before their first token, and pairs whose KV did not move in time.",
                stats.transfer_failures,
            ),
            ("pd_pair_retries", "Prefill/decode pairs retried on other workers.", stats.retries),
            (
                "pd_late_prefill_failures",
                "Prefill answers that were bad after the decode had started, or missing 30 s after its end.",
                stats.late_prefill_failures,
            ),
        ):
            yield CounterMetricFamily(f"{PREFIX}_{name}", text, value)
        for name, text in TIMINGS.items():
            histogram = stats.timings[name]
            buckets = []
            cumulative = 0
            for bound, n in zip(TIMING_BUCKETS, histogram.counts, strict=False):
                cumulative += n
                buckets.append((repr(float(bound)), cumulative))
            buckets.append(("+Inf", cumulative + histogram.counts[-1]))
            yield HistogramMetricFamily(
                f"{PREFIX}_pd_{name}_seconds", text, buckets=buckets, sum_value=histogram.total
            )
        in_flight = GaugeMetricFamily(
            f"{PREFIX}_pd_role_in_flight", "Engine requests in flight per role.", labels=["role"]
        )
        healthy = GaugeMetricFamily(
            f"{PREFIX}_pd_role_healthy_workers", "Admitted workers per role.", labels=["role"]
        )
        mismatches = CounterMetricFamily(
            f"{PREFIX}_pd_role_mismatches",
            "Worker discoveries that found another role than the one the worker was given as.",
            labels=["role"],
        )
        for role, pool in (("prefill", self.pool.prefill), ("decode", self.pool.decode)):
            in_flight.add_metric([role], pool.in_flight)
            healthy.add_metric([role], pool.healthy_count)
            mismatches.add_metric([role], stats.role_mismatches.get(role, 0))
        yield in_flight
        yield healthy
        yield mismatches
