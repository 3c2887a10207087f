"""End to end: the official ``openai`` client -> ``deepseek-frontend serve`` -> a ``sim-engine`` process.

The simulated engine's answers are fixed by the rules in ``deepseek_frontend.engines.sim.model``:
"Reply with exactly: X" answers ``X``; naming a tool (or "use the tool") calls it; "both" with
two capitalised places makes two parallel calls; thinking mode writes one sentence of reasoning.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from tests.api.conftest import API_KEY, MAX_BODY
from tests.support.servers import Server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
MARKUP = ("｜DSML｜", "<think>", "</think>", "<｜end▁of▁sentence｜>")


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def assert_clean(*texts: str | None) -> None:
    for text in texts:
        for mark in MARKUP:
            assert mark not in (text or ""), f"{mark!r} leaked into {text!r}"


def collect_stream(stream: Any) -> dict[str, Any]:
    """Fold streamed chunks into content, reasoning, tool calls, finish reasons and the chunk list."""
    out: dict[str, Any] = {
        "content": {},
        "reasoning": {},
        "calls": {},
        "finish": {},
        "chunks": [],
        "usage": None,
    }
    for chunk in stream:
        out["chunks"].append(chunk)
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            i = choice.index
            delta = choice.delta
            if delta.content:
                out["content"][i] = out["content"].get(i, "") + delta.content
            reasoning = getattr(delta, "reasoning_content", None)
            if reasoning:
                out["reasoning"][i] = out["reasoning"].get(i, "") + reasoning
            for call in delta.tool_calls or ():
                slot = (
                    out["calls"]
                    .setdefault(i, {})
                    .setdefault(call.index, {"id": None, "name": None, "args": ""})
                )
                if call.id:
                    assert slot["id"] is None, "a call's id is sent once"
                    slot["id"] = call.id
                if call.function and call.function.name:
                    assert slot["name"] is None, "a call's name is sent once"
                    slot["name"] = call.function.name
                if call.function and call.function.arguments:
                    slot["args"] += call.function.arguments
            if choice.finish_reason:
                out["finish"][i] = choice.finish_reason
    return out


# --------------------------------------------------------------------------- plain chat


def test_plain_chat_returns_the_answer_reasoning_and_usage(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=user("Reply with exactly: Hello world"))
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello world"
    reasoning = getattr(choice.message, "reasoning_content", None)
    assert reasoning, "thinking is on by default"
    assert_clean(choice.message.content, reasoning)
    assert choice.finish_reason == "stop"
    assert r.model == model
    assert r.id.startswith("chatcmpl-")
    usage = r.usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens > usage.completion_tokens_details.reasoning_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens is not None


def test_a_model_alias_pattern_is_accepted_and_answered_as_the_served_model(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="gpt-4o", messages=user("Reply with exactly: ok"))
    assert r.choices[0].message.content == "ok"
    # the served model answers, under the name the client asked for
    assert r.model == "gpt-4o"


def test_models_endpoint_lists_the_served_model(client: openai.OpenAI, model: str) -> None:
    assert [m.id for m in client.models.list()] == [model]


def test_content_parts_are_concatenated(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Reply with exactly: "},
                    {"type": "text", "text": "parts joined"},
                ],
            }
        ],
    )
    assert r.choices[0].message.content == "parts joined"


# --------------------------------------------------------------------------- streaming


def test_stream_starts_with_a_role_delta_and_ends_with_finish_and_done(frontend: Server, model: str) -> None:
    body = {"model": model, "messages": user("Reply with exactly: one two three"), "stream": True}
    with httpx.stream(
        "POST",
        frontend.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content == "one two three"


def test_streamed_reasoning_and_content_equal_the_non_streamed_message(
    client: openai.OpenAI, model: str
) -> None:
    messages = user("Reply with exactly: streaming equals batch")
    whole = client.chat.completions.create(model=model, messages=messages, seed=7)
    parts = collect_stream(
        client.chat.completions.create(model=model, messages=messages, seed=7, stream=True)
    )
    assert parts["content"][0] == whole.choices[0].message.content == "streaming equals batch"
    assert parts["reasoning"][0] == whole.choices[0].message.reasoning_content
    assert_clean(parts["content"][0], parts["reasoning"][0])
    assert parts["finish"] == {0: "stop"}


def test_thinking_can_be_switched_off_by_each_request_field(client: openai.OpenAI, model: str) -> None:
    for extra in (
        {"thinking": {"type": "disabled"}},
        {"chat_template_kwargs": {"thinking": False}},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"reasoning_effort": "none"},
    ):
        r = client.chat.completions.create(
            model=model, messages=user("Reply with exactly: quick"), extra_body=extra
        )
        msg = r.choices[0].message
        assert msg.content == "quick", extra
        assert getattr(msg, "reasoning_content", None) is None, extra
        assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_usage_arrives_in_a_final_chunk_when_asked(client: openai.OpenAI, model: str) -> None:
    messages = user("Reply with exactly: count me")
    whole = client.chat.completions.create(model=model, messages=messages)
    parts = collect_stream(
        client.chat.completions.create(
            model=model, messages=messages, stream=True, stream_options={"include_usage": True}
        )
    )
    last = parts["chunks"][-1]
    assert last.choices == []
    assert parts["usage"].completion_tokens == whole.usage.completion_tokens
    assert parts["usage"].prompt_tokens == whole.usage.prompt_tokens
    assert parts["usage"].completion_tokens_details.reasoning_tokens > 0
    without = collect_stream(client.chat.completions.create(model=model, messages=messages, stream=True))
    assert without["usage"] is None


# --------------------------------------------------------------------------- tools


def test_auto_tool_call_streams_id_name_and_arguments(client: openai.OpenAI, model: str) -> None:
    parts = collect_stream(
        client.chat.completions.create(
            model=model, messages=user("What is the weather in Paris?"), tools=[WEATHER], stream=True
        )
    )
    calls = parts["calls"][0]
    assert list(calls) == [0]
    call = calls[0]
    assert call["id"].startswith("call_")
    assert call["name"] == "get_weather"
    assert json.loads(call["args"])["city"] == "Paris"
    assert parts["finish"] == {0: "tool_calls"}
    assert_clean(parts["content"].get(0), parts["reasoning"].get(0))


def test_non_streamed_tool_call_has_null_content(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=user("What is the weather in Paris?"), tools=[WEATHER]
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content is None
    assert [c.function.name for c in msg.tool_calls] == ["get_weather"]
    assert json.loads(msg.tool_calls[0].function.arguments)["city"] == "Paris"


def test_tool_choice_none_removes_the_tools(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=user("What is the weather in Paris?"), tools=[WEATHER], tool_choice="none"
    )
    msg = r.choices[0].message
    assert msg.tool_calls is None
    assert r.choices[0].finish_reason == "stop"
    assert msg.content
    assert_clean(msg.content)


def test_tool_choice_required_forces_a_call_the_prompt_did_not_ask_for(
    client: openai.OpenAI, model: str
) -> None:
    for thinking in ("enabled", "disabled"):
        r = client.chat.completions.create(
            model=model,
            messages=user("Reply with exactly: no tools needed"),
            tools=[WEATHER],
            tool_choice="required",
            extra_body={"thinking": {"type": thinking}},
        )
        assert r.choices[0].finish_reason == "tool_calls", thinking
        assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]


def test_named_tool_choice_calls_that_tool(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=user("What is the weather in Paris?"),
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    assert "zone" in json.loads(calls[0].function.arguments)


def test_parallel_calls_get_distinct_ids_and_indexes(client: openai.OpenAI, model: str) -> None:
    parts = collect_stream(
        client.chat.completions.create(
            model=model,
            messages=user("What is the weather in Paris and in Tokyo? Check both."),
            tools=[WEATHER],
            stream=True,
        )
    )
    calls = parts["calls"][0]
    assert sorted(calls) == [0, 1]
    assert calls[0]["id"] != calls[1]["id"]
    cities = [json.loads(calls[i]["args"])["city"] for i in (0, 1)]
    assert cities == ["Paris", "Tokyo"]
    assert parts["finish"] == {0: "tool_calls"}


def test_a_conversation_with_tool_results_round_trips(client: openai.OpenAI, model: str) -> None:
    first = client.chat.completions.create(
        model=model, messages=user("What is the weather in Paris?"), tools=[WEATHER]
    )
    msg = first.choices[0].message
    call = msg.tool_calls[0]
    history = [
        *user("What is the weather in Paris?"),
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": msg.reasoning_content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    second = client.chat.completions.create(model=model, messages=history, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop"
    assert "sunny, 21C" in second.choices[0].message.content


# --------------------------------------------------------------------------- stop, n


def test_stop_string_truncates_the_answer(client: openai.OpenAI, model: str) -> None:
    messages = user("Reply with exactly: alpha beta STOP gamma")
    r = client.chat.completions.create(model=model, messages=messages, stop=["STOP"])
    assert r.choices[0].message.content == "alpha beta "
    assert r.choices[0].finish_reason == "stop"
    parts = collect_stream(
        client.chat.completions.create(model=model, messages=messages, stop="STOP", stream=True)
    )
    assert parts["content"][0] == "alpha beta "
    assert parts["finish"] == {0: "stop"}


def test_max_tokens_cuts_with_finish_length(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=user("write 50 words"), max_tokens=5)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_n_2_returns_two_complete_choices(client: openai.OpenAI, model: str) -> None:
    messages = user("Reply with exactly: twice")
    r = client.chat.completions.create(model=model, messages=messages, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.message.content for c in r.choices] == ["twice", "twice"]
    parts = collect_stream(client.chat.completions.create(model=model, messages=messages, n=2, stream=True))
    assert parts["content"] == {0: "twice", 1: "twice"}
    assert parts["finish"] == {0: "stop", 1: "stop"}


def test_logprobs_are_returned_when_asked(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=user("Reply with exactly: hi"),
        logprobs=True,
        top_logprobs=1,
        extra_body={"thinking": {"type": "disabled"}},
    )
    content = r.choices[0].logprobs.content
    # the answer's tokens: everything generated but the EOS token
    assert len(content) == r.usage.completion_tokens - 1
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert all(isinstance(t.logprob, float) for t in content)


# --------------------------------------------------------------------------- completions


def test_raw_completions_pass_the_prompt_through(client: openai.OpenAI, model: str) -> None:
    prompt = "<｜begin▁of▁sentence｜><｜User｜>Reply with exactly: raw text<｜Assistant｜></think>"
    r = client.completions.create(model=model, prompt=prompt, max_tokens=50)
    assert r.choices[0].text == "raw text"
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=model, prompt=prompt, max_tokens=50, stream=True)
        if c.choices
    )
    assert streamed == "raw text"


# --------------------------------------------------------------------------- bad input


def test_errors_are_openai_shaped_with_status_and_param(frontend: Server, model: str) -> None:
    url = frontend.url + "/v1/chat/completions"
    auth = {"Authorization": f"Bearer {API_KEY}"}
    cases = [
        (b"{not json", 400, None),
        (json.dumps({"model": model}).encode(), 400, "messages"),
        (
            json.dumps({"model": model, "messages": [{"role": "robot", "content": "x"}]}).encode(),
            400,
            "messages[0].role",
        ),
        (json.dumps({"model": "nope", "messages": user("x")}).encode(), 404, "model"),
        (
            json.dumps({"model": model, "messages": user("x"), "max_tokens": 70000}).encode(),
            400,
            "max_tokens",
        ),
    ]
    for body, status, param in cases:
        r = httpx.post(url, content=body, headers={**auth, "content-type": "application/json"})
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"]
        assert error["param"] == param


def test_a_body_over_the_size_limit_is_413(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model=model, messages=user("x" * (MAX_BODY + 10)))
    assert info.value.status_code == 413
    assert info.value.code == "payload_too_large"


def test_the_openai_client_sees_typed_errors(client: openai.OpenAI, frontend: Server, model: str) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=user("x"))
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=user("x"), max_tokens=70000)
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        )
    wrong = openai.OpenAI(base_url=frontend.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=model, messages=user("x"))


def test_a_missing_api_key_is_401_but_probes_need_none(frontend: Server) -> None:
    r = httpx.post(frontend.url + "/v1/chat/completions", json={"messages": user("x")})
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(
        frontend.url + "/v1/chat/completions",
        json={"messages": user("Reply with exactly: k")},
        headers={"x-api-key": API_KEY},
    )
    assert r.status_code == 200
    for path in ("/health", "/live", "/metrics"):
        assert httpx.get(frontend.url + path).status_code == 200


def test_metrics_count_requests_and_tokens(frontend: Server, client: openai.OpenAI, model: str) -> None:
    client.chat.completions.create(model=model, messages=user("Reply with exactly: metered"))
    text = httpx.get(frontend.url + "/metrics").text
    # every series of a model's own state carries its served name
    assert (
        f'deepseek_frontend_requests_total{{endpoint="/v1/chat/completions",error_type="",model="{model}",'
        'status="200"}' in text
    )
    assert "deepseek_frontend_time_to_first_token_seconds_count" in text
    assert "deepseek_frontend_generation_tokens_total" in text
    assert f'deepseek_frontend_worker_healthy{{model="{model}",worker="' in text


# --------------------------------------------------------------------------- load


@pytest.mark.slow
def test_200_concurrent_streams_all_complete_with_their_own_content(
    aclient: openai.AsyncOpenAI, model: str
) -> None:
    async def one(i: int) -> tuple[str, str | None]:
        stream = await aclient.chat.completions.create(
            model=model,
            messages=user(f"Reply with exactly: stream number {i} done"),
            stream=True,
            extra_body={"thinking": {"type": "disabled"}},
        )
        text, finish = "", None
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return text, finish

    async def run() -> list[tuple[str, str | None]]:
        try:
            return await asyncio.gather(*(one(i) for i in range(200)))
        finally:
            await aclient.close()

    results = asyncio.run(run())
    assert results == [(f"stream number {i} done", "stop") for i in range(200)]
