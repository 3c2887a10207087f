"""The streaming contract's scenarios (docs/spec/streaming-contract.md), each replayed under every chunking.

Every scenario runs under ``all`` (one chunk), ``char`` (one character per chunk), ``tok`` (the real
tokenizer's pieces), ``mtp`` (2-6 tokens per chunk, three seeds) and ``split2`` (every 2-way split) -- that
is scenario 41 -- plus the scenario's own chunking when it names one. Each run must give exactly the
expected result (which is I2: every chunking equals the one-shot parse) and pass the invariant checker
(I1, I3, I4). The ``CASE.N`` tags in each entry's comment are the contract's taxonomy; docs/parsing.md
lists which entry covers which case.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from deepseek_frontend.parsing import ContentDelta, StreamParser, ToolCallArgumentsDelta

from .dsml_harness import (
    CHUNKINGS,
    EOS,
    Run,
    S,
    block,
    canonical_call,
    chunkings,
    invoke,
    param,
    run,
)

WEATHER = '{"city": "Paris", "days": 3}'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    },
]


@dataclass(frozen=True)
class Scenario:
    id: str
    text: str
    reasoning: str = ""
    content: str = ""
    calls: tuple[tuple[str, str], ...] = ()
    finish: str = "stop"
    thinking: bool = False
    family: str = "deepseek_v4"
    engine_finish: str = "stop"
    #: an extra chunking the scenario names explicitly
    chunks: tuple[str, ...] | None = None
    options: dict = field(default_factory=dict)
    #: skip the O(n) split2 replay for long texts (still covered by all/char/tok/mtp)
    split2: bool = True


def _types_value() -> str:
    return (
        param("n", "3", "false")
        + param("x", "2.5", "false")
        + param("b", "true", "false")
        + param("z", "null", "false")
        + param("a", "[1,2]", "false")
        + param("o", '{"k":{"j":[1]}}', "false")
    )


SCENARIOS: list[Scenario] = [
    # --- reasoning
    # CASE.10
    Scenario(
        "s01-think-close-splits-reasoning-and-content",
        "Plan.</think>Answer",
        reasoning="Plan.",
        content="Answer",
        thinking=True,
    ),
    # CASE.8
    Scenario(
        "s02-lone-lt-before-think-close-is-held",
        "abc</think>xyz",
        thinking=True,
        reasoning="abc",
        content="xyz",
        chunks=("abc<", "/think>xyz"),
    ),
    # CASE.8
    Scenario(
        "s03-think-close-split-inside-the-tag",
        "abc</think>xyz",
        thinking=True,
        reasoning="abc",
        content="xyz",
        chunks=("abc</th", "ink>xyz"),
    ),
    # CASE.3, CASE.8
    Scenario(
        "s04-held-lt-released-once-it-is-text",
        "x < y</think>ok",
        thinking=True,
        reasoning="x < y",
        content="ok",
        chunks=("x <", " y</think>ok"),
    ),
    # CASE.3
    Scenario("s05-chat-mode-plain-content", "Hello", content="Hello"),
    # CASE.10
    Scenario("s06-chat-mode-model-opens-think-itself", "<think>R</think>A", reasoning="R", content="A"),
    # CASE.3, CASE.16
    Scenario("s07-stray-think-close-in-content-is-dropped", "A</think>B", content="AB"),
    # CASE.10, CASE.12
    Scenario(
        "s08-reasoning-cut-at-max-tokens",
        "Step by step, " * 25,
        thinking=True,
        reasoning="Step by step, " * 25,
        engine_finish="length",
        finish="length",
    ),
    # CASE.10, CASE.5
    Scenario(
        "s09-unclosed-reasoning-at-eos-stays-reasoning",
        "Good morning!" + EOS,
        thinking=True,
        reasoning="Good morning!",
    ),
    # CASE.9
    Scenario(
        "s10-block-opener-ends-reasoning",
        "need a tool" + canonical_call(),
        thinking=True,
        reasoning="need a tool",
        calls=(("get_weather", WEATHER),),
        finish="tool_calls",
    ),
    # CASE.9
    Scenario(
        "s10b-bare-invoke-ends-reasoning",
        "need a tool\n\n" + invoke("get_time") + EOS,
        thinking=True,
        reasoning="need a tool",
        calls=(("get_time", "{}"),),
        finish="tool_calls",
    ),
    # CASE.3, CASE.23
    Scenario(
        "s11-incomplete-dsml-in-reasoning-is-text",
        "literal<｜DSML｜not_a_tool</think>ok",
        thinking=True,
        reasoning="literal<｜DSML｜not_a_tool",
        content="ok",
    ),
    # CASE.9, CASE.6
    Scenario(
        "s12-reasoning-and-empty-call-in-one-delta",
        "R</think>\n\n" + block(invoke("f")),
        thinking=True,
        reasoning="R",
        calls=(("f", "{}"),),
        finish="tool_calls",
    ),
    # --- tool calls
    # CASE.1
    Scenario("s13-canonical-call", canonical_call(), calls=(("get_weather", WEATHER),), finish="tool_calls"),
    # CASE.1
    Scenario(
        "s13-canonical-call-v32",
        canonical_call("deepseek_v32"),
        family="deepseek_v32",
        calls=(("get_weather", WEATHER),),
        finish="tool_calls",
    ),
    # CASE.1, CASE.23
    Scenario(
        "s13-canonical-call-v41",
        canonical_call("deepseek_v41"),
        family="deepseek_v41",
        calls=(("get_weather", WEATHER),),
        finish="tool_calls",
    ),
    # CASE.13, CASE.8
    Scenario(
        "s15-exactly-one-blank-line-before-block-removed",
        "Let me check." + canonical_call(),
        content="Let me check.",
        calls=(("get_weather", WEATHER),),
        finish="tool_calls",
        chunks=(
            "Let me check.\n",
            "\n",
            S,
            "tool",
            "_c",
            "alls",
            ">\n",
            canonical_call()[len("\n\n" + S + "tool_calls>\n") :],
        ),
    ),
    # CASE.13, CASE.22
    Scenario(
        "s15b-three-newlines-keep-one",
        "Hi\n\n\n" + block(invoke("f")) + EOS,
        content="Hi\n",
        calls=(("f", "{}"),),
        finish="tool_calls",
    ),
    # CASE.3, CASE.14
    Scenario("s16-held-newlines-flushed-at-eos", "Line1\n\n" + EOS, content="Line1\n\n"),
    # CASE.2, CASE.15
    Scenario(
        "s17-two-invokes-of-one-tool",
        "\n\n"
        + block(
            invoke("get_weather", param("city", "Paris")) + invoke("get_weather", param("city", "London"))
        )
        + EOS,
        calls=(("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "London"}')),
        finish="tool_calls",
    ),
    # CASE.2, CASE.8
    Scenario(
        "s18-two-invokes-in-one-mtp-delta",
        "\n\n"
        + block(
            invoke("get_weather", param("city", "Paris")) + invoke("get_weather", param("city", "London"))
        )
        + EOS,
        calls=(("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "London"}')),
        finish="tool_calls",
        chunks=(
            "\n\n" + block("")[: -len("</｜DSML｜tool_calls>")],
            invoke("get_weather", param("city", "Paris")) + invoke("get_weather", param("city", "London")),
            "</｜DSML｜tool_calls>" + EOS,
        ),
    ),
    # CASE.6
    Scenario(
        "s19-empty-invoke",
        "\n\n" + block(invoke("get_time")) + EOS,
        calls=(("get_time", "{}"),),
        finish="tool_calls",
    ),
    # CASE.6
    Scenario(
        "s19b-self-closing-invoke",
        "\n\n" + block(f'{S}invoke name="get_time"/>\n') + EOS,
        calls=(("get_time", "{}"),),
        finish="tool_calls",
    ),
    # CASE.7
    Scenario(
        "s20-string-false-values-keep-json-types",
        "\n\n" + block(invoke("f", _types_value())) + EOS,
        calls=(("f", '{"n": 3, "x": 2.5, "b": true, "z": null, "a": [1, 2], "o": {"k": {"j": [1]}}}'),),
        finish="tool_calls",
    ),
    # CASE.4
    Scenario(
        "s21-invalid-json-values-become-strings",
        "\n\n"
        + block(
            invoke(
                "f",
                param("mode", "quickly", "false")
                + param("p", "{not json", "false")
                + param("q", "NaN", "false"),
            )
        )
        + EOS,
        calls=(("f", '{"mode": "quickly", "p": "{not json", "q": "NaN"}'),),
        finish="tool_calls",
    ),
    # CASE.22
    Scenario(
        "s22-string-values-are-verbatim",
        "\n\n" + block(invoke("f", param("s", "  two\n  lines\n"))) + EOS,
        calls=(("f", '{"s": "  two\\n  lines\\n"}'),),
        finish="tool_calls",
    ),
    # CASE.7
    Scenario(
        "s23-string-values-are-escaped",
        "\n\n" + block(invoke("f", param("s", 'q"b\\t\té😀\u2028'))) + EOS,
        calls=(("f", json.dumps({"s": 'q"b\\t\té😀\u2028'}, ensure_ascii=False)),),
        finish="tool_calls",
    ),
    # CASE.7, CASE.16
    Scenario(
        "s24-shell-command-with-angle-brackets",
        "\n\n" + block(invoke("bash", param("command", "ls 2>&1 | grep '<a>' </b>"))) + EOS,
        calls=(("bash", json.dumps({"command": "ls 2>&1 | grep '<a>' </b>"})),),
        finish="tool_calls",
    ),
    # CASE.8
    Scenario(
        "s25-long-string-value",
        "\n\n" + block(invoke("write", param("data", "0123456789" * 1000))) + EOS,
        calls=(("write", json.dumps({"data": "0123456789" * 1000})),),
        finish="tool_calls",
        split2=False,
    ),
    # CASE.7
    Scenario(
        "s26-no-string-attribute-json-if-it-parses",
        "\n\n" + block(invoke("f", param("x", "5", None) + param("y", "Alice", None))) + EOS,
        calls=(("f", '{"x": 5, "y": "Alice"}'),),
        finish="tool_calls",
    ),
    # CASE.4
    Scenario(
        "s27-new-parameter-closes-an-unclosed-one",
        "\n\n" + block(invoke("f", f'{S}parameter name="a" string="true">1\n' + param("b", "2"))) + EOS,
        calls=(("f", '{"a": "1", "b": "2"}'),),
        finish="tool_calls",
    ),
    # CASE.4
    Scenario(
        "s28-new-invoke-closes-an-unclosed-one",
        "\n\n" + block(f'{S}invoke name="a">\n' + param("x", "1") + invoke("b", param("y", "2"))) + EOS,
        calls=(("a", '{"x": "1"}'), ("b", '{"y": "2"}')),
        finish="tool_calls",
    ),
    # CASE.5
    Scenario(
        "s29-block-closer-missing-at-eos",
        "\n\n" + block(invoke("a", param("x", "1")) + invoke("b"))[: -len("</｜DSML｜tool_calls>")] + EOS,
        calls=(("a", '{"x": "1"}'), ("b", "{}")),
        finish="tool_calls",
    ),
    # CASE.5, CASE.12
    Scenario(
        "s30-cut-inside-a-value-at-max-tokens",
        f'\n\n{S}tool_calls>\n{S}invoke name="get_weather">\n{S}parameter name="city" string="true">Par',
        calls=(("get_weather", '{"city": "Par"}'),),
        engine_finish="length",
        finish="length",
    ),
    # CASE.5
    Scenario(
        "s30b-name-never-completed-is-not-a-call",
        f'Hi\n\n{S}tool_calls>\n{S}invoke name="get_wea',
        content="Hi",
        engine_finish="length",
        finish="length",
    ),
    # CASE.5
    Scenario(
        "s31c-cut-inside-the-block-opener-by-length",
        f"Sure.\n\n{S}tool_c",
        content="Sure.",
        engine_finish="length",
        finish="length",
    ),
    # CASE.5
    Scenario(
        "s30c-cut-inside-the-next-parameter-opener-by-length",
        f'\n\n{S}tool_calls>\n{S}invoke name="f">\n{S}parameter name="a" string="true">1\n{S}parameter na',
        calls=(("f", '{"a": "1"}'),),
        engine_finish="length",
        finish="length",
    ),
    # CASE.5
    Scenario(
        "s31-cut-inside-an-invoke-opener-by-eos", f"Sure.\n\n{S}tool_calls>\n{S}inv" + EOS, content="Sure."
    ),
    # CASE.5
    Scenario(
        "s31b-cut-inside-an-invoke-opener-by-length",
        f"Sure.\n\n{S}tool_calls>\n{S}inv",
        content="Sure.",
        engine_finish="length",
        finish="length",
    ),
    # CASE.4, CASE.13
    Scenario(
        "s32-bare-invoke-and-orphan-block-closer",
        invoke("bash", param("cmd", "pwd")) + "</｜DSML｜tool_calls>" + EOS,
        calls=(("bash", '{"cmd": "pwd"}'),),
        finish="tool_calls",
    ),
    # CASE.3, CASE.5
    Scenario(
        "s33-unclosed-bare-invoke-in-prose-is-no-call",
        f'I will call {S}invoke name="x">\n' + f'{S}parameter name="a" string="true">v' + EOS,
        content="I will call ",
    ),
    # CASE.13
    Scenario(
        "s34-text-after-a-closed-block-is-dropped",
        canonical_call(eos=False) + "\n\nDone." + EOS,
        calls=(("get_weather", WEATHER),),
        finish="tool_calls",
    ),
    # CASE.11
    Scenario(
        "s35-tool-choice-none-swallows-markup",
        "Checking." + canonical_call(),
        content="Checking.",
        options={"tools": TOOLS, "tool_choice": "none"},
    ),
    # CASE.11, CASE.21
    Scenario(
        "s36-undeclared-tool-dropped",
        "\n\n" + block(invoke("rm_rf", param("path", "/")) + invoke("get_time")) + EOS,
        calls=(("get_time", "{}"),),
        finish="tool_calls",
        options={"tools": TOOLS},
    ),
    # CASE.11, CASE.21
    Scenario(
        "s36b-undeclared-tool-kept-with-the-option",
        "\n\n" + block(invoke("rm_rf", param("path", "/")) + invoke("get_time")) + EOS,
        calls=(("rm_rf", '{"path": "/"}'), ("get_time", "{}")),
        finish="tool_calls",
        options={"tools": TOOLS, "keep_undeclared_tools": True},
    ),
    # CASE.23
    Scenario(
        "s37-v4-accepts-the-v32-block-name",
        canonical_call("deepseek_v32"),
        calls=(("get_weather", WEATHER),),
        finish="tool_calls",
    ),
    # CASE.23
    Scenario(
        "s37b-v4-accepts-toolcalls",
        "\n\n" + f"{S}toolcalls>\n" + invoke("get_time") + f"</｜DSML｜toolcalls>{EOS}",
        calls=(("get_time", "{}"),),
        finish="tool_calls",
    ),
    # CASE.23
    Scenario(
        "s37c-v4-accepts-v41-spacing",
        canonical_call("deepseek_v41"),
        calls=(("get_weather", WEATHER),),
        finish="tool_calls",
    ),
    # CASE.23
    Scenario(
        "s37d-v41-accepts-v4-spelling",
        canonical_call("deepseek_v4"),
        family="deepseek_v41",
        calls=(("get_weather", WEATHER),),
        finish="tool_calls",
    ),
    # CASE.5
    Scenario(
        "s38-eos-inside-a-value",
        f'\n\n{S}tool_calls>\n{S}invoke name="get_weather">\n'
        f'{S}parameter name="city" string="true">Paris' + EOS,
        calls=(("get_weather", '{"city": "Paris"}'),),
    ),
    # CASE.8
    Scenario(
        "s39-opener-and-value-in-one-delta",
        "\n\n" + block(invoke("get_weather", param("city", "Paris"))) + EOS,
        calls=(("get_weather", '{"city": "Paris"}'),),
        finish="tool_calls",
        chunks=(
            f'\n\n{S}tool_calls>\n{S}invoke name="get_weather">\n{S}parameter name="city" string="true">Par',
            f"is</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>{EOS}",
        ),
    ),
    # CASE.7, CASE.16
    Scenario(
        "s40-wrapped-arguments-object-is-unwrapped",
        "\n\n" + block(invoke("get_weather", param("arguments", '{"city":"Paris"}', "false"))) + EOS,
        calls=(("get_weather", '{"city": "Paris"}'),),
        finish="tool_calls",
        options={"tools": TOOLS},
    ),
    # --- beyond the numbered list
    # CASE.24
    Scenario("x01-empty-block-adds-nothing", "hi\n\n" + block("") + EOS, content="hi"),
    # CASE.5, CASE.16
    Scenario("x02-text-after-eos-is-ignored", "answer" + EOS + "more", content="answer"),
    # CASE.3, CASE.23
    Scenario(
        "x03-ascii-pipes-are-not-markup", "a <|DSML|tool_calls> b" + EOS, content="a <|DSML|tool_calls> b"
    ),
    # CASE.22
    Scenario(
        "x04-whitespace-before-invoke-name",
        "\n\n" + block(f'{S}invoke \t name="get_time">\n</｜DSML｜invoke>\n') + EOS,
        calls=(("get_time", "{}"),),
        finish="tool_calls",
    ),
    # CASE.21
    Scenario(
        "x05-quote-inside-names-kept-whole",
        "\n\n"
        + block(
            f'{S}invoke name="we"ird">\n{S}parameter name="a"b" string="true">v</｜DSML｜parameter>\n'
            "</｜DSML｜invoke>\n"
        )
        + EOS,
        calls=(('we"ird', '{"a\\"b": "v"}'),),
        finish="tool_calls",
    ),
    # CASE.4
    Scenario(
        "x06-repeated-parameter-keeps-the-first",
        "\n\n" + block(invoke("f", param("a", "1") + param("a", "2"))) + EOS,
        calls=(("f", '{"a": "1"}'),),
        finish="tool_calls",
    ),
    # CASE.7
    Scenario(
        "x07-think-tags-inside-values-are-data",
        "\n\n" + block(invoke("f", param("s", "<think>x</think>"))) + EOS,
        calls=(("f", '{"s": "<think>x</think>"}'),),
        finish="tool_calls",
    ),
    # CASE.3
    Scenario(
        "x08-invoke-without-name-attribute-in-prose-is-text",
        "see <｜DSML｜invoke> here" + EOS,
        content="see <｜DSML｜invoke> here",
    ),
    # CASE.5, CASE.12
    Scenario(
        "x09-unclosed-invoke-in-block-at-stop-is-kept-but-not-complete",
        f'\n\n{S}tool_calls>\n{S}invoke name="get_weather">\n',
        calls=(("get_weather", "{}"),),
    ),
]

_BY_ID = {s.id: s for s in SCENARIOS}
assert len(_BY_ID) == len(SCENARIOS), "scenario ids must be unique"


def _v41_spelling(text: str) -> str:
    """DeepSeek-V4.1's spaced DSML for V4's (`` calls``, `` invoke``, `` parameter`` after the token)."""
    return (
        text.replace("｜DSML｜tool_calls", "｜DSML｜ calls")
        .replace("｜DSML｜invoke", "｜DSML｜ invoke")
        .replace("｜DSML｜parameter", "｜DSML｜ parameter")
    )


def _as_v41(scenario: Scenario) -> Scenario:
    """A V4 scenario with V4.1's spelling everywhere (text, expected texts, named chunks).

    Named chunks that split a tag name (``tool`` / ``_c`` / ``alls``) cannot be respelled piecewise;
    such a scenario keeps only the generic chunkings (``char`` and ``split2`` cover every boundary).
    """
    chunks = None if scenario.chunks is None else tuple(_v41_spelling(c) for c in scenario.chunks)
    if chunks is not None and "".join(chunks) != _v41_spelling(scenario.text):
        chunks = None
    return Scenario(
        id=scenario.id + "-v41",
        text=_v41_spelling(scenario.text),
        reasoning=_v41_spelling(scenario.reasoning),
        content=_v41_spelling(scenario.content),
        calls=tuple((name, _v41_spelling(arguments)) for name, arguments in scenario.calls),
        finish=scenario.finish,
        thinking=scenario.thinking,
        family="deepseek_v41",
        engine_finish=scenario.engine_finish,
        chunks=chunks,
        options=scenario.options,
        split2=scenario.split2,
    )


#: every V4 scenario again in V4.1's spelling: the contract holds for the spaced tags too
SCENARIOS_V41: list[Scenario] = [_as_v41(s) for s in SCENARIOS if s.family == "deepseek_v4"]


def _check(scenario: Scenario, result: Run) -> None:
    message = result.message
    assert message.reasoning_content == scenario.reasoning
    assert message.content == scenario.content
    assert result.calls() == list(scenario.calls)
    assert message.finish_reason == scenario.finish


def _replay(scenario: Scenario, chunks: list[str]) -> Run:
    return run(
        chunks,
        family=scenario.family,
        thinking=scenario.thinking,
        finish_reason=scenario.engine_finish,
        **scenario.options,
    )


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("scenario", SCENARIOS + SCENARIOS_V41, ids=lambda s: s.id)
def test_scenario_gives_the_contract_result_under_every_chunking(scenario: Scenario, chunking: str) -> None:
    if chunking == "split2" and not scenario.split2:
        # s25 is 10 KB: every 2-way split would be 10^4 full parses; char/tok/mtp already chunk it finely.
        chunks_list = [[scenario.text[:i], scenario.text[i:]] for i in range(1, len(scenario.text), 997)]
    else:
        chunks_list = chunkings(scenario.text, chunking)
    for chunks in chunks_list:
        _check(scenario, _replay(scenario, chunks))


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS + SCENARIOS_V41 if s.chunks], ids=lambda s: s.id)
def test_scenario_gives_the_contract_result_under_its_named_chunking(scenario: Scenario) -> None:
    assert "".join(scenario.chunks or ()) == scenario.text
    _check(scenario, _replay(scenario, list(scenario.chunks or ())))


def test_canonical_call_streams_arguments_in_several_deltas_under_char_chunking() -> None:
    # CASE.1, CASE.8 (scenario 13): arguments must not arrive in one final chunk
    result = run(list(canonical_call()))
    assert len(result.deltas(ToolCallArgumentsDelta)) >= 3


def test_canonical_call_under_tok_chunking_leaks_neither_blank_line_nor_dsml() -> None:
    # CASE.8 (scenario 14): the blank line before the block is format, not content
    result = run(chunkings(canonical_call(), "tok")[0])
    assert result.deltas(ContentDelta) == []
    assert result.calls() == [("get_weather", WEATHER)]


def test_long_string_value_streams_before_its_closer_arrives() -> None:
    # CASE.8, CASE.16 (scenario 25): one 10 KB value fed one character per feed
    value = "0123456789" * 1000
    head = f'\n\n{S}tool_calls>\n{S}invoke name="write">\n{S}parameter name="data" string="true">'
    parser = StreamParser("deepseek_v4", thinking=False)
    streamed: list[str] = []
    per_feed: list[int] = []
    for ch in head + value:
        events = parser.feed(ch)
        per_feed.append(len(events))
        streamed += [e.text for e in events if isinstance(e, ToolCallArgumentsDelta)]
    # everything but nothing-held-back: the whole value is out before "</｜DSML｜parameter>" is fed
    assert "".join(streamed) == '{"data": "' + value
    # constant work per delta: never more than a couple of events for one character
    assert max(per_feed) <= 3


def test_truncated_call_at_length_is_closed_as_valid_json_and_finish_is_length() -> None:
    # CASE.5, CASE.12 (scenario 30) -- also pinned in the table; here the finish event itself
    text = _BY_ID["s30-cut-inside-a-value-at-max-tokens"].text
    result = run([text], finish_reason="length")
    assert result.events[-1].reason == "length"  # type: ignore[union-attr]
    assert json.loads(result.message.tool_calls[0].arguments) == {"city": "Par"}
