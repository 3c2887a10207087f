"""The recipes' Grafana dashboard and Prometheus alerts query only what ``/metrics`` really exports, and
``serve --log-format json`` writes one JSON object per line with a request's model, key, tokens and timings.

Three real servers are scraped: ``serve`` over a sim-engine worker (with an API key and admission limits
tight enough that a second concurrent request gets a 429), ``serve`` over a prefill and a decode
sim-engine (the PD families), and ``serve --config`` with two models on the built-in simulated engine in
two processes (``--workers 2``: the ``process`` label), with an API key whose requests per minute refuse
a third request (the per-key families). Every metric name in every panel query and alert expression must
be a sample name one of the scrapes holds (histograms as ``_bucket``), and every label a matcher or a
``by``/``on``/``without`` list names must be one that metric (or, for grouping, some metric) carries.
A series of a model's own state carries ``model``: per-model panels filter on it directly.
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
from tests.support.waiting import wait_until

from .promql_names import PromQLError, names

pytestmark = pytest.mark.slow

OBSERVABILITY = Path(__file__).resolve().parents[2] / "recipes" / "observability"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"
RULES = OBSERVABILITY / "prometheus-rules.yaml"
API_KEY = "sk-observability-test-0123456789abcdef"
#: labels Prometheus adds to every scraped series (the target's), usable in on/by lists
TARGET_LABELS = {"job", "instance"}
MODEL = "obs-test-model"
TWO_MODELS = ("obs-alpha", "obs-beta")
ALICE_KEY = "sk-observability-alice-0123456789abcdef"
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
    for selector in found.selectors:
        metric = selector.metric
        if metric not in exported:
            out.append(f"metric {metric!r} is not exported")
            continue
        out.extend(
            f"{metric} has no label {label!r}" for label in selector.labels if label not in exported[metric]
        )
    every_label = set().union(*exported.values()) | TARGET_LABELS
    out.extend(f"no metric has the label {label!r}" for label in sorted(found.grouping - every_label))
    return out


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", ())]


def query_variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"] if v["type"] == "query"}


def model_labelled(exported: Exported) -> set[str]:
    """The sample names the server exports with a ``model`` label (a model's own state)."""
    return {name for name, labels in exported.items() if "model" in labels}


def matches_empty(op: str, value: str) -> bool:
    """Whether the matcher ``label op "value"`` selects a series without ``label``."""
    if op in ("=~", "!~"):
        return (re.fullmatch(value, "") is not None) == (op == "=~")
    return (value == "") == (op == "=")


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


def processes_in_metrics(server: Server) -> set[str]:
    """The ``process`` labels of the model-info series one scrape of ``server`` returns."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    info = [f for f in text_string_to_metric_families(text) if f.name == "deepseek_frontend_model_info"]
    return {s.labels.get("process", "") for f in info for s in f.samples}


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``serve --config`` with two models and one key, after one request to each model and one refused."""
    config = tmp_path_factory.mktemp("two-models") / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "models": [{"name": name} for name in TWO_MODELS],
                "keys": [{"name": "alice", "key": ALICE_KEY, "requests_per_minute": 2}],
            }
        ),
        encoding="utf-8",
    )
    with start_frontend("--config", str(config), "--workers", "2") as fe:
        auth = {"Authorization": f"Bearer {ALICE_KEY}"}
        for model, status in ((TWO_MODELS[0], 200), (TWO_MODELS[1], 200), (TWO_MODELS[0], 429)):
            body = {"model": model, "messages": MESSAGES, "max_tokens": 4}
            answer = httpx.post(fe.url + "/v1/chat/completions", json=body, headers=auth, timeout=30)
            assert answer.status_code == status, answer.text
        # a scrape holds both processes' series once each serves (the one scraped fetches its sibling's)
        wait_until(
            lambda: processes_in_metrics(fe) == {"0", "1"}, "both processes are in /metrics", timeout=30
        )
        yield fe


@pytest.fixture(scope="module")
def exported(
    aggregated: tuple[Server, Exported, str], disaggregated: Exported, two_models: Server
) -> Exported:
    out: Exported = {}
    for scraped in (aggregated[1], disaggregated, scrape(two_models)):
        for name, labels in scraped.items():
            out.setdefault(name, set()).update(labels)
    return out


def test_every_dashboard_query_names_only_exported_metrics_and_labels(exported: Exported) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) >= 30
    for title, expr in exprs:
        assert problems(expr, exported) == [], f"panel {title!r}: {expr}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids), "panel ids are unique"
    variables = query_variables(dashboard)
    assert {"model", "key"} <= set(variables)
    for name, variable in variables.items():
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"]).groups()
        assert problems(f'{metric}{{{label}=""}}', exported) == [], f"variable {name}"


def test_every_per_model_panel_filters_on_the_model_variable_and_groups_by_model(exported: Exported) -> None:
    """A series of a model's own state carries ``model``; the server's own copies carry none. So every
    selector of a metric the server labels with ``model`` picks models with ``model=~"$model"`` (or the
    server's own series with ``model=""``), never both in one panel, and a per-model panel keeps one
    series per model."""
    dashboard = json.loads(DASHBOARD.read_text())
    labelled = model_labelled(exported)
    per_model, server_wide = [], []
    for panel in (p for p in dashboard["panels"] if p["type"] != "row"):
        found = [(t["expr"], names(t["expr"])) for t in panel["targets"]]
        filters = {
            tuple(s.matchers_of("model")) for _, n in found for s in n.selectors if s.metric in labelled
        }
        assert filters <= {(("=~", "$model"),), (("=", ""),)}, f"{panel['title']}: model matchers {filters}"
        assert len(filters) <= 1, f"{panel['title']} mixes models and the server's own series"
        if filters == {(("=~", "$model"),)}:
            per_model.append(panel["title"])
            for expr, n in found:
                assert "model" in n.grouping, f"{panel['title']}: {expr} does not keep the model label"
        else:
            server_wide.extend(s.metric for _, n in found for s in n.selectors)
    assert len(per_model) >= 17, per_model
    assert {"Requests/s by key", "Tokens/s by key"} <= set(per_model)
    # the keys' 429s by limit and the reloads belong to no model
    for metric in ("deepseek_frontend_key_rate_limited_total", "deepseek_frontend_config_reloads_total"):
        assert metric in server_wide, metric
    for name, variable in query_variables(dashboard).items():
        # "All" must not also match the series without the label (".*" would: one more, empty, model)
        assert re.fullmatch(variable["allValue"], "") is None, name
        assert re.fullmatch(variable["allValue"], "deepseek-v4-flash"), name


def test_every_alert_names_only_exported_metrics_and_labels(exported: Exported) -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = rule_exprs(rules)
    assert len({name for name, _ in alerts}) == len(alerts) >= 9, "alert names are unique"
    for name, expr in alerts:
        assert problems(expr, exported) == [], f"alert {name}: {expr}"


def test_every_alert_is_per_model_or_per_pod_and_well_formed(exported: Exported) -> None:
    labelled = model_labelled(exported)
    per_model = []
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
            assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
            found = names(rule["expr"])
            model_selectors = [s for s in found.selectors if s.metric in labelled]
            if model_selectors:
                per_model.append(rule["alert"])
                assert "model" in found.grouping, f"{rule['alert']} does not keep the model label"
                for selector in model_selectors:
                    # the server's own copies (no model label) would add an alert for no model
                    assert any(not matches_empty(op, value) for op, value in selector.matchers_of("model")), (
                        f"{rule['alert']}: {selector.metric} also selects the series without a model"
                    )
            else:
                assert "instance" in found.grouping, f"{rule['alert']} does not name its frontend pod"
            # a template may only name labels the alert's series keep (its outermost by-list)
            for label in re.findall(r"\$labels\.(\w+)", rule["annotations"]["summary"]):
                assert label in found.grouping, f"{rule['alert']}: {label} is not in the expression"
    assert len(per_model) >= 8, per_model
    assert any("config_reloads_total" in expr for _, expr in rule_exprs(yaml.safe_load(RULES.read_text())))


def test_worker_health_gauges_are_folded_over_processes_not_summed() -> None:
    """Every process of ``serve --workers N`` checks the same engine workers and exports its own copy
    of their health: summing the copies would count each worker N times."""
    exprs = dashboard_exprs(json.loads(DASHBOARD.read_text())) + rule_exprs(yaml.safe_load(RULES.read_text()))
    for metric in ("deepseek_frontend_worker_healthy", "deepseek_frontend_pd_role_healthy_workers"):
        uses = 0
        for where, expr in exprs:
            occurrences = len(re.findall(rf"\b{metric}\b", expr))
            folded = [
                m
                for m in re.finditer(
                    rf"max (?:without \((?P<without>[^)]*)\)|by \((?P<by>[^)]*)\)) \({metric}\b", expr
                )
                if ("process" in re.split(r"\s*,\s*", m["without"] or ""))
                or (m["by"] is not None and "process" not in re.split(r"\s*,\s*", m["by"]))
            ]
            assert len(folded) == occurrences, f"{where}: {metric} is not folded with max: {expr}"
            uses += occurrences
        assert uses >= 2, f"{metric} is on the dashboard and in an alert"


def test_a_renamed_metric_or_label_fails_the_check(exported: Exported) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    renamed = copy.deepcopy(dashboard)
    ttft = "deepseek_frontend_time_to_first_token_seconds_bucket"
    for panel in renamed["panels"]:
        for target in panel.get("targets", ()):
            target["expr"] = target["expr"].replace(ttft, "deepseek_frontend_ttft_seconds_bucket")
            target["expr"] = target["expr"].replace("error_type!=", "error_kind!=")
            target["expr"] = target["expr"].replace("by (key, limit)", "by (api_key, limit)")
    found = [p for _, expr in dashboard_exprs(renamed) for p in problems(expr, exported)]
    assert "metric 'deepseek_frontend_ttft_seconds_bucket' is not exported" in found
    assert "deepseek_frontend_requests_total has no label 'error_kind'" in found
    assert "no metric has the label 'api_key'" in found
    # the same check against an exposition that lost a metric (a rename in the server)
    lost = {name: labels for name, labels in exported.items() if not name.startswith(ttft)}
    assert any(problems(expr, lost) for _, expr in dashboard_exprs(dashboard))
    assert problems("sum(rat(deepseek_frontend_requests_total[5m]))", exported)
    assert problems("sum(rate(deepseek_frontend_requests_total[5m])", exported)


def test_a_two_model_server_labels_each_models_series_and_its_keys_usage(two_models: Server) -> None:
    """What the dashboard's variables and key panels read, from ``serve --config`` with two models in
    two processes after one request to each model and one refused by the key's requests per minute."""
    text = httpx.get(two_models.url + "/metrics", timeout=10).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def values(sample: str, *labels: str) -> dict[tuple[str, ...], float]:
        """The samples called ``sample`` summed by ``labels`` (those without one of them left out)."""
        out: dict[tuple[str, ...], float] = {}
        for s in samples:
            if s.name == sample and all(label in s.labels for label in labels):
                at = tuple(s.labels[label] for label in labels)
                out[at] = out.get(at, 0.0) + s.value
        return out

    info = values("deepseek_frontend_model_info", "model", "process")
    assert info == {(m, p): 1.0 for m in TWO_MODELS for p in ("0", "1")}
    requests = values("deepseek_frontend_requests_total", "model", "status")
    assert requests == {(TWO_MODELS[0], "200"): 1.0, (TWO_MODELS[1], "200"): 1.0, (TWO_MODELS[0], "429"): 1.0}
    by_key = values("deepseek_frontend_key_requests_total", "key", "model", "status")
    assert by_key == {("alice", TWO_MODELS[0], "200"): 1.0, ("alice", TWO_MODELS[1], "200"): 1.0,
                      ("alice", TWO_MODELS[0], "429"): 1.0}  # fmt: skip
    output = values("deepseek_frontend_key_output_tokens_total", "key", "model")
    assert output == {("alice", TWO_MODELS[0]): 4.0, ("alice", TWO_MODELS[1]): 4.0}
    limited = values("deepseek_frontend_key_rate_limited_total", "key", "limit")
    assert limited == {("alice", "requests"): 1.0}
    reloads = values("deepseek_frontend_config_reloads_total", "result")
    assert reloads == {("applied",): 0.0, ("refused",): 0.0}


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
