"""Which model names a server answers, and what a client that sends another one is told.

* ``serve`` with the built-in simulated engine and no ``--model-alias`` also answers ``claude-*``
  and ``gpt-*`` (what agent CLIs and SDK examples send); real workers, an explicit
  ``--model-alias`` or a ``--config`` file answer only the names they are given.
* A name the server does not answer -- or one the API key may not use -- is a 404 in each API's
  own shape that names the served models the key may use, the glob aliases it answers, and the
  ``--model-alias`` flag that would make the server answer it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from deepseek_frontend.fleet.config_file import Fleet, fleet_from_args
from deepseek_frontend.server import serve_command
from deepseek_frontend.server.app import create_app
from deepseek_frontend.server.serve_flags import flag_actions
from deepseek_frontend.tokenization import PromptTokenizer

SERVED = "deepseek-v4-flash"
ANTHROPIC = {"anthropic-version": "2023-06-01"}
HI = [{"role": "user", "content": "Reply with exactly: hi"}]


def load(*argv: str) -> Fleet:
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    return fleet_from_args(parser.parse_args(["--state-store", "none", *argv]), flag_actions())


def aliases(fleet: Fleet) -> list[list[str]]:
    return [[a.pattern for a in m.model.model_aliases] for m in fleet.models]


def test_the_simulated_engine_answers_claude_and_gpt_names_by_default() -> None:
    assert aliases(load()) == [["claude-*", "gpt-*"]]
    assert aliases(load("--engine", "sim")) == [["claude-*", "gpt-*"]]


def test_real_workers_an_explicit_alias_or_a_config_file_get_only_the_names_given(tmp_path: Path) -> None:
    assert aliases(load("--worker", "http://127.0.0.1:9")) == [[]]
    assert aliases(load("--model-alias", "ds")) == [["ds"]]  # the flag replaces the default
    config = tmp_path / "models.yaml"
    config.write_text(f"models:\n  - name: {SERVED}\n  - name: other\n    aliases: ['claude-*']\n")
    assert aliases(load("--config", str(config))) == [[], ["claude-*"]]


@pytest.fixture(scope="module")
def quick_start(prompt_tokenizer: PromptTokenizer) -> Iterator[TestClient]:
    """``deepseek-frontend serve`` as the README starts it: no flags."""
    fleet = load()
    with TestClient(create_app(fleet.models[0], fleet=fleet, tokenizer=prompt_tokenizer)) as client:
        yield client


def test_the_quick_start_server_answers_claude_code_and_openai_names_echoing_them(
    quick_start: TestClient,
) -> None:
    message = quick_start.post(
        "/v1/messages",
        headers=ANTHROPIC,
        json={"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": HI},
    )
    assert message.status_code == 200 and message.json()["model"] == "claude-sonnet-4-5"
    chat = quick_start.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": HI})
    assert chat.status_code == 200 and chat.json()["model"] == "gpt-4o"
    assert chat.json()["choices"][0]["message"]["content"] == "hi"
    # /v1/models lists the served name; a glob is a set of names, answered by GET /v1/models/{id}
    assert [m["id"] for m in quick_start.get("/v1/models").json()["data"]] == [SERVED]
    assert quick_start.get("/v1/models/claude-opus-4-1").json()["id"] == "claude-opus-4-1"


#: (method, path, body, headers) per API a client may name a model on
UNKNOWN_MODEL_REQUESTS: list[tuple[str, str, dict[str, Any] | None, dict[str, str]]] = [
    ("POST", "/v1/chat/completions", {"model": "gemini-pro", "messages": HI}, {}),
    ("POST", "/v1/completions", {"model": "gemini-pro", "prompt": "hi"}, {}),
    ("POST", "/v1/responses", {"model": "gemini-pro", "input": "hi"}, {}),
    ("POST", "/v1/messages", {"model": "gemini-pro", "max_tokens": 8, "messages": HI}, ANTHROPIC),
    ("POST", "/v1/messages/count_tokens", {"model": "gemini-pro", "messages": HI}, ANTHROPIC),
    ("GET", "/v1/models/gemini-pro", None, {}),
    ("GET", "/v1/models/gemini-pro", None, ANTHROPIC),
]


def error_of(response: Any, anthropic: bool) -> dict[str, Any]:
    """The error object of a 404 in the API's shape (OpenAI ``{"error"}``, Anthropic's ``type: error``)."""
    body = response.json()
    if anthropic:
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error", body
        return body["error"]
    assert body["error"]["type"] == "not_found_error" and body["error"]["code"] == "model_not_found", body
    assert body["error"]["param"] == "model"
    return body["error"]


@pytest.mark.parametrize(("method", "path", "body", "headers"), UNKNOWN_MODEL_REQUESTS)
def test_an_unknown_model_is_a_404_naming_the_served_models_and_the_alias_flag(
    quick_start: TestClient, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str]
) -> None:
    response = quick_start.request(method, path, json=body, headers=headers)
    assert response.status_code == 404, response.text
    message = error_of(response, anthropic=bool(headers))["message"]
    assert "'gemini-pro'" in message
    assert f"serves '{SERVED}' and any name matching 'claude-*' or 'gpt-*'" in message
    assert "--model-alias" in message


def test_the_404_names_only_the_models_the_api_key_may_use(
    tmp_path: Path, prompt_tokenizer: PromptTokenizer
) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(
        "models:\n"
        f"  - name: {SERVED}\n    aliases: ['claude-*']\n"
        "  - name: secret-model\n    aliases: ['gpt-*']\n"
        f"keys:\n  - {{name: alice, key: sk-alice, models: [{SERVED}]}}\n"
        "  - {name: root, key: sk-root}\n",
        encoding="utf-8",
    )
    fleet = load("--config", str(config))
    with TestClient(create_app(fleet.models[0], fleet=fleet, tokenizer=prompt_tokenizer)) as client:
        for asked in ("gemini-pro", "secret-model", "gpt-4o"):  # another key's models do not exist
            response = client.post(
                "/v1/chat/completions",
                headers={"Authorization": "Bearer sk-alice"},
                json={"model": asked, "messages": HI},
            )
            assert response.status_code == 404
            answered = error_of(response, anthropic=False)["message"].split(". To answer")[0]
            served = f"this server serves '{SERVED}' and any name matching 'claude-*'"
            assert answered == f"The model '{asked}' does not exist: {served}"
        everything = client.post(
            "/v1/messages",
            headers={"x-api-key": "sk-root", **ANTHROPIC},
            json={"model": "gemini-pro", "max_tokens": 8, "messages": HI},
        )
        message = error_of(everything, anthropic=True)["message"]
        assert f"serves '{SERVED}', 'secret-model' and any name matching 'claude-*' or 'gpt-*'" in message
