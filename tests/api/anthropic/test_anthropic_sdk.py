"""The official ``anthropic`` client against the frontend and the simulated engine.

The simulated engine's rules (``engines/sim/model.py``): "Reply with exactly: X"
answers ``X``; a turn naming a declared tool calls it, "both"/"parallel" with
capitalised words makes one call per word; a tool result after the last user turn
is answered by quoting it. Thinking mode adds a one-sentence reasoning.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from deepseek_frontend.api.anthropic.events import thinking_signature
from tests.support import tools

MODEL = "claude-agent-test"  # a claude-* name as agents send, served through --model-alias "claude-*"
WEATHER = tools.WEATHER.anthropic()
TIME = tools.TIME.anthropic()


def blocks(message: Any, kind: str) -> list[Any]:
    return [b for b in message.content if b.type == kind]


def test_plain_text_answer_with_thinking_enabled(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=200,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "Reply with exactly: hello there"}],
    )
    assert [b.type for b in message.content] == ["thinking", "text"]
    thinking, text = message.content
    assert text.text == "hello there"
    assert thinking.thinking and thinking.signature == thinking_signature(thinking.thinking)
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.id.startswith("msg_") and message.role == "assistant"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_thinking_disabled_answers_without_a_thinking_block(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=200,
        thinking={"type": "disabled"},
        messages=[{"role": "user", "content": "Reply with exactly: hello there"}],
    )
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "hello there"


def test_system_prompt_and_enabled_thinking_are_accepted(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=300,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        metadata={"user_id": "user-1"},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
        messages=[{"role": "user", "content": "Reply with exactly: ok"}],
    )
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[1].text == "ok"


def test_tool_round_trip_tool_use_then_tool_result_then_final_answer(client: anthropic.Anthropic) -> None:
    """CASE.1 one well-formed call, and its result answered."""
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.messages.create(model=MODEL, max_tokens=400, tools=[WEATHER], messages=[question])
    assert first.stop_reason == "tool_use"
    (call,) = blocks(first, "tool_use")
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    assert isinstance(call.input, dict) and isinstance(call.input["city"], str)

    history = [
        question,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 degrees"}],
        },
    ]
    final = client.messages.create(model=MODEL, max_tokens=400, tools=[WEATHER], messages=history)
    assert final.stop_reason == "end_turn"
    assert not blocks(final, "tool_use")
    assert "Sunny, 24 degrees" in blocks(final, "text")[0].text


def test_parallel_tool_use_gives_one_block_per_call_with_distinct_ids(client: anthropic.Anthropic) -> None:
    """CASE.2 several calls; CASE.15 same tool twice, distinct ids."""
    message = client.messages.create(
        model=MODEL,
        max_tokens=400,
        tools=[WEATHER],
        messages=[{"role": "user", "content": "Check the weather in Paris and Tokyo, both please."}],
    )
    calls = blocks(message, "tool_use")
    assert [c.input["city"] for c in calls] == ["Paris", "Tokyo"]
    assert len({c.id for c in calls}) == 2
    assert message.stop_reason == "tool_use"


def _raw_stream(client: anthropic.Anthropic, **kwargs: Any) -> list[Any]:
    return list(client.messages.create(stream=True, **kwargs))


def test_stream_event_order_follows_the_messages_protocol(client: anthropic.Anthropic) -> None:
    """CASE.8 streaming assembly."""
    events = _raw_stream(
        client,
        model=MODEL,
        max_tokens=400,
        tools=[WEATHER],
        thinking={"type": "adaptive"},
        messages=[{"role": "user", "content": "Check the weather in Paris and Tokyo, both please."}],
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    # Blocks never interleave: each start is followed by its deltas and its stop.
    open_index = None
    for event in events:
        if event.type == "content_block_start":
            assert open_index is None
            open_index = event.index
        elif event.type == "content_block_delta":
            assert event.index == open_index
        elif event.type == "content_block_stop":
            assert event.index == open_index
            open_index = None
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "tool_use", "tool_use"]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert deltas.index("signature_delta") < deltas.index("input_json_delta")
    assert deltas.count("input_json_delta") >= 2
    assert events[-2].delta.stop_reason == "tool_use" and events[-2].usage.output_tokens > 0


def test_stream_helper_reassembles_the_same_message_as_the_non_streaming_call(
    client: anthropic.Anthropic,
) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 400,
        "tools": [WEATHER, TIME],
        "messages": [{"role": "user", "content": "Check the weather in Paris and Tokyo, both please."}],
    }
    with client.messages.stream(**kwargs) as stream:
        text_seen = "".join(stream.text_stream)
        streamed = stream.get_final_message()
    whole = client.messages.create(**kwargs)

    def summary(message: Any) -> list[Any]:
        return [
            (b.type, getattr(b, "text", None), getattr(b, "thinking", None), getattr(b, "input", None))
            for b in message.content
        ]

    assert summary(streamed) == summary(whole)
    assert streamed.stop_reason == whole.stop_reason == "tool_use"
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    assert text_seen == "".join(b.text for b in blocks(whole, "text"))


def test_streamed_text_answer_reassembles_with_thinking_signature(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL,
        max_tokens=200,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "Reply with exactly: streamed words"}],
    ) as stream:
        message = stream.get_final_message()
    thinking, text = message.content
    assert text.text == "streamed words"
    assert thinking.signature == thinking_signature(thinking.thinking)


@pytest.mark.parametrize(
    ("tool_choice", "prompt", "expected"),
    [
        ({"type": "auto"}, "What is the weather in Paris?", ["get_weather"]),
        ({"type": "none"}, "What is the weather in Paris?", []),
        ({"type": "any"}, "Reply with exactly: no tools needed", ["*"]),
        ({"type": "tool", "name": "get_time"}, "What is the weather in Paris?", ["get_time"]),
    ],
)
def test_tool_choice_variants(
    client: anthropic.Anthropic, tool_choice: dict[str, Any], prompt: str, expected: list[str]
) -> None:
    """CASE.11 tool_choice auto/any/named/none."""
    message = client.messages.create(
        model=MODEL,
        max_tokens=400,
        thinking={"type": "disabled"},
        tools=[WEATHER, TIME],
        tool_choice=tool_choice,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": prompt}],
    )
    names = [c.name for c in blocks(message, "tool_use")]
    if expected == ["*"]:
        assert len(names) >= 1 and set(names) <= {"get_weather", "get_time"}
    else:
        assert names == expected
    assert message.stop_reason == ("tool_use" if names else "end_turn")


def test_stop_sequence_cuts_the_answer_and_is_reported(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=200,
        stop_sequences=["STOP", "never"],
        messages=[{"role": "user", "content": "Reply with exactly: one two STOP three"}],
    )
    assert blocks(message, "text")[0].text == "one two "
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "STOP"


def test_max_tokens_truncation_reports_max_tokens(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=5,
        thinking={"type": "disabled"},
        messages=[{"role": "user", "content": "write 50 words"}],
    )
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 5


def test_count_tokens_equals_the_input_tokens_of_the_real_request(client: anthropic.Anthropic) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "system": "Be brief.",
        "tools": [WEATHER],
        "messages": [{"role": "user", "content": "Reply with exactly: counted"}],
    }
    counted = client.messages.count_tokens(**kwargs)
    message = client.messages.create(max_tokens=50, **kwargs)
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert (
        counted.input_tokens
        > client.messages.count_tokens(model=MODEL, messages=kwargs["messages"]).input_tokens
    )


def test_count_tokens_counts_a_prompt_longer_than_the_context_window(client: anthropic.Anthropic) -> None:
    # The server runs with --context-length 65536: generating would be a 400, counting must still answer.
    long_text = "word " * 80_000
    counted = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": long_text}])
    assert counted.input_tokens > 65_536
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": long_text}])


def test_bad_request_is_an_anthropic_invalid_request_error(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model=MODEL,
            max_tokens=100,
            messages=[
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "x"}],
                },
            ],
        )
    body = err.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "messages[2].content[0].tool_use_id" in body["error"]["message"]


def test_unknown_model_is_not_found(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="gpt-4o", max_tokens=10, messages=[{"role": "user", "content": "q"}])
    assert isinstance(err.value.body, dict) and err.value.body["error"]["type"] == "not_found_error"


def test_wrong_api_key_is_an_anthropic_authentication_error(messages_server: Any) -> None:
    bad = anthropic.Anthropic(base_url=messages_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        bad.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "q"}])
    assert isinstance(err.value.body, dict) and err.value.body["error"]["type"] == "authentication_error"


def test_invalid_json_body_uses_the_anthropic_error_shape(messages_server: Any) -> None:
    response = httpx.post(
        messages_server.url + "/v1/messages",
        content=b"{not json",
        headers={"x-api-key": "anthropic-test-key", "anthropic-version": "2023-06-01"},
    )
    assert response.status_code == 400
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_claude_code_shaped_request_with_beta_fields_streams(messages_server: Any) -> None:
    """Agents send fields and headers this server does not interpret; they must not fail the request."""
    body = {
        "model": "claude-opus-4-1-20250805",
        "max_tokens": 32000,
        "stream": True,
        "temperature": 1,
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "metadata": {"user_id": "user_abc_account__session_1"},
        "context_management": {"edits": []},
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Use tools when asked.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [
            {
                "name": "Bash",
                "description": "Run a shell command",
                "input_schema": {
                    "$schema": "http://json-schema.org/draft-07/schema#",
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                    "required": ["command"],
                    "additionalProperties": False,
                },
            }
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>context</system-reminder>"},
                    {"type": "text", "text": "Use the bash tool", "cache_control": {"type": "ephemeral"}},
                ],
            }
        ],
    }
    headers = {
        "x-api-key": "anthropic-test-key",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": ",".join(
            [
                "claude-code-20250219",
                "interleaved-thinking-2025-05-14",
                "fine-grained-tool-streaming-2025-05-14",
            ]
        ),
    }
    with httpx.stream(
        "POST", messages_server.url + "/v1/messages", json=body, headers=headers, timeout=30
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    names = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert '"name":"Bash"' in text and '"stop_reason":"tool_use"' in text


def test_the_beta_client_used_by_claude_code_streams_and_counts(client: anthropic.Anthropic) -> None:
    """``client.beta.messages`` posts to ``/v1/messages?beta=true`` with ``anthropic-beta`` headers."""
    with client.beta.messages.stream(
        model=MODEL,
        max_tokens=400,
        betas=["interleaved-thinking-2025-05-14"],
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=[WEATHER],
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    ) as stream:
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    assert message.stop_reason == "tool_use" and isinstance(message.content[1].input, dict)
    counted = client.beta.messages.count_tokens(
        model=MODEL, betas=["token-counting-2024-11-01"], messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens > 0


def test_count_tokens_is_the_same_for_every_tool_choice_that_keeps_the_tools(
    client: anthropic.Anthropic,
) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    counts = {
        kind: client.messages.count_tokens(
            model=MODEL, tools=[WEATHER, TIME], tool_choice=choice, messages=messages
        ).input_tokens
        for kind, choice in [
            ("auto", {"type": "auto"}),
            ("any", {"type": "any"}),
            ("tool", {"type": "tool", "name": "get_time"}),
            ("none", {"type": "none"}),
        ]
    }
    assert counts["auto"] == counts["any"] == counts["tool"]
    assert counts["none"] < counts["auto"]  # tool_choice none leaves the tools out of the prompt
