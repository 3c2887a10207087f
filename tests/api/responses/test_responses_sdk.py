"""The official ``openai`` client's Responses API against the frontend and the simulated engine.

Simulated-engine rules (``engines/sim/model.py``): "Reply with exactly: X" answers
``X``; a turn naming a declared tool calls it, "both" with capitalised words makes
one call per word; a tool result after the last user turn is quoted back.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support import tools

MODEL = "deepseek-v4-flash"
WEATHER = tools.WEATHER.responses()
TIME = tools.TIME.responses()


def items(response: Any, kind: str) -> list[Any]:
    return [o for o in response.output if o.type == kind]


def test_plain_text_with_reasoning_by_default(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Reply with exactly: hello there")
    assert [o.type for o in response.output] == ["reasoning", "message"]
    assert response.output_text == "hello there"
    assert response.output[0].content[0].text
    assert response.status == "completed" and response.id.startswith("resp_")
    assert response.usage is not None and response.usage.input_tokens > 0
    assert response.usage.output_tokens_details.reasoning_tokens > 0


def test_reasoning_effort_none_turns_thinking_off(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="gpt-5", input="Reply with exactly: hello there", reasoning={"effort": "none"}
    )
    assert [o.type for o in response.output] == ["message"]
    assert response.output_text == "hello there"


def test_instructions_and_message_items_are_accepted(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        instructions="You are terse.",
        reasoning={"effort": "high"},
        input=[
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": [{"type": "input_text", "text": "Reply with exactly: ok"}]},
        ],
    )
    assert response.output_text == "ok"
    assert response.instructions == "You are terse."


def test_function_call_round_trip(client: openai.OpenAI) -> None:
    """CASE.1 one well-formed call, and its result answered."""
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.responses.create(model=MODEL, tools=[WEATHER], input=[question])
    (call,) = items(first, "function_call")
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(call.arguments, str) and '"city"' in call.arguments

    history: list[Any] = [question, *[o.model_dump(exclude_none=True) for o in first.output]]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees"})
    final = client.responses.create(model=MODEL, tools=[WEATHER], input=history)
    assert not items(final, "function_call")
    assert "Sunny, 24 degrees" in final.output_text


def test_parallel_function_calls(client: openai.OpenAI) -> None:
    """CASE.2 several calls; CASE.15 same tool twice, distinct ids."""
    response = client.responses.create(
        model=MODEL, tools=[WEATHER], input="Check the weather in Paris and Tokyo, both please."
    )
    calls = items(response, "function_call")
    assert [c.arguments for c in calls] == ['{"city": "Paris"}', '{"city": "Tokyo"}']
    assert len({c.call_id for c in calls}) == 2 and len({c.id for c in calls}) == 2


def test_stream_typed_events_in_order_with_increasing_sequence_numbers(client: openai.OpenAI) -> None:
    """CASE.8 streaming assembly."""
    events = list(
        client.responses.create(
            model=MODEL,
            tools=[WEATHER],
            input="Check the weather in Paris and Tokyo, both please.",
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.reasoning_text.delta" in kinds
    assert kinds.count("response.function_call_arguments.delta") >= 2
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "function_call", "function_call"]


def test_stream_helper_reassembles_the_non_streaming_response(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "tools": [WEATHER, TIME],
        "input": "Check the weather in Paris and Tokyo, both please.",
    }
    with client.responses.stream(**kwargs) as stream:
        streamed = stream.get_final_response()
    whole = client.responses.create(**kwargs)

    def summary(response: Any) -> list[Any]:
        return [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in response.output]

    assert summary(streamed) == summary(whole)
    assert streamed.output[0].content == whole.output[0].content


def test_streamed_text_reassembles(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="Reply with exactly: streamed words") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        response = stream.get_final_response()
    assert "".join(deltas) == response.output_text == "streamed words"


@pytest.mark.parametrize(
    ("tool_choice", "prompt", "expected"),
    [
        ("auto", "What is the weather in Paris?", ["get_weather"]),
        ("none", "What is the weather in Paris?", []),
        ("required", "Reply with exactly: no tools needed", ["*"]),
        ({"type": "function", "name": "get_time"}, "What is the weather in Paris?", ["get_time"]),
    ],
)
def test_tool_choice_variants(
    client: openai.OpenAI, tool_choice: Any, prompt: str, expected: list[str]
) -> None:
    """CASE.11 tool_choice auto/required/named/none."""
    response = client.responses.create(
        model=MODEL,
        tools=[WEATHER, TIME],
        tool_choice=tool_choice,
        reasoning={"effort": "none"},
        input=prompt,
    )
    names = [c.name for c in items(response, "function_call")]
    if expected == ["*"]:
        assert len(names) >= 1 and set(names) <= {"get_weather", "get_time"}
    else:
        assert names == expected


def test_max_output_tokens_truncation_is_an_incomplete_response(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input="write 50 words", max_output_tokens=5, reasoning={"effort": "none"}
    )
    assert response.status == "incomplete"
    assert (
        response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    )
    assert response.usage is not None and response.usage.output_tokens == 5


def test_previous_response_id_is_rejected_as_stateless(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
    assert "stateless" in err.value.message
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "previous_response_id"


def test_store_true_is_rejected(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="hi", store=True)
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "store"


def test_bad_request_names_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model=MODEL, input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
        )
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "input[0].call_id"


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="claude-3-opus", input="hi")


def test_missing_api_key_is_rejected(responses_server: Any) -> None:
    response = httpx.post(responses_server.url + "/v1/responses", json={"model": MODEL, "input": "hi"})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


def test_a_codex_shaped_stateless_tool_loop_returns_reasoning_as_encrypted_content(
    client: openai.OpenAI,
) -> None:
    """``store: false`` + ``include: ["reasoning.encrypted_content"]``: the client sends reasoning back
    as the opaque blob only, and the loop still completes."""
    common: dict[str, Any] = {
        "model": MODEL,
        "instructions": "You are a coding agent.",
        "tools": [{**WEATHER, "strict": False}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "session-1",
    }
    question = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Weather in Paris?"}],
    }
    developer = {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "Be safe."}],
    }
    with client.responses.stream(input=[developer, question], **common) as stream:
        first = stream.get_final_response()
    reasoning = items(first, "reasoning")[0]
    (call,) = items(first, "function_call")
    assert reasoning.encrypted_content

    history: list[Any] = [
        developer,
        question,
        {
            "type": "reasoning",
            "id": reasoning.id,
            "summary": [],
            "encrypted_content": reasoning.encrypted_content,
        },
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Cloudy, 18 degrees"},
    ]
    with client.responses.stream(input=history, **common) as stream:
        final = stream.get_final_response()
    assert "Cloudy, 18 degrees" in final.output_text
    assert final.parallel_tool_calls is False and final.store is False
