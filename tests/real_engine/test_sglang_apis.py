"""Every client API of ``serve --engine sglang --router-mode kv`` over a real aggregated SGLang 0.5.23 (CPU).

One frontend for the module, routing in ``kv`` mode over the aggregated server of
:mod:`tests.real_engine.sglang_servers` (its KV events on ZMQ, discovered from ``/server_info``). The model
is the tiny random-weight Llama with our tokenizer, so text is noise and the checks are what a client relies
on: status, one finish per answer and per stream, usage that adds up, no DeepSeek tool-call markup in text,
constrained output that parses and validates (SGLang's xgrammar backend, which runs on the CPU), aborts of a
client that left as SGLang itself counts them, ``n`` with stop strings, and the KV router fed by the worker.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from tests.real_engine.sglang_clients import (
    DSML,
    MAX_TOKENS,
    QUESTION,
    SERVED_MODEL,
    TIMEOUT,
    metric,
    sglang_frontend,
    sse_data,
    sse_typed,
    wait_for,
)
from tests.real_engine.sglang_servers import SGLangFleet, SGLangServer
from tests.support.servers import Server

#: a test that starts servers waits for them within its own timeout
pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1200)]

#: no reasoning block: a random model in a free-text reasoning block would never leave it
NO_THINKING = {"thinking": {"type": "disabled"}}


@pytest.fixture(scope="module")
def worker(sglang_fleet: SGLangFleet) -> SGLangServer:
    return sglang_fleet.aggregated()


@pytest.fixture(scope="module")
def frontend(worker: SGLangServer) -> Iterator[Server]:
    with sglang_frontend("--worker", worker.url, "--router-mode", "kv") as server:
        yield server


def post(frontend: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    response = httpx.post(frontend.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == 200, f"{response.status_code} {response.text}\n{frontend.log()[-4000:]}"
    assert DSML not in response.text, response.text
    return response


def chat_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0.0,
        "max_tokens": MAX_TOKENS,
        **NO_THINKING,
        **extra,
    }


# -- 1. every API ------------------------------------------------------------------------------------------


def test_chat_completions_unstreamed_and_streamed_agree(frontend: Server) -> None:
    answer = post(frontend, "/v1/chat/completions", chat_body()).json()
    [choice] = answer["choices"]
    usage = answer["usage"]
    assert choice["finish_reason"] in ("stop", "length")
    assert 0 < usage["completion_tokens"] <= MAX_TOKENS and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    stream = post(
        frontend, "/v1/chat/completions", chat_body(stream=True, stream_options={"include_usage": True})
    )
    events = sse_data(stream.text)
    deltas = [e["choices"][0] for e in events if e.get("choices")]
    finishes = [d["finish_reason"] for d in deltas if d["finish_reason"] is not None]
    [streamed_usage] = [e["usage"] for e in events if e.get("usage")]
    # greedy over one worker: the stream is the unstreamed answer in pieces
    assert "".join(d["delta"].get("content") or "" for d in deltas) == choice["message"]["content"]
    assert finishes == [choice["finish_reason"]]
    # cached_tokens may differ: the second request finds the first one's prompt in the radix cache
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert streamed_usage[key] == usage[key], (streamed_usage, usage)
    assert streamed_usage["prompt_tokens_details"]["cached_tokens"] > 0


def test_completions(frontend: Server) -> None:
    body = {"model": SERVED_MODEL, "prompt": "The sea is", "max_tokens": MAX_TOKENS, "temperature": 0.0}
    answer = post(frontend, "/v1/completions", body).json()
    [choice] = answer["choices"]
    usage = answer["usage"]
    assert choice["finish_reason"] in ("stop", "length") and isinstance(choice["text"], str)
    assert 0 < usage["completion_tokens"] <= MAX_TOKENS
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    events = sse_data(post(frontend, "/v1/completions", body | {"stream": True}).text)
    assert "".join(e["choices"][0]["text"] for e in events if e.get("choices")) == choice["text"]
    assert [
        e["choices"][0]["finish_reason"]
        for e in events
        if e.get("choices") and e["choices"][0].get("finish_reason")
    ] == [choice["finish_reason"]]


def test_responses_unstreamed_and_streamed(frontend: Server) -> None:
    body = {
        "model": SERVED_MODEL,
        "input": QUESTION,
        "max_output_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "store": False,
        "reasoning": {"effort": "none"},
    }
    answer = post(frontend, "/v1/responses", body).json()
    usage = answer["usage"]
    assert answer["status"] in ("completed", "incomplete"), answer
    assert 0 < usage["output_tokens"] <= MAX_TOKENS and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    text = "".join(
        part["text"]
        for item in answer["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )

    events = sse_typed(post(frontend, "/v1/responses", body | {"stream": True}).text)
    terminal = [data for name, data in events if name in ("response.completed", "response.incomplete")]
    assert len(terminal) == 1, [name for name, _ in events]
    final = terminal[0]["response"]
    assert final["status"] == answer["status"]
    assert final["usage"]["output_tokens"] == usage["output_tokens"]
    assert "".join(data["delta"] for name, data in events if name == "response.output_text.delta") == text


def test_anthropic_messages_unstreamed_and_streamed(frontend: Server) -> None:
    body = {
        "model": SERVED_MODEL,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    answer = post(frontend, "/v1/messages", body).json()
    assert answer["type"] == "message" and answer["stop_reason"] in ("end_turn", "max_tokens")
    assert 0 < answer["usage"]["output_tokens"] <= MAX_TOKENS and answer["usage"]["input_tokens"] > 0
    text = "".join(block["text"] for block in answer["content"] if block["type"] == "text")

    events = sse_typed(post(frontend, "/v1/messages", body | {"stream": True}).text)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop" and names.count("message_stop") == 1
    [delta] = [data for name, data in events if name == "message_delta"]
    assert delta["delta"]["stop_reason"] == answer["stop_reason"]
    assert delta["usage"]["output_tokens"] == answer["usage"]["output_tokens"]
    streamed = "".join(
        data["delta"].get("text", "") for name, data in events if name == "content_block_delta"
    )
    assert streamed == text


# -- 2. constrained decoding on SGLang's grammar backend -----------------------------------------------------

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "sea": {"enum": ["calm", "rough"]}},
    "required": ["ok", "sea"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "boolean"}},
            "required": ["unit", "days"],
            "additionalProperties": False,
        },
    },
}


def test_worker_compiles_grammars_with_xgrammar(worker: SGLangServer) -> None:
    assert worker.server_info()["grammar_backend"] == "xgrammar"


def test_response_format_json_schema_gives_valid_json(frontend: Server) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}
    answer = post(
        frontend, "/v1/chat/completions", chat_body(max_tokens=48, response_format=response_format)
    ).json()
    [choice] = answer["choices"]
    assert choice["finish_reason"] == "stop", answer
    jsonschema.validate(json.loads(choice["message"]["content"]), ANSWER_SCHEMA)


@pytest.mark.parametrize(
    "tool_choice",
    [{"type": "function", "function": {"name": "get_weather"}}, "required"],
    ids=["named", "required"],
)
def test_forced_tool_call_has_schema_valid_arguments(frontend: Server, tool_choice: Any) -> None:
    """The grammar forces calls of the tool whose arguments follow its schema. It does not force one call:
    ``parallel_tool_calls`` is not enforced (DeepSeek decides how many calls a turn makes, api/adapters.py),
    and the random model goes on calling until its length; every call the client gets is whole and valid."""
    answer = post(
        frontend,
        "/v1/chat/completions",
        chat_body(max_tokens=256, tools=[WEATHER_TOOL], tool_choice=tool_choice),
    ).json()
    [choice] = answer["choices"]
    assert choice["finish_reason"] in ("tool_calls", "length"), answer
    assert not choice["message"]["content"], answer
    calls = choice["message"]["tool_calls"]
    assert calls, answer
    for call in calls:
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER_TOOL["function"]["parameters"])


# -- 3. a client that leaves mid-stream --------------------------------------------------------------------


def test_closed_stream_is_aborted_on_the_worker_while_a_sibling_finishes(
    frontend: Server, worker: SGLangServer
) -> None:
    """The abandoned stream would run for ~2000 tokens; SGLang counts it aborted and its running gauge returns
    to 0, while a request streaming next to it on the same worker ends normally with all its tokens."""
    aborted = metric(worker.url, "sglang:num_aborted_requests_total")
    sibling_tokens = 48
    with httpx.Client(timeout=TIMEOUT) as client:
        victim_cm = client.stream(
            "POST",
            frontend.url + "/v1/chat/completions",
            json=chat_body(max_tokens=1900, stream=True),
        )
        victim = victim_cm.__enter__()
        assert victim.status_code == 200
        victim_lines = victim.iter_lines()
        content_chunks = 0
        for line in victim_lines:
            if line.startswith("data:") and '"content"' in line:
                content_chunks += 1
                if content_chunks == 3:
                    break
        assert content_chunks == 3
        with client.stream(
            "POST",
            frontend.url + "/v1/chat/completions",
            json=chat_body(
                max_tokens=sibling_tokens,
                stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": "Another question, about rivers."}],
            ),
        ) as sibling:
            assert sibling.status_code == 200
            sibling_lines = sibling.iter_lines()
            first = next(line for line in sibling_lines if line.startswith("data:"))
            # both run on the worker now; the client walks away from the first one
            victim_cm.__exit__(None, None, None)
            rest = "\n".join([first, *sibling_lines])
    events = sse_data(rest)
    finishes = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")]
    finishes = [f for f in finishes if f is not None]
    [usage] = [e["usage"] for e in events if e.get("usage")]
    assert finishes == ["length"], finishes
    assert usage["completion_tokens"] == sibling_tokens
    wait_for(
        lambda: metric(worker.url, "sglang:num_aborted_requests_total") > aborted,
        "SGLang counts the abandoned stream aborted",
    )
    wait_for(lambda: metric(worker.url, "sglang:num_running_reqs") == 0, "SGLang runs no request")


# -- 4. n choices with a stop string -----------------------------------------------------------------------


def test_n_choices_with_a_stop_string_all_finish(frontend: Server) -> None:
    """Twelve sampled choices (ids up to 11: under prefix rids, aborting choice 1 would end choices 10 and 11)
    and a stop string some of them meet: every choice ends, stopped or at its length, and none holds the stop
    string. Sampling on the CPU is not reproducible across batches (even seeded), so the stop string is a
    character about half of an unstopped run's choices hold, and the stopped run is repeated (at most three
    times) until it has both kinds of choice, the case at issue."""
    n, max_tokens = 12, 16
    body = chat_body(max_tokens=max_tokens, temperature=1.0, n=n)
    texts = [
        c["message"]["content"] or "" for c in post(frontend, "/v1/chat/completions", body).json()["choices"]
    ]
    holders = Counter(ch for text in texts for ch in set(text[1:]) if not ch.isspace())
    assert holders, texts
    stop = min(holders, key=lambda ch: abs(holders[ch] - n / 2))
    seen: list[set[str]] = []
    for _ in range(3):
        answer = post(frontend, "/v1/chat/completions", body | {"stop": [stop]}).json()
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        assert [c["index"] for c in choices] == list(range(n))
        assert all(c["finish_reason"] in ("stop", "length") for c in choices), choices
        assert all(stop not in (c["message"]["content"] or "") for c in choices), (stop, choices)
        assert 0 < answer["usage"]["completion_tokens"] <= n * max_tokens
        seen.append({c["finish_reason"] for c in choices})
        if seen[-1] == {"stop", "length"}:
            break
    assert seen[-1] == {"stop", "length"}, (stop, seen)


# -- 5. KV events into the kv router -----------------------------------------------------------------------


def test_kv_router_indexes_the_workers_events_and_prefix_hits_are_cached(
    frontend: Server, worker: SGLangServer
) -> None:
    """The frontend found the worker's ZMQ publisher through ``/server_info``, applies its events (blocks
    indexed for the worker), and a prompt sharing a long prefix with an earlier one is served from cache."""
    shared = " ".join(f"harbour{i}" for i in range(120))

    def ask(tail: str) -> dict[str, Any]:
        body = chat_body(max_tokens=4, messages=[{"role": "user", "content": f"{shared} {tail}"}])
        return post(frontend, "/v1/chat/completions", body).json()

    # a subscriber misses what is published before its connection is up (ZMQ's slow joiner): ask with fresh
    # tails until the frontend has applied events
    for attempt in range(10):
        ask(f"first question {attempt}")
        try:
            wait_for(lambda: metric(frontend.url, "deepseek_frontend_kv_events_total") > 0, "KV events", 3.0)
            break
        except AssertionError:
            continue
    assert metric(frontend.url, "deepseek_frontend_kv_events_total") > 0, frontend.log()[-4000:]
    assert metric(frontend.url, "deepseek_frontend_worker_kv_indexed_blocks", worker=worker.url) > 0
    follow_up = ask("second question")
    cached = follow_up["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 100, follow_up["usage"]
