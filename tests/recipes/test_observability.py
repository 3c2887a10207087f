"""The recipes' Grafana dashboard and Prometheus alerts query only what ``/metrics`` really exports, and
``serve --log-format json`` writes one JSON object per line with a request's model, key, tokens and timings.

Two real servers are scraped: ``serve`` over a sim-engine worker (with an API key and admission limits
tight enough that a second concurrent request gets a 429) and ``serve`` over a prefill and a decode
sim-engine (the PD families). Every metric name in every panel query and alert expression must be a
sample name one of the scrapes holds (histograms as ``_bucket``), and every label a matcher or a
``by``/``on`` list names must be one that metric (or, for grouping, some metric) carries.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import Server, start_frontend, start_sim_engine

from .promql_names import PromQLError, names

pytestmark = pytest.mark.slow

OBSERVABILITY = Path(__file__).resolve().parents[2] / "recipes" / "observability"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"
RULES = OBSERVABILITY / "prometheus-rules.yaml"
API_KEY = "sk-observability-test-0123456789abcdef"
#: labels Prometheus adds to every scraped series (the target's), usable in on/by lists
TARGET_LABELS = {"job", "instance"}
MODEL = "obs-test-model"
MESSAGES = [{"role": "user", "content": "Write forty words about the sea."}]

Exported = dict[str, set[str]]  # sample name -> label names


def scrape(server: Server, headers: dict[str, str] | None = None) -> Exported:
    text = httpx.get(server.url + "/metrics", headers=headers, timeout=10).text
    out: Exported = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def problems(expr: str, exported: Exported) -> list[str]:
    """What in ``expr`` the scrape does not export ([] when every name and label is exported)."""
    try:
        found = names(expr)
    except PromQLError as exc:
        return [str(exc)]
    out = []
    for metric, labels in found.selectors:
        if metric not in exported:
            out.append(f"metric {metric!r} is not exported")
            continue
        out.extend(f"{metric} has no label {label!r}" for label in labels if label not in exported[metric])
    every_label = set().union(*exported.values()) | TARGET_LABELS
    out.extend(f"no metric has the label {label!r}" for label in sorted(found.grouping - every_label))
    return out


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def rule_exprs(rules: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


@pytest.fixture(scope="module")
def aggregated() -> Iterator[tuple[Server, Exported, str]]:
    """The server, its scrape, and the id of a streamed request that ran while another was refused."""
    with (
        start_sim_engine("--itl-ms", "50") as worker,
        start_frontend(
            "--worker", worker.url, "--api-key", API_KEY, "--log-format", "json",
            "--served-model-name", MODEL, "--max-concurrent-requests", "1", "--max-queued-requests", "0",
        ) as fe,
    ):  # fmt: skip
        auth = {"Authorization": f"Bearer {API_KEY}"}
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 100, "stream": True}
        with httpx.stream(
            "POST", fe.url + "/v1/chat/completions", json=body, headers=auth, timeout=30
        ) as first:
            assert first.status_code == 200
            streamed_id = first.headers["x-request-id"]
            lines = first.iter_lines()  # kept: a dropped iterator would close the stream
            next(lines)  # admitted and streaming: the one slot is taken
            second = httpx.post(fe.url + "/v1/chat/completions", json={**body, "stream": False}, headers=auth)
            assert second.status_code == 429, second.text
            for _ in lines:
                pass
        done = httpx.post(fe.url + "/v1/chat/completions", json={**body, "stream": False}, headers=auth)
        assert done.status_code == 200, done.text
        yield fe, scrape(fe, auth), streamed_id


@pytest.fixture(scope="module")
def disaggregated() -> Iterator[Exported]:
    with (
        start_sim_engine("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0") as p,
        start_sim_engine("--disaggregation-mode", "decode") as d,
        start_frontend(
            "--prefill-worker", p.url, "--decode-worker", d.url, "--health-check-interval", "300"
        ) as fe,
    ):
        model = httpx.get(fe.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        body = {"model": model, "messages": MESSAGES, "max_tokens": 8}
        assert httpx.post(fe.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        yield scrape(fe)


@pytest.fixture(scope="module")
def exported(aggregated: tuple[Server, Exported, str], disaggregated: Exported) -> Exported:
    out: Exported = {}
    for scraped in (aggregated[1], disaggregated):
        for name, labels in scraped.items():
            out.setdefault(name, set()).update(labels)
    return out


def test_every_dashboard_query_names_only_exported_metrics_and_labels(exported: Exported) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) >= 15
    for title, expr in exprs:
        assert problems(expr, exported) == [], f"panel {title!r}: {expr}"
        # per model: filtered by the dashboard's model variable, one series per model
        assert 'model_info{model=~"$model"}' in expr and "model" in names(expr).grouping, title
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids), "panel ids are unique"
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "model"]
    assert problems(variable["definition"].removeprefix("label_values(").split(",")[0], exported) == []


def test_every_alert_names_only_exported_metrics_and_labels(exported: Exported) -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = rule_exprs(rules)
    assert len({name for name, _ in alerts}) == len(alerts) >= 6, "alert names are unique"
    for name, expr in alerts:
        assert problems(expr, exported) == [], f"alert {name}: {expr}"


def test_every_alert_is_per_model_and_well_formed() -> None:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
            assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
            found = names(rule["expr"])
            assert "model" in found.grouping, f"{rule['alert']} does not keep the model label"
            # a template may only name labels the alert's series keep (its outermost by-list)
            for label in re.findall(r"\$labels\.(\w+)", rule["annotations"]["summary"]):
                assert label in found.grouping, f"{rule['alert']}: {label} is not in the expression"


def test_a_renamed_metric_or_label_fails_the_check(exported: Exported) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    renamed = copy.deepcopy(dashboard)
    ttft = "deepseek_frontend_time_to_first_token_seconds_bucket"
    for panel in renamed["panels"]:
        for target in panel["targets"]:
            target["expr"] = target["expr"].replace(ttft, "deepseek_frontend_ttft_seconds_bucket")
            target["expr"] = target["expr"].replace("error_type!=", "error_kind!=")
    found = [p for _, expr in dashboard_exprs(renamed) for p in problems(expr, exported)]
    assert "metric 'deepseek_frontend_ttft_seconds_bucket' is not exported" in found
    assert "deepseek_frontend_requests_total has no label 'error_kind'" in found
    # the same check against an exposition that lost a metric (a rename in the server)
    lost = {name: labels for name, labels in exported.items() if not name.startswith(ttft)}
    assert any(problems(expr, lost) for _, expr in dashboard_exprs(dashboard))
    assert problems("sum(rat(deepseek_frontend_requests_total[5m]))", exported)
    assert problems("sum(rate(deepseek_frontend_requests_total[5m])", exported)


def test_the_model_info_metric_names_the_served_model(aggregated: tuple[Server, Exported, str]) -> None:
    fe, _, _ = aggregated
    auth = {"Authorization": f"Bearer {API_KEY}"}
    served = httpx.get(fe.url + "/v1/models", headers=auth, timeout=10).json()["data"][0]["id"]
    text = httpx.get(fe.url + "/metrics", headers=auth, timeout=10).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "deepseek_frontend_model_info"]
    assert [(s.labels, s.value) for s in family.samples] == [({"model": served}, 1.0)]


def test_json_logs_have_one_line_per_request_with_model_key_tokens_and_timings(
    aggregated: tuple[Server, Exported, str],
) -> None:
    fe, _, streamed_id = aggregated
    auth = {"Authorization": f"Bearer {API_KEY}"}
    served = httpx.get(fe.url + "/v1/models", headers=auth, timeout=10).json()["data"][0]["id"]
    body = {"model": served, "messages": MESSAGES, "max_tokens": 12}
    answer = httpx.post(fe.url + "/v1/chat/completions", json=body, headers=auth, timeout=30)
    assert answer.status_code == 200
    request_id = answer.headers["x-request-id"]
    lines = [line for line in fe.log().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(records) == len(lines), "every log line is a JSON object"
    (done,) = [r for r in records if r.get("request_id") == request_id and r["message"] == "request done"]
    usage = answer.json()["usage"]
    assert done["model"] == served
    assert done["key_name"] == "key-" + hashlib.sha256(API_KEY.encode()).hexdigest()[:8]
    assert done["status"] == 200 and done["endpoint"] == "/v1/chat/completions"
    assert done["prompt_tokens"] == usage["prompt_tokens"]
    assert done["completion_tokens"] == usage["completion_tokens"] == 12
    assert done["cached_tokens"] == (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    assert 0 < done["ttft_seconds"] <= done["seconds"]
    assert API_KEY not in fe.log(), "the key itself is never logged"
    (streamed,) = [r for r in records if r.get("request_id") == streamed_id]
    assert streamed["status"] == 200 and streamed["completion_tokens"] > 0
    assert 0 < streamed["ttft_seconds"] < streamed["seconds"], "a stream's first token comes before its end"
    refused = [r for r in records if r["message"] == "request done" and r["status"] == 429]
    assert refused and refused[0]["error_type"] != "-" and refused[0]["key_name"] == done["key_name"]
