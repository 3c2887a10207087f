"""Structured log lines (key=value and JSON), the per-request ledger and the lock-free histogram."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from deepseek_frontend.fleet.metrics import Histogram, RequestLedger
from deepseek_frontend.keys.tenants import key_name
from deepseek_frontend.server.logs import JsonFormatter, KeyValueFormatter, configure_logging


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


def test_json_log_records_are_one_object_per_line_with_typed_fields() -> None:
    record = logging.LogRecord(
        "deepseek_frontend.api", logging.WARNING, __file__, 1, "engine said %s", ("a\nforged line",), None
    )
    record.request_id = "chatcmpl-1"
    record.status = 503
    record.seconds = 0.25
    record.message_extra = {"nested": [1, 2]}
    record.ts = "a field named like a fixed key"
    try:
        raise ValueError("boom\nline two")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line, "one record, one line"
    obj = json.loads(line)
    assert obj["message"] == "engine said a\nforged line"
    assert (obj["level"], obj["logger"]) == ("WARNING", "deepseek_frontend.api")
    assert obj["ts"].endswith("Z") and obj["extra_ts"] == "a field named like a fixed key"
    assert (obj["request_id"], obj["status"], obj["seconds"]) == ("chatcmpl-1", 503, 0.25)
    assert obj["message_extra"] == {"nested": [1, 2]}
    assert "ValueError: boom" in obj["exc"]


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log format 'xml'"):
        configure_logging("info", "xml")


def test_a_key_is_named_by_a_digest_that_does_not_contain_it() -> None:
    name = key_name(b"sk-secret-0123456789")
    assert name.startswith("key-") and len(name) == 12
    assert name == key_name(b"sk-secret-0123456789") != key_name(b"sk-secret-0123456780")
    assert "secret" not in name


def test_the_ledger_counts_the_prompt_once_sums_choices_and_stays_bounded() -> None:
    ledger = RequestLedger(size=2)
    ledger.first_token("r1", 0.30)
    ledger.first_token("r1", 0.10)  # a second choice's first token came earlier... or later
    ledger.usage("r1", "m", prompt=100, cached=64, completion=7)
    ledger.usage("r1", "m", prompt=100, cached=64, completion=5)
    figures = ledger.take("r1")
    assert figures is not None
    assert (figures.model, figures.prompt_tokens, figures.cached_tokens) == ("m", 100, 64)
    assert (figures.completion_tokens, figures.ttft) == (12, 0.10)
    assert ledger.take("r1") is None, "taken once"
    for rid in ("a", "b", "c"):
        ledger.first_token(rid, 1.0)
    assert ledger.take("a") is None, "the oldest entry nobody took was evicted"
    assert ledger.take("c") is not None
