"""``include: ["message.output_text.logprobs"]`` on ``/v1/responses``, with the official ``openai`` SDK.

The logprobs are the answer tokens' (the pipeline leaves out reasoning, ``</think>`` and
EOS, as for Chat Completions): their token texts join to the ``output_text``, streamed or
not, each ``output_text.delta`` carrying the tokens of its own text.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from deepseek_frontend.api.responses.convert import convert_responses_request
from deepseek_frontend.errors import RequestError

MODEL = "gpt-logprobs-test"
INCLUDE: Any = ["message.output_text.logprobs"]
PROMPT = "Reply with exactly: aligned logprobs here"


def _message_part(response: Any) -> Any:
    (message,) = [item for item in response.output if item.type == "message"]
    (part,) = message.content
    return part


def test_included_logprobs_hold_exactly_the_answer_tokens(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input=PROMPT, include=INCLUDE, top_logprobs=2)
    assert any(item.type == "reasoning" for item in response.output)  # the model did reason
    part = _message_part(response)
    assert part.text == "aligned logprobs here"
    assert part.logprobs and "".join(lp.token for lp in part.logprobs) == part.text
    for lp in part.logprobs:
        assert lp.logprob <= 0 and bytes(lp.bytes) == lp.token.encode()
        assert 1 <= len(lp.top_logprobs) <= 2 and all(t.logprob <= 0 for t in lp.top_logprobs)


def test_streamed_deltas_carry_the_logprobs_of_their_own_text(client: openai.OpenAI) -> None:
    deltas: list[Any] = []
    done: Any = None
    with client.responses.stream(model=MODEL, input=PROMPT, include=INCLUDE) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event)
            elif event.type == "response.output_text.done":
                done = event
        final = stream.get_final_response()
    assert deltas and done is not None
    text = "".join(d.delta for d in deltas)
    assert text == done.text == "aligned logprobs here"
    assert "".join(lp.token for d in deltas for lp in d.logprobs) == text
    assert [lp.token for lp in done.logprobs] == [lp.token for d in deltas for lp in d.logprobs]
    assert [lp.token for lp in _message_part(final).logprobs] == [lp.token for lp in done.logprobs]
    assert all(lp.top_logprobs == [] for lp in done.logprobs)  # top_logprobs not asked for


def test_without_include_no_logprobs_are_computed(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input=PROMPT, top_logprobs=2)
    assert _message_part(response).logprobs == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"include": "message.output_text.logprobs"}, "include"),
        ({"include": [3]}, "include[0]"),
        ({"include": INCLUDE, "top_logprobs": 21}, "top_logprobs"),
    ],
)
def test_bad_include_or_top_logprobs_names_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as err:
        convert_responses_request({"model": "m", "input": "hi", **fields})
    assert err.value.param == param


def test_bad_top_logprobs_is_a_400_over_http(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input=PROMPT, include=INCLUDE, top_logprobs=-1)
    assert "top_logprobs" in str(err.value)
