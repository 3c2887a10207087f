"""DeepSeek-V4.1 served end to end: detection, tokenizer rules, reasoning effort on every API.

The frontend runs as its own process over a separate sim-engine process (real HTTP,
SGLang protocol). Real workers need the checkpoint's tokenizer, so the test builds a
checkpoint directory whose ``tokenizer.json`` is the V4.1 stand-in.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deepseek_frontend.errors import UnsupportedModelError
from deepseek_frontend.fleet.config import ServerConfig
from deepseek_frontend.server import serve_command
from deepseek_frontend.tokenization import (
    PromptTokenizer,
    bundled_tokenizer_path,
    v41_stand_in_tokenizer_json,
)
from tests.support.checkpoints import v41_checkpoint
from tests.support.servers import Server, start_frontend, start_sim_engine

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_v41_is_served_on_the_simulated_engine_without_a_checkpoint() -> None:
    config = ServerConfig.from_args(parse("--served-model-name", "deepseek-v4.1-flash"))
    assert config.model.family == "deepseek_v41" and config.model.reasoning_effort_profile == "release"


def test_real_workers_need_the_checkpoint_tokenizer(tmp_path: Path) -> None:
    model = v41_checkpoint(tmp_path / "DeepSeek-V4.1-Flash", tokenizer=False)
    with pytest.raises(UnsupportedModelError, match=r"--model-path.*tokenizer\.json"):
        ServerConfig.from_args(parse("--model-path", str(model), "--worker", "http://127.0.0.1:9"))
    with pytest.raises(UnsupportedModelError, match="checkpoint's own tokenizer"):
        ServerConfig.from_args(
            parse("--served-model-name", "DeepSeek-V4.1-Flash", "--worker", "http://127.0.0.1:9")
        )


def test_the_effort_profile_must_fit_the_family(tmp_path: Path) -> None:
    model = v41_checkpoint(tmp_path / "DeepSeek-V4.1-Flash")
    with pytest.raises(ValueError, match="release or prerelease"):
        ServerConfig.from_args(parse("--model-path", str(model), "--reasoning-effort-profile", "preview"))
    config = ServerConfig.from_args(
        parse("--model-path", str(model), "--reasoning-effort-profile", "prerelease")
    )
    assert config.model.reasoning_effort_profile == "prerelease"


def test_the_stand_in_tokenizer_has_one_id_per_v41_token() -> None:
    tok = PromptTokenizer(v41_stand_in_tokenizer_json(bundled_tokenizer_path().read_text(encoding="utf-8")))
    assert tok.token_id("<｜System｜>") == 128799
    assert tok.token_id("<｜deepseek_image｜>") == 129264
    # typed by a user, the spelling is ordinary text, never the control token
    assert 129264 not in tok.encode_text("<｜deepseek_image｜>")


@pytest.fixture(scope="module")
def v41_frontend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model = v41_checkpoint(tmp_path_factory.mktemp("v41") / "DeepSeek-V4.1-Flash")
    engine = start_sim_engine()
    try:
        frontend = start_frontend(
            "--engine", "sglang", "--worker", engine.url, "--model-path", str(model),
            "--served-model-name", "deepseek-v4.1-flash", "--context-length", "65536",
        )  # fmt: skip
        yield frontend
        frontend.stop()
    finally:
        engine.stop()


def _post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30)


def test_a_v41_tool_call_goes_through_spaced_dsml(v41_frontend: Server) -> None:
    r = _post(
        v41_frontend,
        "/v1/chat/completions",
        {
            "model": "deepseek-v4.1-flash",
            "messages": [{"role": "user", "content": "What's the weather in Paris? Use get_weather."}],
            "tools": [WEATHER],
            "reasoning_effort": 42,
        },
    )
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert "DSML" not in (message.get("content") or "") + (message.get("reasoning_content") or "")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"reasoning_effort": "xhigh"}),
        ("/v1/chat/completions", {"reasoning_effort": 100}),
        ("/v1/chat/completions", {"reasoning_effort": "minimal"}),
        ("/v1/messages", {"max_tokens": 64, "output_config": {"effort": 7}}),
        ("/v1/messages", {"max_tokens": 64, "output_config": {"effort": "medium"}}),
        ("/v1/messages", {"max_tokens": 64, "thinking": {"type": "enabled", "budget_tokens": 20000}}),
        ("/v1/responses", {"reasoning": {"effort": 55}}),
        ("/v1/responses", {"reasoning": {"effort": "xhigh"}}),
    ],
)
def test_effort_words_and_budgets_are_accepted_on_every_api(
    v41_frontend: Server, path: str, body: dict
) -> None:
    key = "input" if path == "/v1/responses" else "messages"
    value = (
        "Reply with exactly: ok"
        if key == "input"
        else [{"role": "user", "content": "Reply with exactly: ok"}]
    )
    r = _post(v41_frontend, path, {"model": "deepseek-v4.1-flash", key: value, **body})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"reasoning_effort": 0}, "reasoning_effort"),
        ("/v1/chat/completions", {"reasoning_effort": 101}, "reasoning_effort"),
        ("/v1/chat/completions", {"reasoning_effort": "turbo"}, "reasoning_effort"),
        ("/v1/messages", {"max_tokens": 64, "output_config": {"effort": 300}}, "output_config.effort"),
        ("/v1/responses", {"reasoning": {"effort": -5}}, "reasoning.effort"),
    ],
)
def test_bad_efforts_are_the_clients_fault(v41_frontend: Server, path: str, body: dict, param: str) -> None:
    key = "input" if path == "/v1/responses" else "messages"
    value = "hi" if key == "input" else [{"role": "user", "content": "hi"}]
    r = _post(v41_frontend, path, {"model": "deepseek-v4.1-flash", key: value, **body})
    assert r.status_code == 400, r.text
    assert param in r.text


def test_the_simulated_model_answers_a_v41_prompt_in_spaced_dsml() -> None:
    from deepseek_frontend.engines.sim.model import plan_output, read_prompt
    from deepseek_frontend.formats import dsv41

    prompt = dsv41.encode_messages(
        [
            {"role": "system", "content": "", "tools": [WEATHER]},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "thinking",
    )
    view = read_prompt(prompt)
    assert view.block_name == " calls"
    text = "".join(piece.text for piece in plan_output(view)) + "<｜end▁of▁sentence｜>"
    assert "<｜DSML｜ invoke name=" in text and "<｜DSML｜invoke" not in text
    parsed = dsv41.parse_message_from_completion_text(text, "thinking")
    assert parsed["tool_calls"][0]["function"]["name"] == "get_weather"
