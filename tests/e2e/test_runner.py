"""The suite runner classifies outcomes and decides the exit status the way operators rely on."""

from __future__ import annotations

import io

import pytest

from deepseek_frontend.e2e.command import normalize_base_url
from deepseek_frontend.e2e.runner import (
    Check,
    CheckFailed,
    Inconclusive,
    Skipped,
    SuiteReport,
    format_table,
    run_check,
    run_suite,
)


def _passing(ctx: object) -> str:
    return "fine"


def _failing(ctx: object) -> str:
    raise CheckFailed("finish_reason 'length', expected stop")


def _bare_assert(ctx: object) -> str:
    value = 2
    assert value == 3
    return "unreachable"


def _inconclusive(ctx: object) -> str:
    raise Inconclusive("the model answered in text")


def _broken_transport(ctx: object) -> str:
    raise ConnectionError("connection refused")


def _skipped(ctx: object) -> str:
    raise Skipped("the model reads no images: messages[0].content[1].type: text only")


def test_outcomes_are_classified_as_pass_fail_error_and_inconclusive() -> None:
    statuses = {
        fn.__name__: run_check(Check(fn.__name__, "protocol", "", fn), None).status
        for fn in (_passing, _failing, _bare_assert, _inconclusive, _broken_transport, _skipped)
    }
    assert statuses == {
        "_passing": "pass",
        "_failing": "fail",
        "_bare_assert": "fail",
        "_inconclusive": "inconclusive",
        "_broken_transport": "error",
        "_skipped": "skip",
    }


def test_a_skip_keeps_its_reason() -> None:
    result = run_check(Check("x", "protocol", "", _skipped), None)
    assert result.status == "skip" and result.detail.startswith("the model reads no images")


def test_a_bare_assert_reports_the_failing_line() -> None:
    result = run_check(Check("x", "protocol", "", _bare_assert), None)
    assert "== 3" in result.detail  # the failed comparison, however the assert was compiled


def test_errors_name_the_exception_type() -> None:
    result = run_check(Check("x", "protocol", "", _broken_transport), None)
    assert result.detail == "ConnectionError: connection refused"


@pytest.mark.parametrize(
    ("protocol_fn", "judgement_fn", "ok"),
    [
        (_passing, _failing, True),  # a model-judgement failure never fails the run
        (_inconclusive, _passing, True),  # the model did not cooperate: not a protocol failure
        (_skipped, _passing, True),  # the model lacks the feature (no images): not a protocol failure
        (_failing, _passing, False),
        (_broken_transport, _passing, False),
    ],
)
def test_only_protocol_failures_and_errors_fail_the_run(protocol_fn, judgement_fn, ok: bool) -> None:
    checks = [Check("p", "protocol", "", protocol_fn), Check("j", "model-judgement", "", judgement_fn)]
    report = run_suite(checks, None, base_url="http://h", model="m")
    assert report.protocol_ok is ok
    assert report.to_json()["protocol_ok"] is ok


def test_progress_prints_one_line_per_check_as_it_finishes() -> None:
    out = io.StringIO()
    checks = [Check("first", "protocol", "", _passing), Check("second", "protocol", "", _failing)]
    run_suite(checks, None, base_url="http://h", model="m", progress=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[ 1/2] first") and " PASS " in lines[0]
    assert lines[1].startswith("[ 2/2] second") and " FAIL " in lines[1] and "expected stop" in lines[1]


def test_summary_table_separates_categories_and_states_the_verdict() -> None:
    checks = [Check("p", "protocol", "", _passing), Check("j", "model-judgement", "", _failing)]
    report = run_suite(checks, None, base_url="http://h", model="m")
    table = format_table(report)
    assert table.index("Protocol checks") < table.index("Model-judgement checks")
    assert table.splitlines()[-1] == "PASS: protocol conformance of m at http://h"
    row = next(line for line in table.splitlines() if line.strip().startswith("j "))
    assert "fail" in row and " ms" in row


def test_long_details_are_truncated_in_the_table_but_kept_in_json() -> None:
    detail = "x" * 200

    def long_fail(ctx: object) -> str:
        raise CheckFailed(detail)

    report = run_suite([Check("p", "protocol", "", long_fail)], None, base_url="u", model="m")
    assert detail not in format_table(report)
    assert report.to_json()["results"][0]["detail"] == detail


def test_an_empty_report_counts_nothing() -> None:
    report = SuiteReport(base_url="u", model="m", results=())
    assert report.protocol_ok is True
    assert report.counts("protocol") == {"pass": 0, "fail": 0, "error": 0, "inconclusive": 0, "skip": 0}


@pytest.mark.parametrize(
    ("given", "root"),
    [
        ("http://h:8000", "http://h:8000"),
        ("http://h:8000/", "http://h:8000"),
        ("http://h:8000/v1", "http://h:8000"),
        ("http://h:8000/v1/", "http://h:8000"),
        ("https://api.example.com/deepseek/v1", "https://api.example.com/deepseek"),
    ],
)
def test_base_urls_with_or_without_v1_reach_the_same_root(given: str, root: str) -> None:
    assert normalize_base_url(given) == root
