"""Requests without a ``thinking`` field: Anthropic's answer shape, the server's thinking mode.

Anthropic returns thinking blocks only when a request enables thinking; LangChain's
``ChatAnthropic(...).invoke("Hi").content`` is a string only when the answer is one text
block. The model still thinks per ``--default-thinking`` (on here): the reasoning is
withheld from the answer, counted in ``output_tokens``, and restored into the replayed
tool-call turn (``api/anthropic/hidden_thinking.py``) so the tool loop's prompt is the one
the model generated against. A turn whose ids the server does not know renders with an
empty reasoning, as deepseek-recipe renders it (``test_recipe_oracle.py``).
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from deepseek_frontend.api.adapters import to_chat_request
from deepseek_frontend.api.anthropic.convert import convert_messages_request
from deepseek_frontend.api.anthropic.events import MessagesStreamEncoder, accumulate_message
from deepseek_frontend.api.anthropic.hidden_thinking import HiddenReasoning
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.pipeline.chat import ChatPipeline
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support import tools

from .test_recipe_oracle import render_only

CONFIG = ServerConfig(ModelConfig(served_model_name="DeepSeek-V4-Pro"))

MODEL = "claude-agent-test"
WEATHER = tools.WEATHER.anthropic()
SHOW: Any = {"type": "enabled", "budget_tokens": 1024}
OFF: Any = {"type": "disabled"}
HI = [{"role": "user", "content": "Hi"}]
ASK = {"role": "user", "content": "What is the weather in Paris?"}


# --------------------------------------------------------------------------- the store


def test_store_keeps_reasoning_under_every_call_id_and_restores_only_turns_without_reasoning() -> None:
    store = HiddenReasoning()
    store.remember(["toolu_a", "toolu_b"], "R")
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "toolu_b", "type": "function"}]},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "toolu_x", "type": "function"}]},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "sent",
            "tool_calls": [{"id": "toolu_a", "type": "function"}],
        },
        {"role": "assistant", "content": "text only"},
    ]
    assert store.restore(messages) == 1
    assert messages[1]["reasoning_content"] == "R"
    assert "reasoning_content" not in messages[2]  # unknown id: rendered with an empty reasoning
    assert messages[3]["reasoning_content"] == "sent"  # the client's own thinking wins
    assert "reasoning_content" not in messages[4]


def test_store_is_bounded_by_entries_and_characters_least_recently_used_first() -> None:
    store = HiddenReasoning(max_entries=2, max_chars=10)
    store.remember(["a"], "1234")
    store.remember(["b"], "5678")
    assert store.lookup(["a"]) == "1234"  # a is now the most recently used
    store.remember(["c"], "90")
    assert (store.lookup(["b"]), store.lookup(["a"]), store.lookup(["c"])) == (None, "1234", "90")
    store.remember(["d"], "abcdefgh")  # 4 + 2 + 8 chars > 10: the least recent (a) goes
    assert store.lookup(["a"]) is None and store.chars == 10 and store.lookup(["c", "d"]) == "90"
    store.remember(["e"], "x" * 11)  # longer than the whole bound: not kept, nothing evicted
    assert store.lookup(["e"]) is None and store.lookup(["d"]) == "abcdefgh" and len(store) == 2
    store.remember(["f"], "")
    assert store.lookup(["f"]) is None


# --------------------------------------------------------------------------- the encoder


def _answer(encoder: MessagesStreamEncoder, *, call: bool) -> dict[str, Any]:
    events = encoder.start()
    events += encoder.reasoning("Let me ")
    events += encoder.reasoning("check.")
    if call:
        events += encoder.tool_start(0, "get_weather")
        events += encoder.tool_arguments(0, '{"city": "Paris"}')
        events += encoder.tool_end(0)
        events += encoder.finish(stop_reason="tool_use", output_tokens=30)
    else:
        events += encoder.text("Hello.")
        events += encoder.finish(stop_reason="end_turn", output_tokens=12)
    assert all(
        p.get("content_block", {}).get("type") != "thinking"
        and p.get("delta", {}).get("type") not in ("thinking_delta", "signature_delta")
        for _, p in events
    )
    return accumulate_message(events)


def test_encoder_withholds_reasoning_and_keeps_it_for_the_calls_it_made() -> None:
    store = HiddenReasoning()
    encoder = MessagesStreamEncoder(model="m", input_tokens=5, show_thinking=False, hidden_reasoning=store)
    message = _answer(encoder, call=True)
    (block,) = message["content"]
    assert block["type"] == "tool_use" and block["input"] == {"city": "Paris"}
    assert message["usage"]["output_tokens"] == 30  # the hidden reasoning is billed
    assert store.lookup([block["id"]]) == "Let me check."


def test_encoder_keeps_nothing_for_a_text_answer() -> None:
    store = HiddenReasoning()
    encoder = MessagesStreamEncoder(model="m", input_tokens=5, show_thinking=False, hidden_reasoning=store)
    message = _answer(encoder, call=False)
    assert message["content"] == [{"type": "text", "text": "Hello."}]
    assert len(store) == 0


# --------------------------------------------------------------------------- the rendered prompt


@pytest.fixture(scope="module")
def pipeline(prompt_tokenizer: PromptTokenizer) -> ChatPipeline:
    return render_only(CONFIG, prompt_tokenizer)


def _prompt(pipeline: ChatPipeline, body: dict[str, Any], store: HiddenReasoning | None = None) -> str:
    converted = convert_messages_request({"model": "DeepSeek-V4-Pro", "max_tokens": 50, **body})
    if store is not None:
        store.restore(converted.messages)
    prepared = pipeline.prepare(to_chat_request(converted, CONFIG, "t"))
    return pipeline.tokenizer.decode(prepared.input_ids)


def _loop(thinking_blocks: list[Any], call_id: str = "toolu_01") -> dict[str, Any]:
    call = {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {"city": "Paris"}}
    return {
        "tools": [WEATHER],
        "messages": [
            ASK,
            {"role": "assistant", "content": [*thinking_blocks, call]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "Sunny"}],
            },
        ],
    }


def test_replayed_turn_renders_as_if_the_client_had_sent_the_thinking_back(pipeline: ChatPipeline) -> None:
    store = HiddenReasoning()
    store.remember(["toolu_01"], "Paris needs get_weather.")
    restored = _prompt(pipeline, _loop([]), store)
    sent = _prompt(
        pipeline, _loop([{"type": "thinking", "thinking": "Paris needs get_weather.", "signature": "s"}])
    )
    assert restored == sent
    assert "<think>Paris needs get_weather.</think>" in restored
    # an unknown id: the turn keeps an empty reasoning, as DeepSeek's reference encoder renders it
    unknown = _prompt(pipeline, _loop([], call_id="toolu_02"), store)
    assert "<｜Assistant｜><think></think>" in unknown and "Paris needs" not in unknown


# --------------------------------------------------------------------------- the official SDK, real server


def test_plain_hi_is_one_text_block_streamed_or_not(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=200, messages=HI)
    assert [b.type for b in message.content] == ["text"] and message.content[0].text
    events = list(client.messages.create(model=MODEL, max_tokens=200, messages=HI, stream=True))
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    deltas = {e.delta.type for e in events if e.type == "content_block_delta"}
    assert starts == ["text"] and deltas == {"text_delta"}
    with client.messages.stream(model=MODEL, max_tokens=200, messages=HI) as stream:
        assert [b.type for b in stream.get_final_message().content] == ["text"]


def test_hidden_reasoning_is_thought_and_billed_like_shown_reasoning(client: anthropic.Anthropic) -> None:
    prompt = [{"role": "user", "content": "Reply with exactly: hello there"}]
    hidden = client.messages.create(model=MODEL, max_tokens=200, messages=prompt)
    shown = client.messages.create(model=MODEL, max_tokens=200, messages=prompt, thinking=SHOW)
    off = client.messages.create(model=MODEL, max_tokens=200, messages=prompt, thinking=OFF)
    assert [b.type for b in shown.content] == ["thinking", "text"]
    assert hidden.content[0].text == shown.content[1].text == off.content[0].text == "hello there"
    assert hidden.usage.output_tokens == shown.usage.output_tokens > off.usage.output_tokens


def _replay(first: Any, blocks: list[Any]) -> list[Any]:
    (call,) = [b for b in first.content if b.type == "tool_use"]
    return [
        ASK,
        {"role": "assistant", "content": blocks},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24"}],
        },
    ]


def test_tool_loop_without_thinking_field_renders_the_reasoning_the_client_never_saw(
    client: anthropic.Anthropic,
) -> None:
    hidden = client.messages.create(model=MODEL, max_tokens=300, tools=[WEATHER], messages=[ASK])
    assert [b.type for b in hidden.content] == ["tool_use"] and hidden.stop_reason == "tool_use"
    shown = client.messages.create(
        model=MODEL, max_tokens=300, tools=[WEATHER], messages=[ASK], thinking=SHOW
    )
    thinking = next(b for b in shown.content if b.type == "thinking")

    replay = _replay(hidden, [b.model_dump(exclude_none=True) for b in hidden.content])
    with_thinking = _replay(hidden, [thinking.model_dump(), *replay[1]["content"]])

    def count(messages: list[Any]) -> int:
        return client.messages.count_tokens(model=MODEL, tools=[WEATHER], messages=messages).input_tokens

    # the server put back exactly the reasoning a thinking-enabled client would have replayed
    assert count(replay) == count(with_thinking)
    forged = [dict(m) for m in replay]
    forged[1] = {"role": "assistant", "content": [{**replay[1]["content"][0], "id": "toolu_unknown"}]}
    forged[2] = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_unknown", "content": "Sunny, 24"}],
    }
    assert count(forged) < count(replay)  # unknown id: an empty reasoning

    final = client.messages.create(model=MODEL, max_tokens=300, tools=[WEATHER], messages=replay)
    assert [b.type for b in final.content] == ["text"] and "Sunny, 24" in final.content[0].text
    # the request itself rendered the restored turn (not the shorter unknown-id rendering)
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == count(replay)
