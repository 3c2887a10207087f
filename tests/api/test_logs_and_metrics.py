"""Structured log lines and the lock-free histogram."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, generate_latest

from deepseek_frontend.api.logs import KeyValueFormatter
from deepseek_frontend.api.metrics import Histogram


def test_log_lines_carry_extra_fields_as_key_value_pairs() -> None:
    record = logging.LogRecord("deepseek_frontend.api", logging.INFO, __file__, 1, "request done", None, None)
    record.request_id = "chatcmpl-1"
    record.status = 200
    record.error_type = 'has "quotes" and spaces'
    line = KeyValueFormatter().format(record)
    assert line.endswith(
        'request done request_id=chatcmpl-1 status=200 error_type="has \\"quotes\\" and spaces"'
    )
    assert " INFO deepseek_frontend.api " in line


def test_histogram_exposes_cumulative_buckets_sum_and_count() -> None:
    registry = CollectorRegistry()
    h = Histogram("x_seconds", "doc", (0.1, 1.0), registry)
    for value in (0.05, 0.1, 0.5, 3.0):
        h.observe(value)
    text = generate_latest(registry).decode()
    assert 'x_seconds_bucket{le="0.1"} 2.0' in text, "a value equal to a bound falls in that bucket"
    assert 'x_seconds_bucket{le="1.0"} 3.0' in text
    assert 'x_seconds_bucket{le="+Inf"} 4.0' in text
    assert "x_seconds_count 4.0" in text
    assert "x_seconds_sum 3.65" in text
    assert h.count == 4
