"""The conformance checks: what any OpenAI/Anthropic-compatible DeepSeek endpoint must get right.

Every check sends real requests through the official ``openai`` and ``anthropic`` client libraries (what
users run), then asserts on what came back. Prompts are phrased so that a real DeepSeek model *and* this
project's simulated engine (``deepseek_frontend.engines.sim.model``: it calls a tool when the last user turn
names it, one call per capitalised place name when asked for "parallel"/"both" calls, and quotes a tool
result when one follows the last user turn) take the path the check needs.

Protocol checks assert wire contracts (see ``runner``); model-judgement checks reuse the same responses (one
request per scenario, memoised in :class:`SuiteContext`) and assert what a good model would do with them.

The checks live by area -- ``chat_checks`` (``/v1/models`` and chat completions), ``anthropic_checks``
(``/v1/messages``), ``image_checks`` (images and DeepSeek-V4.1), ``judgement_checks`` -- on the shared
``context`` (:class:`SuiteContext` and the request material) and ``expectations`` (the assertions). This
module owns their registry: :func:`all_checks`, the names, categories, descriptions and run order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from deepseek_frontend.e2e.anthropic_checks import check_anthropic_stream, check_anthropic_tool_round_trip
from deepseek_frontend.e2e.chat_checks import (
    check_models_list,
    check_parallel_calls,
    check_plain_chat,
    check_reasoning_split,
    check_reasoning_split_stream,
    check_special_characters,
    check_stream_shape,
    check_stream_usage,
    check_thinking_off,
    check_tool_argument_types,
    check_tool_auto_stream,
    check_tool_choice_none,
    check_tool_required,
    check_tool_result_round_trip,
    check_tool_without_parameters,
)
from deepseek_frontend.e2e.context import SuiteContext
from deepseek_frontend.e2e.image_checks import (
    check_anthropic_image,
    check_image_chat,
    check_image_token_text,
    check_v41_numeric_effort,
)
from deepseek_frontend.e2e.judgement_checks import (
    judge_arithmetic,
    judge_auto_tool_call,
    judge_image_colour,
    judge_instruction_following,
    judge_parallel_calls,
    judge_special_characters_exact,
    judge_tool_result_used,
    judge_tool_selection,
)
from deepseek_frontend.e2e.runner import Check

__all__ = ["SuiteContext", "all_checks"]


def all_checks() -> list[Check]:
    """Every check in run order (protocol first, then judgement ones that reuse their responses)."""
    protocol: Iterable[tuple[str, str, Callable[[SuiteContext], str]]] = [
        ("models_list", "GET /v1/models lists the model", check_models_list),
        ("plain_chat", "non-streaming chat: shape, finish stop, usage, no markup", check_plain_chat),
        (
            "stream_chunk_shape",
            "streamed chat: one id, role first, content, one finish, last",
            check_stream_shape,
        ),
        (
            "stream_usage",
            "stream_options.include_usage: usage only on a final choices-less chunk",
            check_stream_usage,
        ),
        (
            "reasoning_split",
            "thinking on: reasoning_content and content split, no think tags",
            check_reasoning_split,
        ),
        (
            "reasoning_split_stream",
            "thinking on, streamed: reasoning never follows content",
            check_reasoning_split_stream,
        ),
        ("thinking_off", "thinking off (two spellings): no reasoning, content only", check_thinking_off),
        ("tool_required", "tool_choice required: a call with schema-valid arguments", check_tool_required),
        (
            "tool_auto_stream",
            "tool_choice auto, streamed: id and name once, first; arguments assemble",
            check_tool_auto_stream,
        ),
        (
            "parallel_tool_calls",
            "several calls in one turn: indexes, unique ids, valid arguments",
            check_parallel_calls,
        ),
        (
            "tool_argument_types",
            "int, bool, array and object arguments keep their JSON types",
            check_tool_argument_types,
        ),
        (
            "special_characters",
            "quotes, backslashes, newlines, unicode in arguments stay valid JSON",
            check_special_characters,
        ),
        (
            "tool_without_parameters",
            "a tool with no parameters gets {} arguments",
            check_tool_without_parameters,
        ),
        (
            "tool_result_round_trip",
            "a tool result in the history is consumed into a text answer",
            check_tool_result_round_trip,
        ),
        ("tool_choice_none", "tool_choice none: text only, no calls, no DSML", check_tool_choice_none),
        (
            "anthropic_tool_round_trip",
            "/v1/messages: tool_use then tool_result -> end_turn",
            check_anthropic_tool_round_trip,
        ),
        (
            "anthropic_stream_events",
            "/v1/messages streamed: event and block order, input_json_delta is valid JSON",
            check_anthropic_stream,
        ),
        ("image_chat", "an image_url part reaches the model; usage counts its tokens", check_image_chat),
        ("anthropic_image", "/v1/messages: a base64 image block is answered", check_anthropic_image),
        (
            "image_token_as_text",
            "a typed <｜deepseek_image｜> is text: no error, no image",
            check_image_token_text,
        ),
        (
            "v41_numeric_effort",
            "DeepSeek-V4.1: reasoning_effort 42 (numeric budget) is accepted",
            check_v41_numeric_effort,
        ),
    ]
    judgement: Iterable[tuple[str, str, Callable[[SuiteContext], str]]] = [
        ("follows_exact_reply", "replies exactly as instructed", judge_instruction_following),
        ("answers_arithmetic", "17 + 25 = 42 after thinking", judge_arithmetic),
        ("calls_tool_when_asked", "auto mode: calls the tool the user asked for", judge_auto_tool_call),
        (
            "makes_parallel_calls",
            "asked for two cities in parallel: two calls, right cities",
            judge_parallel_calls,
        ),
        ("selects_the_right_tool", "two tools offered: picks the weather one", judge_tool_selection),
        (
            "copies_special_text_verbatim",
            "the special-character text arrives unchanged",
            judge_special_characters_exact,
        ),
        ("uses_tool_result", "the final answer uses the tool result", judge_tool_result_used),
        ("names_image_colour", "asked the colour of a red image: says red", judge_image_colour),
    ]
    return [Check(n, "protocol", d, f) for n, d, f in protocol] + [
        Check(n, "model-judgement", d, f) for n, d, f in judgement
    ]
