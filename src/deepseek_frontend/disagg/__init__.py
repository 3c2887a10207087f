"""Prefill/decode disaggregation: each request runs on a prefill and a decode worker.

Composes two worker pools (``engines/``), each with its router (``routing/``), into one engine.

Layout::

    pool.py            DisaggregatedPool: the pair chosen, both legs run, retried, aborted together
    legs.py            the SGLang and vLLM leg requests
    parts.py           rooms, settings, the per-request log line
    metrics.py         the prefill/decode Prometheus collector
"""
