"""DeepSeek-V4.1 parity with DeepSeek's reference ``encoding/encoding.py`` (release revision).

The cases in ``dsv41_fixtures/`` were made by ``dsv41_fixtures/generate.py`` from the
reference (see its README). Every ``expected`` prompt renders byte for byte, with one
special ``<｜deepseek_image｜>`` segment per image and the image records in prompt
order; every ``error`` is a FormatError naming the message and field (``quirk:*`` cases
may be refused instead of rendered); Dynamo's published cases render exactly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from deepseek_frontend.errors import FormatError
from deepseek_frontend.formats import dsv41, get_chat_format
from tests.support.tokenizers import v41_tokenizer

FIXTURES = Path(__file__).resolve().parent / "dsv41_fixtures"
WHERE = re.compile(
    r"^((messages|context)\[\d+\](\.[A-Za-z_]+|\[\d+\])*|messages|context|thinking_mode|reasoning_effort): "
)


def _load(name: str) -> list[Any]:
    with (FIXTURES / name).open(encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    return [pytest.param(case, id=case["id"]) for case in cases]


def _is_quirk(case: dict[str, Any]) -> bool:
    return any(tag.startswith("quirk:") for tag in case.get("tags", ()))


def test_the_fixture_set_is_as_large_as_the_issue_asks() -> None:
    encode, parse = _load("dsv41_encode.jsonl"), _load("dsv41_parse.jsonl")
    assert len(encode) >= 300 and len(parse) >= 150
    assert sum("error" in p.values[0] for p in encode) >= 15
    assert sum("error" in p.values[0] for p in parse) >= 30


@pytest.mark.parametrize("case", _load("dsv41_encode.jsonl"))
def test_renders_like_the_reference(case: dict[str, Any]) -> None:
    kwargs = dict(case["kwargs"])
    if "error" in case:
        with pytest.raises(FormatError) as info:
            dsv41.encode_messages(case["messages"], **kwargs)
        assert WHERE.match(str(info.value)), str(info.value)
        return
    images: list[Any] = []
    try:
        segments = dsv41.render_prompt_segments(case["messages"], images=images, **kwargs)
    except FormatError as exc:
        if not _is_quirk(case):
            raise
        assert WHERE.match(str(exc)), str(exc)
        return
    assert "".join(s.text for s in segments) == case["expected"]
    assert images == case["images"]
    # One special image token per image; a typed placeholder stays plain text.
    assert sum(s.special and s.text == dsv41.IMAGE_TOKEN for s in segments) == len(case["images"])
    prompt, media = dsv41.encode_messages(case["messages"], return_multi_modal_data=True, **kwargs)
    assert prompt == case["expected"] and media == {"images": case["images"]}


@pytest.mark.parametrize("case", _load("dsv41_parse.jsonl"))
def test_parses_completions_like_the_reference(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(FormatError, match=r"^completion: "):
            dsv41.parse_message_from_completion_text(case["text"], case["thinking_mode"])
        return
    assert dsv41.parse_message_from_completion_text(case["text"], case["thinking_mode"]) == case["expected"]


def _dynamo() -> list[Any]:
    cases = json.loads((FIXTURES / "dynamo_cases.json").read_text(encoding="utf-8"))
    return [pytest.param(case, id=case["name"]) for case in cases]


@pytest.mark.parametrize("case", _dynamo())
def test_dynamo_published_cases(case: dict[str, Any]) -> None:
    prompt = dsv41.encode_messages(
        case["messages"],
        "thinking" if case["thinking"] else "chat",
        drop_thinking=case["drop_thinking"],
        reasoning_effort=case["effort"],
    )
    assert prompt == case["expected"]


def test_the_registry_serves_v41() -> None:
    assert get_chat_format("deepseek_v41") is dsv41
    assert dsv41.FAMILY == "deepseek_v41"
    assert {"<｜System｜>", "<｜deepseek_image｜>", "｜DSML｜"} <= dsv41.SPECIAL_SPELLINGS


def test_spaced_tag_names_are_plain_text_after_the_dsml_token() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
    ]
    segments = dsv41.render_prompt_segments(messages, "chat")
    text_after_dsml = [
        segments[i + 1].text for i, s in enumerate(segments) if s.special and s.text == "｜DSML｜"
    ]
    assert text_after_dsml[0].startswith(" calls>") and all(not t.startswith("｜") for t in text_after_dsml)


def test_typed_image_parts_are_reported_in_prompt_order() -> None:
    first = dsv41.ImagePart(url="data:image/png;base64,AAAA", width=640, height=480)
    second = dsv41.ImagePart(data=b"\xff\xd8", media_type="image/jpeg", width=10, height=10)
    call = {"id": "a", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call, dict(call, id="b")]},
        # results arrive out of call order: the prompt sorts them, and the records follow the prompt
        {"role": "tool", "tool_call_id": "b", "content": [second]},
        {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "A"}, first]},
    ]
    prompt, media = dsv41.encode_messages(messages, "chat", return_multi_modal_data=True)
    assert prompt.endswith(
        "<｜User｜><tool_result>A\n\n<｜deepseek_image｜></tool_result>\n\n"
        "<tool_result><｜deepseek_image｜></tool_result><｜Assistant｜></think>"
    )
    assert media == {"images": [first, second]}


@pytest.mark.parametrize(
    ("profile", "word", "budget"),
    [
        ("release", "low", 50),
        ("release", "high", 75),
        ("release", "max", 100),
        ("release", None, 75),
        ("prerelease", "low", 25),
        ("prerelease", "medium", 50),
        ("prerelease", "high", 75),
        ("prerelease", "max", 100),
        ("prerelease", 7, 7),
    ],
)
def test_the_effort_table_is_a_checkpoint_setting(profile: str, word: Any, budget: int) -> None:
    prompt = dsv41.encode_messages(
        [{"role": "user", "content": "q"}],
        "thinking",
        reasoning_effort=word,
        reasoning_effort_profile=profile,
    )
    assert f"Reasoning Effort: {budget} (range 1-100" in prompt


def test_release_table_refuses_medium_and_unknown_profiles() -> None:
    with pytest.raises(FormatError, match=r"^reasoning_effort: 'medium'"):
        dsv41.encode_messages([{"role": "user", "content": "q"}], "thinking", reasoning_effort="medium")
    with pytest.raises(FormatError, match=r"^reasoning_effort_profile: "):
        dsv41.encode_messages(
            [{"role": "user", "content": "q"}], "thinking", reasoning_effort_profile="preview"
        )


def _parse_cases(kind: str) -> list[Any]:
    return [p for p in _load("dsv41_parse.jsonl") if kind in p.values[0]]


@pytest.mark.parametrize("case", _parse_cases("expected"))
def test_the_streaming_parser_agrees_with_the_reference(case: dict[str, Any]) -> None:
    from deepseek_frontend.parsing import parse_completion

    from ..parsing.dsml_harness import run

    thinking = case["thinking_mode"] == "thinking"
    expected = case["expected"]
    result = parse_completion(case["text"], family="deepseek_v41", thinking=thinking)
    streamed = run([case["text"]], family="deepseek_v41", thinking=thinking)  # asserts the invariants
    assert result.content == expected["content"]
    assert result.reasoning_content == expected["reasoning_content"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in expected["tool_calls"]]
    assert [c.name for c in result.tool_calls] == [name for name, _ in calls]
    for ours, (_, theirs) in zip(result.tool_calls, calls, strict=True):
        try:
            reference_arguments = json.loads(theirs)
        except ValueError:  # string="false" text that is not JSON: ours is valid JSON instead
            continue
        assert json.loads(ours.arguments) == reference_arguments
    assert streamed.calls() == [(c.name, c.arguments) for c in result.tool_calls]


@pytest.mark.parametrize("case", _parse_cases("error"))
def test_the_streaming_parser_survives_what_the_reference_rejects(case: dict[str, Any]) -> None:
    from ..parsing.dsml_harness import run

    thinking = case["thinking_mode"] == "thinking"
    whole = run([case["text"]], family="deepseek_v41", thinking=thinking)  # no raise, no markup leaked
    by_char = run(list(case["text"]), family="deepseek_v41", thinking=thinking)
    assert by_char.message.content == whole.message.content
    assert by_char.calls() == whole.calls()


def test_segments_tokenize_as_the_reference_prompt_does() -> None:
    """For every golden prompt whose request text spells no token, the injection-safe ids of our
    segments equal the V4.1 tokenizer's ids of the reference prompt string (one id per special)."""
    stand_in = v41_tokenizer()
    checked = 0
    for param in _load("dsv41_encode.jsonl"):
        case = param.values[0]
        if "expected" not in case or _is_quirk(case):
            continue
        segments = dsv41.render_prompt_segments(case["messages"], **case["kwargs"])
        if any(not s.special and stand_in.contains_token_spelling(s.text) for s in segments):
            continue  # request text spelling a token: ours is text, the raw string's is the token
        assert stand_in.encode_segments(segments) == stand_in.encode_raw(case["expected"]), case["id"]
        checked += 1
    assert checked >= 100  # the rest spell tokens in request text on purpose
