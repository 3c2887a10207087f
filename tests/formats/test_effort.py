"""Reasoning effort: the preview and official (0731) profiles, checked against deepseek-recipe."""

from __future__ import annotations

from typing import Any

import deepseek_recipe as recipe
import pytest

from deepseek_frontend.errors import FormatError, RequestError
from deepseek_frontend.formats import (
    EFFORT_WORDS,
    REASONING_EFFORT_PROFILES,
    dsv4,
    normalize_reasoning_effort,
)

BOS = "<｜begin▁of▁sentence｜>"
CONVERSATION = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]


def _prefix(prompt: str) -> str:
    """Text between BOS and the system prompt: where the effort text goes."""
    assert prompt.startswith(BOS)
    return prompt[len(BOS) : prompt.index("S<｜User｜>")]


def _ours(effort: str | None, profile: str, thinking_mode: str = "thinking") -> str:
    return dsv4.encode_messages(
        CONVERSATION, thinking_mode, reasoning_effort=effort, reasoning_effort_profile=profile
    )


def _recipe(effort: str | None, thinking: bool = True) -> recipe.RenderedPrompt:
    conversation = recipe.Conversation(
        [recipe.SystemMessage("S"), recipe.UserMessage("hi")], thinking_mode=thinking, reasoning_effort=effort
    )
    return recipe.DeepseekV4Encoding().render_conversation(conversation)


@pytest.mark.parametrize("effort", ["low", "high", "max"])
def test_official_profile_writes_deepseek_recipes_effort_text(effort: str) -> None:
    assert _ours(effort, "official") == _recipe(effort).prompt


def _recipe_for_word(word: str | None) -> tuple[str, recipe.RenderedPrompt]:
    """deepseek-recipe's own reading of ``word`` in a Chat Completions request for a V4
    checkpoint: the thinking mode it picks and the prompt it renders."""
    body: dict[str, Any] = {"model": "DeepSeek-V4-Pro", "messages": CONVERSATION}
    if word is not None:
        body["reasoning_effort"] = word
    conversation = recipe.ChatCompletionRequest(body).convert(recipe.ConversionOptions()).conversation
    mode = "thinking" if conversation.thinking_mode else "chat"
    return mode, recipe.DeepseekV4Encoding().render_conversation(conversation)


@pytest.mark.parametrize("word", [None, *EFFORT_WORDS])
def test_official_profile_renders_each_user_word_like_deepseek_recipe(word: str | None) -> None:
    # The oracle reads the word itself (deepseek-recipe's request conversion), so no
    # expected value is restated here. Whether a word switches thinking off ("none"
    # does there) is the API layer's call; the mode is taken from the oracle.
    mode, rendered = _recipe_for_word(word)
    ours = _ours(normalize_reasoning_effort(word, "official"), "official", thinking_mode=mode)
    assert ours == rendered.prompt


def test_official_effort_texts_are_plain_text_in_deepseek_recipe_too() -> None:
    rendered = _recipe("max")
    segments = dsv4.render_prompt_segments(
        CONVERSATION, "thinking", reasoning_effort="max", reasoning_effort_profile="official"
    )
    ranges, at = [], 0
    for segment in segments:
        if segment.special:
            ranges.append((at, at + len(segment.text)))
        at += len(segment.text)
    assert ranges == rendered.special_ranges


def test_preview_profile_writes_only_for_max_and_it_is_the_official_high_text() -> None:
    assert _prefix(_ours(None, "preview")) == ""
    assert _prefix(_ours("high", "preview")) == ""
    assert _prefix(_ours("max", "preview")) == _prefix(_ours("high", "official"))
    assert _prefix(_ours("max", "preview")).startswith("Reasoning Effort: Absolute maximum")
    assert _prefix(_ours("max", "official")).startswith("Reasoning Effort: Beyond maximum \u2014")


@pytest.mark.parametrize("profile", REASONING_EFFORT_PROFILES)
def test_effort_text_is_written_only_in_thinking_mode(profile: str) -> None:
    assert _prefix(_ours("max", profile, thinking_mode="chat")) == ""


def test_effort_text_precedes_only_the_first_message_of_the_conversation() -> None:
    context = [
        {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
    ]
    continued = dsv4.encode_messages(
        [{"role": "user", "content": "now"}], "thinking", context=context, reasoning_effort="max"
    )
    assert "Reasoning Effort" not in continued


@pytest.mark.parametrize(
    ("profile", "effort"), [("preview", "low"), ("preview", "xhigh"), ("official", "xhigh")]
)
def test_an_effort_the_profile_does_not_know_is_a_format_error(profile: str, effort: str) -> None:
    with pytest.raises(FormatError, match=r"^reasoning_effort: "):
        _ours(effort, profile)


def test_an_unknown_profile_is_refused() -> None:
    with pytest.raises(FormatError, match=r"^reasoning_effort_profile: "):
        _ours(None, "beta")
    with pytest.raises(ValueError, match="profile"):
        normalize_reasoning_effort("high", "beta")


STRENGTH = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")
"""The effort words from weakest to strongest (OpenAI's, then max and ultra)."""


def _rank(word: str) -> int:
    return STRENGTH.index(word)


@pytest.mark.parametrize("word", [None, *EFFORT_WORDS])
def test_preview_profile_maps_words_as_deepseeks_api_does_for_preview_checkpoints(word: str | None) -> None:
    # Documented facts (docs/formats.md, "Reasoning effort"): the preview encoder knows
    # only high and max; unset and "none" keep the encoder's default (None, the lowest),
    # words from minimal to high go to high (DeepSeek's API maps low and medium to
    # high), xhigh and above to max (the API maps xhigh to max).
    if word is None or word == "none":
        assert normalize_reasoning_effort(word, "preview") is None
    else:
        expected = "max" if _rank(word) >= _rank("xhigh") else "high"
        assert normalize_reasoning_effort(word, "preview") == expected


@pytest.mark.parametrize("profile", REASONING_EFFORT_PROFILES)
def test_none_asks_for_the_lowest_effort_the_profile_renders(profile: str) -> None:
    # In thinking mode (if the API layer keeps it on), "none" writes no effort text.
    assert _prefix(_ours(normalize_reasoning_effort("none", profile), profile)) == ""


@pytest.mark.parametrize("profile", REASONING_EFFORT_PROFILES)
def test_every_user_word_maps_to_an_effort_the_profiles_encoder_accepts(profile: str) -> None:
    for word in (None, *EFFORT_WORDS):
        _ours(normalize_reasoning_effort(word, profile), profile)  # raises FormatError otherwise


@pytest.mark.parametrize("profile", REASONING_EFFORT_PROFILES)
@pytest.mark.parametrize("word", EFFORT_WORDS)
def test_effort_words_are_case_insensitive(profile: str, word: str) -> None:
    expected = normalize_reasoning_effort(word, profile)
    assert normalize_reasoning_effort(word.upper(), profile) == expected
    assert normalize_reasoning_effort(word.capitalize(), profile) == expected


@pytest.mark.parametrize("word", ["extreme", "", "HIGHEST", 0, 101, True, 2.5, [1]])
@pytest.mark.parametrize("profile", ["official", "release"])
def test_unknown_effort_words_are_a_request_error_naming_the_field(word: Any, profile: str) -> None:
    with pytest.raises(RequestError, match="reasoning_effort") as info:
        normalize_reasoning_effort(word, profile)
    assert info.value.param == "reasoning_effort"


@pytest.mark.parametrize(
    ("effort", "profile", "expected"),
    [
        # V4.1: budgets pass through (digit strings too); words it lacks map to its own words
        (42, "release", 42),
        ("7", "prerelease", 7),
        (None, "release", None),
        ("minimal", "release", "low"),
        ("medium", "release", "high"),
        ("medium", "prerelease", "medium"),
        ("xhigh", "release", "high"),
        ("none", "release", "low"),
        # V4: a budget reads as the word at or above it, then the V4 table
        (50, "official", "low"),
        (51, "official", "high"),
        (76, "official", "max"),
        (30, "preview", "high"),
        (100, "preview", "max"),
    ],
)
def test_numeric_budgets_and_v41_words(effort: Any, profile: str, expected: Any) -> None:
    assert normalize_reasoning_effort(effort, profile) == expected


def test_thinking_token_budgets_map_logarithmically_onto_1_to_100() -> None:
    from deepseek_frontend.formats.effort import budget_from_thinking_tokens

    sizes = (1, 256, 1024, 2048, 4000, 10000, 16384, 31999, 32768, 10**6)
    assert [budget_from_thinking_tokens(n) for n in sizes] == [1, 1, 25, 40, 54, 74, 85, 99, 100, 100]
