"""Reasoning effort: the preview and official (0731) profiles, checked against deepseek-recipe."""

from __future__ import annotations

from typing import Any

import deepseek_recipe as recipe
import pytest

from deepseek_frontend.errors import FormatError, RequestError
from deepseek_frontend.formats import REASONING_EFFORT_PROFILES, dsv4, normalize_reasoning_effort

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


@pytest.mark.parametrize("word", [None, "none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"])
def test_official_profile_renders_each_user_word_like_deepseek_recipe(word: str | None) -> None:
    # deepseek-recipe knows low/high/xhigh/max and an unset effort; the words it does
    # not know are compared through the value they are documented to mean.
    as_recipe = {"none": "low", "minimal": "low", "medium": "high", "ultra": "max"}.get(word, word)  # type: ignore[arg-type]
    ours = _ours(normalize_reasoning_effort(word, "official"), "official")
    assert ours == _recipe(as_recipe).prompt


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


MAPPING: dict[str, dict[Any, Any]] = {
    "preview": {
        None: None,
        "none": None,
        "minimal": "high",
        "low": "high",
        "medium": "high",
        "high": "high",
        "xhigh": "max",
        "max": "max",
        "ultra": "max",
    },
    "official": {
        None: "high",
        "none": "low",
        "minimal": "low",
        "low": "low",
        "medium": "high",
        "high": "high",
        "xhigh": "high",
        "max": "max",
        "ultra": "max",
    },
}


@pytest.mark.parametrize("profile", REASONING_EFFORT_PROFILES)
def test_user_effort_words_map_to_values_the_profiles_encoder_accepts(profile: str) -> None:
    for word, value in MAPPING[profile].items():
        assert normalize_reasoning_effort(word, profile) == value
        _ours(value, profile)  # accepted by the encoder of that profile
    assert normalize_reasoning_effort("MAX", profile) == MAPPING[profile]["max"]


@pytest.mark.parametrize("word", ["extreme", "", "HIGHEST", 3])
def test_unknown_effort_words_are_a_request_error_naming_the_field(word: Any) -> None:
    with pytest.raises(RequestError, match="reasoning_effort") as info:
        normalize_reasoning_effort(word, "official")
    assert info.value.param == "reasoning_effort"
