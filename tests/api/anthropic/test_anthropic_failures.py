"""Engine failures as Anthropic clients see them: an error status before the first token,
an ``event: error`` with Anthropic's error body after it.

The app runs in-process over a scripted engine backend (``tests/support/scripted.py``).
"""

from __future__ import annotations

from deepseek_frontend.errors import EngineStreamError, NoHealthyWorkerError
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.scripted import MODEL, scripted_client, scripted_stream

BODY = {
    "model": MODEL,
    "max_tokens": 50,
    "stream": True,
    # thinking shown: the scripted reasoning opens a content block before the failure
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "messages": [{"role": "user", "content": "hi"}],
}


def test_failure_before_the_first_token_is_an_overloaded_error_status(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    with scripted_client(prompt_tokenizer, [], NoHealthyWorkerError("no healthy worker")) as client:
        response = client.post("/v1/messages", json=BODY)
    assert response.status_code == 503
    # a stable message naming the request (the engine's own words go to the log)
    request_id = response.headers["x-request-id"]
    message = f"worker unavailable: no engine worker could serve the request (request id {request_id})"
    assert response.json() == {"type": "error", "error": {"type": "overloaded_error", "message": message}}


def test_failure_mid_stream_ends_the_stream_with_an_error_event(prompt_tokenizer: PromptTokenizer) -> None:
    status, events = scripted_stream(
        prompt_tokenizer, ["Thinking about it"], EngineStreamError("worker died"), "/v1/messages", BODY
    )
    assert status == 200
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert "content_block_delta" in names and "message_stop" not in names
    name, payload = events[-1]
    assert name == "error" and payload["type"] == "error"
    assert payload["error"]["type"] == "api_error" and payload["error"]["message"]
