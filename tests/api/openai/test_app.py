"""The app in-process (Starlette TestClient, built-in simulated engine): routes, auth, limits, errors."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from deepseek_frontend.engines.config import EngineConfig
from deepseek_frontend.errors import UnsupportedModelError
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServerOptions, parse_model_alias
from deepseek_frontend.server import serve_command
from deepseek_frontend.server.app import create_app
from deepseek_frontend.server.compose import build_engine
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.engine import ScriptedEngine

KEY = "sekret"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def client(prompt_tokenizer: PromptTokenizer) -> Iterator[TestClient]:
    config = ServerConfig(
        ModelConfig(served_model_name="deepseek-v4-flash", context_length=8192),
        server=ServerOptions(api_key=KEY, max_body_bytes=4096),
    )
    with TestClient(create_app(config, tokenizer=prompt_tokenizer)) as c:
        c.headers["Authorization"] = f"Bearer {KEY}"
        yield c


def chat(client: TestClient, **body: object) -> object:
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **body})


def test_the_builtin_simulated_engine_answers_and_reports_healthy(client: TestClient) -> None:
    r = chat(client, messages=[{"role": "user", "content": "Reply with exactly: in process"}])
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "in process"
    assert r.headers["x-request-id"].startswith("chatcmpl-")
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["simulated"] is True
    assert health["workers"][0]["healthy"] is True


def test_a_client_request_id_is_echoed(client: TestClient) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}]},
        headers={"x-request-id": "trace-123"},
    )
    assert r.headers["x-request-id"] == "trace-123"


def test_auth_accepts_bearer_and_x_api_key_and_rejects_others(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert client.post("/v1/chat/completions", json=body, headers={"Authorization": ""}).status_code == 401
    r = client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    # a credential header that is present must carry the key: an empty Authorization is not ignored
    # in favour of a correct x-api-key (docs/serving.md, "API keys and limits")
    r = client.post("/v1/chat/completions", json=body, headers={"Authorization": "", "x-api-key": KEY})
    assert r.status_code == 401 and "Malformed Authorization" in r.json()["error"]["message"]
    r = client.post(
        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}", "x-api-key": KEY}
    )
    assert r.status_code == 200
    assert client.get("/v1/models", headers={"Authorization": ""}).status_code == 401
    assert client.get("/live", headers={"Authorization": ""}).status_code == 200


def test_a_body_over_the_limit_is_413(client: TestClient) -> None:
    r = chat(client, messages=[{"role": "user", "content": "x" * 5000}])
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"


@pytest.mark.parametrize(
    ("content", "status"),
    [(b"", 400), (b"[1, 2]", 400), (b'{"messages": ', 400)],
)
def test_bodies_that_are_not_json_objects_are_400(client: TestClient, content: bytes, status: int) -> None:
    r = client.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_routes_and_methods_get_json_errors(client: TestClient) -> None:
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_models_lists_and_retrieves_the_served_model(client: TestClient) -> None:
    data = client.get("/v1/models").json()
    assert [m["id"] for m in data["data"]] == ["deepseek-v4-flash"]
    assert data["data"][0]["max_model_len"] == 8192
    assert client.get("/v1/models/deepseek-v4-flash").json()["id"] == "deepseek-v4-flash"
    assert client.get("/v1/models/other").status_code == 404


def test_exact_aliases_are_listed_and_every_answered_name_is_retrieved_as_asked(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    served = "deepseek-v4-flash"
    aliases = tuple(parse_model_alias(a, served) for a in ("claude-*", "gpt-4o", f"old-name={served}"))
    config = ServerConfig(ModelConfig(served_model_name=served, model_aliases=aliases))
    with TestClient(create_app(config, tokenizer=prompt_tokenizer)) as c:
        listed = c.get("/v1/models").json()["data"]
        assert [m["id"] for m in listed] == [served, "gpt-4o", "old-name"]
        assert [m.get("parent") for m in listed] == [None, served, served]
        for asked in ("claude-sonnet-4-5", "gpt-4o", served):
            card = c.get(f"/v1/models/{asked}").json()
            assert card["id"] == asked and card["object"] == "model"
        anthropic = {"anthropic-version": "2023-06-01", "x-api-key": "unused"}
        page = c.get("/v1/models", headers=anthropic).json()
        assert [m["id"] for m in page["data"]] == [served, "gpt-4o", "old-name"]
        assert (page["first_id"], page["last_id"]) == (served, "old-name")
        missing = c.get("/v1/models/gemini-pro")
        assert missing.status_code == 404 and "gemini-pro" in missing.json()["error"]["message"]


def test_context_length_is_checked_against_the_configured_window(client: TestClient) -> None:
    r = chat(client, max_tokens=9000)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_streams_end_with_done_and_carry_usage_when_asked(client: TestClient) -> None:
    r = chat(
        client,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Reply with exactly: streamed"}],
    )
    assert r.status_code == 200
    events = [e for e in r.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    usage_chunk = json.loads(events[-2][6:])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0


def test_completions_accepts_token_ids_and_strings(
    client: TestClient, prompt_tokenizer: PromptTokenizer
) -> None:
    prompt = "<｜begin▁of▁sentence｜><｜User｜>Reply with exactly: ids<｜Assistant｜></think>"
    ids = prompt_tokenizer.encode_raw(prompt)
    for value in (prompt, ids):
        r = client.post("/v1/completions", json={"prompt": value, "max_tokens": 20})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == "ids"
        assert r.json()["object"] == "text_completion"
    bad = client.post("/v1/completions", json={"prompt": [["a"], ["b"]]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    assert client.post("/v1/completions", json={}).json()["error"]["param"] == "prompt"


def test_constraints_an_engine_cannot_enforce_are_400(prompt_tokenizer: PromptTokenizer) -> None:
    no_grammar = ScriptedEngine(
        prompt_tokenizer, ["</think>It is sunny."], constraints=frozenset({"json_schema"})
    )
    config = ServerConfig(
        ModelConfig(served_model_name="deepseek-v4-flash"),
        engine=EngineConfig(kind="vllm", workers=("http://x",)),
    )
    app = create_app(config, tokenizer=prompt_tokenizer, backend=no_grammar)
    with TestClient(app) as c:
        r = chat(c, tools=[WEATHER], tool_choice="required")
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "tool_choice"
        assert chat(c, tools=[WEATHER], tool_choice="auto").status_code == 200


def test_metrics_expose_the_documented_families(client: TestClient) -> None:
    chat(client)
    text = client.get("/metrics").text
    for name in (
        "deepseek_frontend_requests_total",
        "deepseek_frontend_requests_in_flight",
        "deepseek_frontend_time_to_first_token_seconds_bucket",
        "deepseek_frontend_inter_token_latency_seconds_bucket",
        "deepseek_frontend_e2e_request_latency_seconds_bucket",
        "deepseek_frontend_prompt_tokens_total",
        "deepseek_frontend_generation_tokens_total",
        "deepseek_frontend_tokenization_seconds_bucket",
        "deepseek_frontend_detokenization_seconds_bucket",
        "deepseek_frontend_worker_healthy",
        "deepseek_frontend_worker_in_flight",
        "deepseek_frontend_dropped_tool_calls_total",
    ):
        assert name in text, name


def test_metrics_report_the_prompt_cache_sizes_and_hits(client: TestClient) -> None:
    def cache_sample(name: str, cache: str) -> float:
        line = next(
            ln
            for ln in client.get("/metrics").text.splitlines()
            if ln.startswith(f'{name}{{cache="{cache}",model="deepseek-v4-flash"}}')
        )
        return float(line.rsplit(" ", 1)[1])

    chat(client)
    assert cache_sample("deepseek_frontend_cache_entries", "prefix") >= 1
    assert cache_sample("deepseek_frontend_cache_bytes", "prefix") > 0
    hits = cache_sample("deepseek_frontend_cache_hits_total", "prefix")
    chat(client)  # the same conversation again: served from the prefix cache
    assert cache_sample("deepseek_frontend_cache_hits_total", "prefix") == hits + 1


# --------------------------------------------------------------------------- config


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_serve_the_builtin_sim_with_thinking_on() -> None:
    config = ServerConfig.from_args(parse())
    assert config.engine.kind == "sim" and config.engine.uses_builtin_sim
    assert config.model.default_thinking is True
    assert config.model.served_model_name == "deepseek-v4-flash"
    assert config.model.context_length == 1_048_576


def test_workers_select_sglang_and_flags_are_resolved() -> None:
    config = ServerConfig.from_args(
        parse(
            "--worker",
            "http://a:1/",
            "http://b:2",
            "--default-thinking",
            "off",
            "--model-alias",
            "claude-*",
            "--api-key",
            "k",
            "--port",
            "0",
        )
    )
    assert config.engine.kind == "sglang"
    assert config.engine.workers == ("http://a:1", "http://b:2")
    assert config.model.default_thinking is False
    assert config.model.resolve_model("claude-opus-4") == "deepseek-v4-flash"
    assert config.server.api_key == "k"


def test_contradictory_engine_flags_are_refused() -> None:
    with pytest.raises(ValueError, match="in-process"):
        ServerConfig.from_args(parse("--engine", "sim", "--worker", "http://a:1"))
    with pytest.raises(ValueError, match="needs at least one --worker"):
        ServerConfig.from_args(parse("--engine", "vllm"))
    with pytest.raises(ValueError):
        parse_model_alias("x=other-model", "deepseek-v4-flash")


def test_context_length_comes_from_the_checkpoint_config(tmp_path: Path) -> None:
    model = tmp_path / "DeepSeek-V3.2"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"model_type": "deepseek_v32", "max_position_embeddings": 163840})
    )
    config = ServerConfig.from_args(parse("--model-path", str(model)))
    assert config.model.context_length == 163840
    assert config.model.family == "deepseek_v32"
    assert config.model.served_model_name == "DeepSeek-V3.2"


def test_a_v41_checkpoint_is_accepted_at_startup(tmp_path: Path) -> None:
    model = tmp_path / "DeepSeek-V4.1"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"model_type": "deepseek_v41", "architectures": ["DeepseekV41ForCausalLM"]})
    )
    config = ServerConfig.from_args(parse("--model-path", str(model)))
    assert config.model.family == "deepseek_v41" and config.model.reasoning_effort_profile == "release"


def test_a_checkpoint_of_another_model_family_is_refused_at_startup(tmp_path: Path) -> None:
    model = tmp_path / "Llama-3-8B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    # Even a DeepSeek-looking served name does not override what the checkpoint says.
    with pytest.raises(UnsupportedModelError, match="does not describe a DeepSeek"):
        ServerConfig.from_args(parse("--model-path", str(model), "--served-model-name", "deepseek-v4-flash"))


def test_an_unknown_served_name_without_a_checkpoint_falls_back_to_deepseek_v4() -> None:
    config = ServerConfig.from_args(parse("--served-model-name", "my-model"))
    assert config.model.family == "deepseek_v4"
    assert config.model.served_model_name == "my-model"


@pytest.mark.parametrize(
    ("flags", "enforced"), [((), True), (("--vllm-grammar",), True), (("--no-vllm-grammar",), False)]
)
def test_vllm_workers_take_the_tool_grammar_unless_switched_off(
    flags: tuple[str, ...], enforced: bool, prompt_tokenizer: PromptTokenizer
) -> None:
    config = ServerConfig.from_args(parse("--engine", "vllm", "--worker", "http://127.0.0.1:9", *flags))
    backend = build_engine(config, prompt_tokenizer)
    try:
        assert backend.supports_constraint("ebnf") is enforced
        assert backend.supports_constraint("json_schema")
    finally:
        asyncio.run(backend.aclose())
