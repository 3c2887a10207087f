"""A request the engine refuses is the client's error in every API: its status and message, in the
API's own error shape -- as an error status before the first token, as an error event after it.

The app runs in-process over a scripted engine backend (``tests/support/scripted.py``) that raises
``EngineRejectedRequestError`` the way the SGLang and vLLM clients do for a 4xx answer, an in-stream
``{"error": {"code": 400, "retryable": false}}`` event or SGLang's abort finish with ``status_code``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from deepseek_frontend.errors import EngineRejectedRequestError
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.scripted import MODEL, scripted_client, scripted_stream

MESSAGE = "the engine rejected the request: Grammar-based generation is not supported"
USER = [{"role": "user", "content": "hi"}]
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL, "messages": USER},
    "/v1/messages": {"model": MODEL, "max_tokens": 50, "messages": USER},
    "/v1/responses": {"model": MODEL, "input": "hi"},
}


def rejected(status: int = 400) -> EngineRejectedRequestError:
    return EngineRejectedRequestError(MESSAGE, status_code=status)


def error_of(path: str, body: dict[str, Any]) -> tuple[str | None, str]:
    """``(error type, message)`` from an API's error body."""
    if path == "/v1/messages":
        assert body["type"] == "error"
        return body["error"]["type"], body["error"]["message"]
    return body["error"].get("type"), body["error"]["message"]


@pytest.mark.parametrize("path", sorted(BODIES))
@pytest.mark.parametrize("status", [400, 422])
def test_a_refusal_before_the_first_token_is_the_engines_status_in_the_apis_shape(
    prompt_tokenizer: PromptTokenizer, path: str, status: int
) -> None:
    with scripted_client(prompt_tokenizer, [], rejected(status)) as client:
        for stream in (False, True):
            response = client.post(path, json={**BODIES[path], "stream": stream})
            assert response.status_code == status
            kind, message = error_of(path, response.json())
            assert message == MESSAGE
            assert kind == "invalid_request_error"


def test_a_refusal_after_the_first_token_is_an_error_event_in_each_api(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    # OpenAI chat: plain data events
    with (
        scripted_client(prompt_tokenizer, ["Thinking about it"], rejected()) as client,
        client.stream(
            "POST", "/v1/chat/completions", json={**BODIES["/v1/chat/completions"], "stream": True}
        ) as response,
    ):
        assert response.status_code == 200
        data = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: ")]
    errors = [orjson.loads(d)["error"] for d in data if d != "[DONE]" and "error" in orjson.loads(d)]
    assert len(errors) == 1 and errors[0]["message"] == MESSAGE
    assert errors[0]["type"] == "invalid_request_error"

    # Anthropic and Responses: named events, the last one an error
    for path in ("/v1/messages", "/v1/responses"):
        status, events = scripted_stream(
            prompt_tokenizer, ["Thinking about it"], rejected(), path, {**BODIES[path], "stream": True}
        )
        assert status == 200
        name, payload = events[-1]
        assert name == "error"
        if path == "/v1/messages":
            assert payload["error"] == {"type": "invalid_request_error", "message": MESSAGE}
        else:
            assert payload["message"] == MESSAGE


def test_serve_sim_behave_makes_the_built_in_engine_refuse_like_the_recipes_sglang(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    """``serve --sim-behave sglang-recipe``: the frontend learns the refusals and answers them up front."""
    from starlette.testclient import TestClient

    from deepseek_frontend.engines.config import EngineConfig, SimConfig
    from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
    from deepseek_frontend.server.app import create_app

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    config = ServerConfig(
        ModelConfig(served_model_name=MODEL, context_length=1_048_576),
        engine=EngineConfig(sim=SimConfig(behave="sglang-recipe")),
    )
    with TestClient(create_app(config, tokenizer=prompt_tokenizer)) as client:
        required = client.post(
            "/v1/chat/completions",
            json={**BODIES["/v1/chat/completions"], "tools": [tool], "tool_choice": "required"},
        )
        assert required.status_code == 400 and required.json()["error"]["param"] == "tool_choice"
        # no max_tokens: the default leaves the 4 slots EAGLE reserves, so the engine accepts it
        plain = client.post("/v1/chat/completions", json=BODIES["/v1/chat/completions"])
        assert plain.status_code == 200, plain.text
