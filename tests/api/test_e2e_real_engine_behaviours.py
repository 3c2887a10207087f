"""End to end over real HTTP: the frontend against sim-engine servers that behave like SGLang 0.5.23.

``recipe``: the recipe's original worker (``--behave sglang-recipe``): ``--skip-tokenizer-init`` so no
grammar backend, EAGLE reserving 4 output slots in a 1,048,576-token context it does not report,
``sampling_seed`` ignored, and ``/health`` taking 1.5 s (it generates in SGLang).
``grammar``: the recipe's worker as it launches now (``--behave sglang-recipe-grammar``) with
``--enable-deterministic-inference``.

Frontends: ``fitted`` over ``recipe`` with the model's real context; ``oversized`` over ``recipe``
believing in a longer context than the worker has, so the worker's own in-stream 400 reaches it;
``grammar_frontend`` over ``grammar``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.fixtures import server_fixture
from tests.support.servers import Server, start_frontend, start_sim_engine

pytestmark = pytest.mark.slow

CONTEXT = 1_048_576
NO_THINKING = {"thinking": {"type": "disabled"}}
RESERVED = 4  # EAGLE, 3 steps, top-k 1, 4 draft tokens
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

recipe = server_fixture(
    start_sim_engine, "--behave", "sglang-recipe", "--health-delay-ms", "1500", scope="module"
)
grammar = server_fixture(
    start_sim_engine, "--behave", "sglang-recipe-grammar", "--enable-deterministic-inference", scope="module"
)


@pytest.fixture(scope="module")
def fitted(recipe: Server) -> Iterator[Server]:
    # Probes every 0.2 s that must finish within 1 s: a probe of the 1.5 s /health would eject the worker.
    with start_frontend(
        "--worker", recipe.url, "--health-check-interval", "0.2", "--health-check-timeout", "1"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def oversized(recipe: Server) -> Iterator[Server]:
    with start_frontend(
        "--worker", recipe.url, "--context-length", str(2 * CONTEXT), "--health-check-interval", "300"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def grammar_frontend(grammar: Server) -> Iterator[Server]:
    with start_frontend("--worker", grammar.url) as server:
        yield server


def oa(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def worker_state(server: Server) -> dict[str, Any]:
    body = httpx.get(server.url + "/health", timeout=10).json()
    (worker,) = body["workers"]
    return worker


def prompt_tokens(server: Server, text: str) -> int:
    """The prompt size the frontend sends for ``user(text)`` in chat mode (a 1-token answer's usage)."""
    done = oa(server).chat.completions.create(
        model="deepseek-v4-flash", messages=user(text), max_tokens=1, extra_body=NO_THINKING
    )
    assert done.usage is not None
    return done.usage.prompt_tokens


def test_a_request_without_max_tokens_leaves_the_reserved_slots_and_succeeds(fitted: Server) -> None:
    for stream in (False, True):
        if stream:
            chunks = list(
                oa(fitted).chat.completions.create(
                    model="deepseek-v4-flash", messages=user("Say hi."), stream=True
                )
            )
            assert chunks[-1].choices[0].finish_reason == "stop"
        else:
            done = oa(fitted).chat.completions.create(model="deepseek-v4-flash", messages=user("Say hi."))
            assert done.choices[0].finish_reason == "stop" and done.choices[0].message.content
    assert worker_state(fitted)["consecutive_failures"] == 0


def test_max_tokens_that_leave_no_room_for_the_reservation_is_a_400_naming_max_tokens(fitted: Server) -> None:
    text = "Count to three."
    prompt = prompt_tokens(fitted, text)
    fits = CONTEXT - prompt - RESERVED
    done = oa(fitted).chat.completions.create(
        model="deepseek-v4-flash", messages=user(text), max_tokens=fits, extra_body=NO_THINKING
    )
    assert done.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as info:
        oa(fitted).chat.completions.create(
            model="deepseek-v4-flash", messages=user(text), max_tokens=fits + 1, extra_body=NO_THINKING
        )
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == "max_tokens"
    assert "reserved" in error["message"] and str(fits) in error["message"]


def test_constrained_requests_are_refused_up_front_without_a_grammar_backend(fitted: Server) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oa(fitted).chat.completions.create(
            model="deepseek-v4-flash",
            messages=user("Weather in Paris?"),
            tools=[WEATHER],
            tool_choice="required",
        )
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "tool_choice"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with pytest.raises(openai.BadRequestError) as info:
        oa(fitted).chat.completions.create(
            model="deepseek-v4-flash",
            messages=user("Give me a."),
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
            extra_body=NO_THINKING,
        )
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "response_format"
    # tool_choice auto needs no grammar and still works
    done = oa(fitted).chat.completions.create(
        model="deepseek-v4-flash", messages=user("Weather in Paris?"), tools=[WEATHER]
    )
    assert done.choices[0].finish_reason in ("stop", "tool_calls")


def test_the_health_probe_does_not_wait_for_the_slow_generating_health_endpoint(fitted: Server) -> None:
    state = worker_state(fitted)
    assert state["healthy"] and state["consecutive_failures"] == 0
    caps = state["capabilities"]
    assert caps["constraint_kinds"] == [] and caps["reserved_output_tokens"] == RESERVED
    assert caps["honours_seed"] is False


def seeded_answer(server: Server, seed: int) -> str | None:
    """The same question asked with ``seed`` (thinking off): the answer's content."""
    return (
        oa(server)
        .chat.completions.create(
            model="deepseek-v4-flash",
            messages=user("Tell me about otters."),
            seed=seed,
            extra_body=NO_THINKING,
        )
        .choices[0]
        .message.content
    )


def test_seeds_are_passed_but_ignored_by_a_worker_without_deterministic_inference(fitted: Server) -> None:
    answers = {seeded_answer(fitted, seed) for seed in (1, 2, 3)}
    assert len(answers) == 1


def test_seeds_vary_the_answer_on_a_deterministic_worker(grammar_frontend: Server) -> None:
    def ask(seed: int) -> str | None:
        return seeded_answer(grammar_frontend, seed)

    assert ask(1) == ask(1)
    assert len({ask(1), ask(2), ask(3)}) > 1


def test_tool_choice_required_works_on_the_recipe_with_its_tokenizer_loaded(grammar_frontend: Server) -> None:
    done = oa(grammar_frontend).chat.completions.create(
        model="deepseek-v4-flash", messages=user("Say hello."), tools=[WEATHER], tool_choice="required"
    )
    calls = done.choices[0].message.tool_calls
    assert done.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather"


# ---------------------------------------- the worker's own in-stream 400 (the frontend is misconfigured)


def test_the_workers_in_stream_400_reaches_each_api_as_a_400_and_never_ejects_it(oversized: Server) -> None:
    too_many = CONTEXT  # fits the frontend's 2M context, not the worker's 1M one
    for _ in range(4):  # more than the three failures that would eject a worker
        with pytest.raises(openai.BadRequestError) as info:
            oa(oversized).chat.completions.create(
                model="deepseek-v4-flash", messages=user("Hello"), max_tokens=too_many, stream=True
            )
        body = info.value.body
        assert isinstance(body, dict) and "maximum context length" in body["message"]
        assert body["type"] == "invalid_request_error"

    with pytest.raises(anthropic.BadRequestError) as a_info:
        anthropic.Anthropic(base_url=oversized.url, api_key="unused", max_retries=0).messages.create(
            model="deepseek-v4-flash",
            max_tokens=too_many,
            messages=[{"role": "user", "content": "Hello"}],
            stream=True,  # the SDK refuses a non-streaming request this long
        )
    a_body = a_info.value.body
    assert isinstance(a_body, dict) and a_body["type"] == "error"
    assert a_body["error"]["type"] == "invalid_request_error"
    assert "maximum context length" in a_body["error"]["message"]

    with pytest.raises(openai.BadRequestError) as r_info:
        oa(oversized).responses.create(model="deepseek-v4-flash", input="Hello", max_output_tokens=too_many)
    assert "maximum context length" in str(r_info.value.body)

    state = worker_state(oversized)
    assert state["healthy"] and state["consecutive_failures"] == 0 and state["failures"] == 0
    # and the worker still serves valid requests
    done = oa(oversized).chat.completions.create(
        model="deepseek-v4-flash", messages=user("Hi"), max_tokens=20
    )
    assert done.choices[0].message.content or done.choices[0].message.model_extra
