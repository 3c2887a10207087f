"""``deepseek-frontend e2e`` against a real ``deepseek-frontend serve`` (built-in simulated engine).

One server per module, started as a subprocess on a free port with an API key (``tests/support/servers.py``);
the suite runs as a subprocess too, exactly as an operator runs it after a deployment.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deepseek_frontend.e2e.checks import all_checks
from tests.support.servers import free_port, start_frontend, start_sim_engine

API_KEY = "e2e-test-key"
MODEL = "deepseek-ai/DeepSeek-V4-Flash"
SUITE_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """Base URL of a frontend serving the simulated engine, requiring ``API_KEY``."""
    with start_frontend(
        "--served-model-name", MODEL, "--api-key", API_KEY, "--model-alias", "claude-*"
    ) as frontend:
        yield frontend.url


def run_e2e(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DEEPSEEK_FRONTEND_API_KEY"}
    return subprocess.run(
        [sys.executable, "-m", "deepseek_frontend", "e2e", *args],
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT_S,
        env=env,
    )


def json_results(result: subprocess.CompletedProcess[str]) -> list[dict]:
    """The ``results`` of a ``--json -`` run (stdout), failing with the run's stderr when there are none."""
    assert result.stdout.strip(), f"no JSON on stdout (exit {result.returncode}):\n{result.stderr}"
    return json.loads(result.stdout)["results"]


@pytest.fixture(scope="module")
def full_run(
    server: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path_factory.mktemp("e2e") / "results.json"
    result = run_e2e("--base-url", server, "--model", MODEL, "--api-key", API_KEY, "--json", str(out))
    return result, json.loads(out.read_text(encoding="utf-8"))


#: checks of a feature DeepSeek-V4 lacks (it reads no images): skipped on it, with the server's reason
IMAGE_CHECKS = {"image_chat", "anthropic_image", "v41_numeric_effort", "names_image_colour"}


def test_every_protocol_check_passes_against_the_frontend_with_the_simulated_engine(full_run) -> None:
    result, report = full_run
    protocol = {r["name"]: r for r in report["results"] if r["category"] == "protocol"}
    not_passed = {
        name: (r["status"], r["detail"])
        for name, r in protocol.items()
        if r["status"] != "pass" and name not in IMAGE_CHECKS
    }
    assert not_passed == {}, result.stdout
    assert report["protocol_ok"] is True
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_protocol_check_passes_against_a_glob_alias_of_the_model(server: str) -> None:
    """A name the server answers to through ``--model-alias 'claude-*'`` is a valid model for the suite."""
    alias = "claude-sonnet-4-5"
    result = run_e2e("--base-url", server, "--model", alias, "--api-key", API_KEY, "--json", "-")
    statuses = {
        r["name"]: (r["status"], r["detail"]) for r in json_results(result) if r["category"] == "protocol"
    }
    failed = {name: s for name, s in statuses.items() if s[0] != "pass" and name not in IMAGE_CHECKS}
    assert failed == {}, result.stderr
    assert "answered by GET /v1/models/{id}" in statuses["models_list"][1]
    assert result.returncode == 0


def test_json_output_lists_every_check_with_status_latency_and_category(full_run) -> None:
    _, report = full_run
    assert set(report) == {"base_url", "model", "protocol_ok", "summary", "results"}
    assert report["model"] == MODEL
    assert [r["name"] for r in report["results"]] == [c.name for c in all_checks()]
    for entry in report["results"]:
        assert set(entry) == {"name", "category", "status", "latency_ms", "detail"}
        assert entry["category"] in ("protocol", "model-judgement")
        assert entry["status"] in ("pass", "fail", "error", "inconclusive", "skip")
        assert isinstance(entry["latency_ms"], float) and entry["latency_ms"] >= 0
    for category, counts in report["summary"].items():
        in_category = [r for r in report["results"] if r["category"] == category]
        assert sum(counts.values()) == len(in_category)


def test_image_checks_skip_on_a_text_only_model_and_say_why(full_run) -> None:
    result, report = full_run
    statuses = {r["name"]: r for r in report["results"]}
    for name in IMAGE_CHECKS:
        assert statuses[name]["status"] == "skip", statuses[name]
        assert "reads no images" in statuses[name]["detail"], statuses[name]
    # the reason is printed where the operator reads the run
    assert "reads no images" in result.stdout
    # a typed image token is plain text on every model: never skipped
    assert statuses["image_token_as_text"]["status"] == "pass", statuses["image_token_as_text"]


@contextlib.contextmanager
def deployment(setup: str, folder: Path) -> Iterator[tuple[str, str]]:
    """``(base URL, model)`` of one set-up the docs describe, each as docs/serving.md starts it."""
    with contextlib.ExitStack() as stack:
        if setup == "sim-engine worker":
            worker = stack.enter_context(start_sim_engine())
            args = ["--engine", "sglang", "--worker", worker.url]
            model = "deepseek-v4-flash"
        elif setup == "prefill/decode pair":
            prefill = stack.enter_context(
                start_sim_engine("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0")
            )
            decode = stack.enter_context(start_sim_engine("--disaggregation-mode", "decode"))
            args = ["--prefill-worker", prefill.url, "--decode-worker", decode.url]
            model = "deepseek-v4-flash"
        else:  # DeepSeek-V4.1 on the simulated engine, named in a --config file
            model = "deepseek-v4.1-flash"
            config = folder / "models.yaml"
            config.write_text(f"models:\n  - name: {model}\n", encoding="utf-8")
            args = ["--config", str(config)]
        frontend = stack.enter_context(start_frontend(*args, "--api-key", API_KEY))
        yield frontend.url, model


@pytest.mark.parametrize("setup", ["sim-engine worker", "prefill/decode pair", "V4.1 from --config"])
def test_every_protocol_check_passes_on_each_documented_setup(setup: str, tmp_path: Path) -> None:
    """The set-ups of docs/serving.md and docs/routing.md besides ``serve`` alone (``full_run``): a
    ``sim-engine`` behind ``--worker`` and a prefill/decode pair of them deliver engine output that is
    already waiting as one delta; V4.1 reads images, so its image checks pass instead of skipping."""
    with deployment(setup, tmp_path) as (url, model):
        result = run_e2e(
            "--base-url", url, "--model", model, "--api-key", API_KEY, "--category", "protocol", "--json", "-"
        )
    statuses = {r["name"]: (r["status"], r["detail"]) for r in json_results(result)}
    expected_skips = IMAGE_CHECKS if model == "deepseek-v4-flash" else set()
    not_passed = {
        name: status
        for name, status in statuses.items()
        if status[0] != ("skip" if name in expected_skips else "pass")
    }
    assert not_passed == {}, result.stderr
    assert result.returncode == 0


def test_model_judgement_checks_are_reported_apart_from_protocol_checks(full_run) -> None:
    result, report = full_run
    judgement = [r for r in report["results"] if r["category"] == "model-judgement"]
    assert len(judgement) >= 5
    # The simulated engine is not a model: it cannot do arithmetic, which must not fail the run.
    assert {r["name"]: r["status"] for r in judgement}["answers_arithmetic"] == "fail"
    out = result.stdout
    assert (
        out.index("Protocol checks")
        < out.index("Model-judgement checks")
        < out.index("PASS: protocol conformance")
    )


def test_progress_lines_appear_for_every_check_before_the_summary(full_run) -> None:
    result, _ = full_run
    lines = result.stdout.splitlines()
    progress = [line for line in lines if line.startswith("[")]
    assert len(progress) == len(all_checks())
    assert all(" ms" in line for line in progress)
    assert lines.index(progress[-1]) < lines.index("Protocol checks")


def test_a_missing_api_key_fails_the_protocol_checks_with_a_nonzero_exit(server: str) -> None:
    result = run_e2e("--base-url", server, "--model", MODEL, "--only", "plain_chat", "--json", "-")
    assert result.returncode == 1
    (entry,) = json_results(result)
    assert entry["status"] == "error" and "401" in entry["detail"]


def test_a_wrong_model_name_fails_the_models_list_check(server: str) -> None:
    result = run_e2e("--base-url", f"{server}/v1", "--model", "no-such-model", "--api-key", API_KEY,
                     "--only", "models_list", "--json", "-")  # fmt: skip
    assert result.returncode == 1
    (entry,) = json_results(result)
    assert entry["status"] == "fail" and "no-such-model" in entry["detail"]


def test_an_unreachable_endpoint_is_reported_as_errors_not_a_crash() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = run_e2e(
        "--base-url", url, "--model", MODEL, "--only", "models_list", "--timeout", "5", "--json", "-"
    )
    assert result.returncode == 1
    (entry,) = json_results(result)
    assert entry["status"] == "error" and "Connection" in entry["detail"]


def test_unknown_check_names_and_missing_flags_are_usage_errors() -> None:
    assert run_e2e("--base-url", "http://x", "--model", MODEL, "--only", "nope").returncode == 2
    assert run_e2e("--model", MODEL).returncode == 2


def test_list_names_every_check_with_its_category() -> None:
    result = run_e2e("--list")
    assert result.returncode == 0
    listed = [line.split()[:2] for line in result.stdout.splitlines()]
    assert listed == [[c.name, c.category] for c in all_checks()]


def test_checks_cover_the_scenarios_the_issue_requires() -> None:
    names = {c.name for c in all_checks() if c.category == "protocol"}
    assert names >= {
        "models_list", "plain_chat", "stream_chunk_shape", "reasoning_split", "thinking_off", "tool_required",
        "tool_auto_stream", "parallel_tool_calls", "tool_argument_types", "special_characters",
        "tool_without_parameters", "tool_result_round_trip", "tool_choice_none", "stream_usage",
        "anthropic_tool_round_trip",
    }  # fmt: skip
