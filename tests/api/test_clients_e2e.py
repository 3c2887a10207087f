"""What agent clients depend on, end to end (frontend -> SGLang protocol over HTTP -> sim-engine).

* the model name a client asked for (an alias) comes back in every response and stream event;
* ``ignore_eos`` / ``min_tokens`` reach the engine and the output has the length asked for;
* ``logprobs.content`` holds exactly the answer's tokens (no reasoning, markup or EOS);
* Codex's ``namespace`` tools are flattened and their calls come back under the declared name,
  hosted tools are dropped with a warning;
* Anthropic's ``message_start`` usage says what ``message_delta`` says.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.servers import Server

from .conftest import API_KEY

ALIAS = "gpt-4o-mini"  # answered through the frontend's --model-alias 'gpt-*'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def sse_data(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


# --------------------------------------------------------------------------- model echo


def test_openai_chat_echoes_the_alias_in_the_answer_and_every_chunk(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Reply with exactly: hi"}]
    answer = client.chat.completions.create(model=ALIAS, messages=messages)  # type: ignore[arg-type]
    assert answer.model == ALIAS
    chunks = list(
        client.chat.completions.create(model=ALIAS, messages=messages, stream=True)  # type: ignore[arg-type]
    )
    assert chunks and {c.model for c in chunks} == {ALIAS}


def test_completions_echo_the_alias(client: openai.OpenAI) -> None:
    answer = client.completions.create(model=ALIAS, prompt="Hello", max_tokens=4)
    assert answer.model == ALIAS


def test_anthropic_messages_echo_the_alias_in_the_message_and_message_start(frontend: Server) -> None:
    ac = anthropic.Anthropic(base_url=frontend.url, api_key=API_KEY, max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "Reply with exactly: hi"}]
    message = ac.messages.create(model=ALIAS, max_tokens=200, messages=messages)  # type: ignore[arg-type]
    assert message.model == ALIAS
    with ac.messages.stream(model=ALIAS, max_tokens=200, messages=messages) as stream:  # type: ignore[arg-type]
        events = list(stream)
    starts = [e for e in events if e.type == "message_start"]
    assert starts and starts[0].message.model == ALIAS


def test_responses_echo_the_alias_in_every_response_object(frontend: Server) -> None:
    body = {"model": ALIAS, "input": "Reply with exactly: hi", "stream": True}
    r = httpx.post(f"{frontend.url}/v1/responses", json=body, headers=_auth(), timeout=30)
    assert r.status_code == 200, r.text
    objects = [e["response"] for e in sse_data(r.text) if "response" in e]
    assert objects and {o["model"] for o in objects} == {ALIAS}


# --------------------------------------------------------------------------- output length controls


def test_ignore_eos_generates_up_to_max_tokens(client: openai.OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": "Reply with exactly: short"}]
    plain = client.chat.completions.create(model=model, messages=messages, max_tokens=64)  # type: ignore[arg-type]
    assert plain.usage is not None and plain.usage.completion_tokens < 64
    forced = client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=64,
        extra_body={"ignore_eos": True},
    )
    assert forced.usage is not None and forced.usage.completion_tokens == 64
    assert forced.choices[0].finish_reason == "length"


def test_min_tokens_keeps_the_answer_going_then_lets_it_stop(client: openai.OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": "Reply with exactly: short"}]
    answer = client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=200,
        extra_body={"min_tokens": 80},
    )
    assert answer.usage is not None and 80 <= answer.usage.completion_tokens < 200
    assert answer.choices[0].finish_reason == "stop"


def test_ignore_eos_and_min_tokens_are_accepted_on_the_anthropic_and_responses_apis(frontend: Server) -> None:
    messages = [{"role": "user", "content": "Reply with exactly: short"}]
    r = httpx.post(
        f"{frontend.url}/v1/messages",
        json={"model": ALIAS, "max_tokens": 48, "messages": messages, "ignore_eos": True},
        headers=_auth(),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] == 48 and r.json()["stop_reason"] == "max_tokens"
    r = httpx.post(
        f"{frontend.url}/v1/responses",
        json={
            "model": ALIAS,
            "max_output_tokens": 120,
            "input": "Reply with exactly: short",
            "min_tokens": 60,
        },
        headers=_auth(),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] >= 60


def test_a_negative_min_tokens_is_refused_naming_the_field(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"min_tokens": -1},
        )
    assert "min_tokens" in str(err.value)


# --------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_content_holds_exactly_the_answer_tokens(
    client: openai.OpenAI, model: str, stream: bool
) -> None:
    """Thinking mode: the reasoning tokens, ``</think>`` and EOS are generated too, but are not content."""
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Reply with exactly: aligned logprobs here"}],
        "logprobs": True,
        "top_logprobs": 1,
    }
    if stream:
        content, tokens = "", []
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            content += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                tokens += choice.logprobs.content
    else:
        answer = client.chat.completions.create(**kwargs)
        message = answer.choices[0].message
        assert getattr(message, "reasoning_content", None)  # the model did reason
        content = message.content or ""
        assert answer.choices[0].logprobs is not None
        tokens = answer.choices[0].logprobs.content or []
    assert content == "aligned logprobs here"
    assert "".join(t.token for t in tokens) == content
    assert all(len(t.top_logprobs) <= 1 for t in tokens)


def test_logprobs_of_a_tool_call_answer_are_empty(client: openai.OpenAI, model: str) -> None:
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],  # type: ignore[list-item]
        logprobs=True,
    )
    choice = answer.choices[0]
    assert choice.message.tool_calls and choice.message.content is None
    assert choice.logprobs is not None and choice.logprobs.content == []


# --------------------------------------------------------------------------- Codex tools


NAMESPACE = {
    "type": "namespace",
    "name": "agents",
    "description": "Work with sub-agents",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Start a sub-agent",
            "parameters": {
                "type": "object",
                "properties": {"task": {"type": "string"}},
                "required": ["task"],
            },
        }
    ],
}


def test_codex_namespace_tool_call_comes_back_under_its_declared_name(frontend: Server) -> None:
    body = {
        "model": ALIAS,
        "input": [{"role": "user", "content": "Please spawn an agent for the tests"}],
        "tools": [NAMESPACE, {"type": "web_search"}],
        "stream": True,
    }
    r = httpx.post(f"{frontend.url}/v1/responses", json=body, headers=_auth(), timeout=30)
    assert r.status_code == 200, r.text
    events = sse_data(r.text)
    calls = [
        e["item"]
        for e in events
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"
    ]
    assert [(c["namespace"], c["name"]) for c in calls] == [("agents", "spawn_agent")]
    completed = next(e["response"] for e in events if e["type"] == "response.completed")
    assert any("web_search" in w for w in completed["warnings"])

    # Codex sends the call back with its namespace: the next turn is accepted and answered
    call = calls[0]
    follow_up = {
        "model": ALIAS,
        "input": [
            *body["input"],
            {
                "type": "function_call",
                "call_id": call["call_id"],
                "namespace": "agents",
                "name": "spawn_agent",
                "arguments": call["arguments"],
            },
            {"type": "function_call_output", "call_id": call["call_id"], "output": "agent started"},
        ],
        "tools": body["tools"],
    }
    r = httpx.post(f"{frontend.url}/v1/responses", json=follow_up, headers=_auth(), timeout=30)
    assert r.status_code == 200, r.text
    texts = [c["text"] for item in r.json()["output"] if item["type"] == "message" for c in item["content"]]
    assert any("agent started" in t for t in texts)


# --------------------------------------------------------------------------- Anthropic usage


def test_message_start_usage_matches_message_delta_when_the_prompt_is_cached(frontend: Server) -> None:
    ac = anthropic.Anthropic(base_url=frontend.url, api_key=API_KEY, max_retries=0, timeout=30)
    long_text = "Reply with exactly: cached. " + " ".join(f"word{i}" for i in range(200))
    messages = [{"role": "user", "content": long_text}]
    ac.messages.create(model=ALIAS, max_tokens=50, messages=messages)  # type: ignore[arg-type]  # warms the cache
    with ac.messages.stream(model=ALIAS, max_tokens=50, messages=messages) as stream:  # type: ignore[arg-type]
        events = list(stream)
    start = next(e for e in events if e.type == "message_start").message.usage
    delta = next(e for e in events if e.type == "message_delta").usage
    assert (delta.cache_read_input_tokens or 0) > 0
    assert start.cache_read_input_tokens == delta.cache_read_input_tokens
    assert start.input_tokens == delta.input_tokens


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}
