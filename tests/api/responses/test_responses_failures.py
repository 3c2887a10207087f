"""Engine failures as Responses clients see them: an error status before the first token,
an ``error`` event after it.

The app runs in-process over a scripted engine backend (``tests/support/scripted.py``).
"""

from __future__ import annotations

from deepseek_frontend.errors import EngineStreamError, NoHealthyWorkerError
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.scripted import MODEL, scripted_client, scripted_stream

BODY = {"model": MODEL, "input": "hi", "stream": True}


def test_failure_before_the_first_token_is_an_error_status(prompt_tokenizer: PromptTokenizer) -> None:
    with scripted_client(prompt_tokenizer, [], NoHealthyWorkerError("no healthy worker")) as client:
        response = client.post("/v1/responses", json=BODY)
    assert response.status_code == 503
    message = response.json()["error"]["message"]  # stable, naming the request; the engine's words are logged
    assert message.startswith("worker unavailable: ") and response.headers["x-request-id"] in message


def test_failure_mid_stream_ends_the_stream_with_an_error_event(prompt_tokenizer: PromptTokenizer) -> None:
    status, events = scripted_stream(
        prompt_tokenizer, ["Thinking about it"], EngineStreamError("worker died"), "/v1/responses", BODY
    )
    assert status == 200
    names = [name for name, _ in events]
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.completed" not in names
    name, payload = events[-1]
    assert name == "error" and payload["message"] and payload["code"]
    assert payload["sequence_number"] == len(events) - 1
