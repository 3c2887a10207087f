"""Property-based tests: generated reasoning, content and calls rendered in DSML, parsed under any chunking.

Properties (CASE.8, CASE.2, CASE.7, CASE.9, CASE.13):
* the one-chunk parse gives back exactly what was rendered (arguments byte-equal to
  ``json.dumps(..., ensure_ascii=False)`` of the generated object);
* any chunking -- arbitrary cut points, including inside tags and characters' neighbours -- gives the same
  result as one chunk (I2);
* no delta contains markup, argument deltas only append and concatenate to valid JSON equal to the final
  arguments (I1, I3, I4: asserted by ``dsml_harness.run`` on every run).

Generated text avoids only what would *be* markup (``<｜``, ``</｜``, think tags), so it is full of
near-misses: lone ``<``, ``｜``, ``</``, ``>``, newlines right before tags.
"""

from __future__ import annotations

import json
import re
from itertools import pairwise

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from .dsml_harness import EOS, get_grammar, markup_in, run

_FORBIDDEN = ("<｜", "</｜", "<think>", "</think>")
_ALPHABET = st.sampled_from([*'ab xyz<>/\n"\\｜{}é😀\t:=', "think", "DSML", "</th", "<thi", "\n\n"])


# Tags the text states drop (stray think tags and closers).
_DROPPED_IN_TEXT = re.compile(
    r"</?think>|</｜DSML｜ ?(?:tool_calls|function_calls|toolcalls|calls|invoke|parameter)>"
)


def _splices_markup(text: str) -> bool:
    """Removing a stray tag would join its neighbours into markup (``<｜DSML｜<think>tool_calls>``).

    A documented limitation (docs/parsing.md): the joined text is never structural for the parser, but the
    accumulated content would show it, so such inputs are left out of the leak property.
    """
    return len(markup_in(_DROPPED_IN_TEXT.sub("", text))) > len(markup_in(_DROPPED_IN_TEXT.sub("\x00", text)))


def _clean(text: str) -> bool:
    return not any(f in text for f in _FORBIDDEN)


texts = st.lists(_ALPHABET, max_size=12).map("".join).filter(_clean)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(names, children, max_size=3),
    max_leaves=6,
)
# (value, string attribute): verbatim strings, or JSON values written with string="false"
params = st.one_of(
    st.tuples(texts, st.just("true")),
    st.tuples(json_values.map(lambda v: json.dumps(v, ensure_ascii=False)), st.just("false")),
)
calls = st.lists(st.tuples(names, st.dictionaries(names, params, max_size=3)), max_size=3)


def _render(family: str, thinking: bool, reasoning: str, content: str, call_list: list) -> str:
    g = get_grammar(family)
    out = [reasoning + g.think_close if thinking else "", content]
    if call_list:
        out.append(f"\n\n{g.block_open}\n")
        for name, ps in call_list:
            out.append(f'{g.invoke_open} name="{name}">\n')
            for key, (value, string) in ps.items():
                out.append(f'{g.parameter_open} name="{key}" string="{string}">{value}{g.parameter_close}\n')
            out.append(f"{g.invoke_close}\n")
        out.append(g.block_close)
    out.append(EOS)
    return "".join(out)


def _expected_arguments(ps: dict) -> str:
    obj = {key: (value if string == "true" else json.loads(value)) for key, (value, string) in ps.items()}
    return json.dumps(obj, ensure_ascii=False)


@st.composite
def responses(draw: st.DrawFn) -> tuple[str, bool, str, str, list]:
    family = draw(st.sampled_from(["deepseek_v4", "deepseek_v32", "deepseek_v41"]))
    thinking = draw(st.booleans())
    reasoning = draw(texts) if thinking else ""
    content = draw(texts)
    return family, thinking, reasoning, content, draw(calls)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(response=responses(), cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=40))
def test_any_chunking_of_a_rendered_response_parses_back_to_what_was_rendered(
    response: tuple[str, bool, str, str, list], cuts: list[int]
) -> None:
    # CASE.2, CASE.7, CASE.8, CASE.9, CASE.13
    family, thinking, reasoning, content, call_list = response
    text = _render(family, thinking, reasoning, content, call_list)

    whole = run([text], family=family, thinking=thinking)
    assert whole.message.reasoning_content == reasoning
    assert whole.message.content == content
    assert whole.calls() == [(name, _expected_arguments(ps)) for name, ps in call_list]
    assert whole.message.finish_reason == ("tool_calls" if call_list else "stop")

    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    chunks = [text[a:b] for a, b in pairwise(points)]
    chunked = run(chunks, family=family, thinking=thinking)
    assert chunked.message.reasoning_content == whole.message.reasoning_content
    assert chunked.message.content == whole.message.content
    assert chunked.calls() == whole.calls()
    assert chunked.message.finish_reason == whole.message.finish_reason


_SOUP = st.sampled_from(
    [
        "<｜DSML｜",
        "</｜DSML｜",
        "invoke",
        " invoke",
        ' name="',
        '">',
        "/>",
        "parameter",
        ' string="false">',
        "tool_calls>",
        " calls>",
        " parameter",
        EOS,
        "<think>",
        "</think>",
        "[1,",
        "}",
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    text=st.lists(_ALPHABET | _SOUP, max_size=40).map("".join),
    thinking=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=500), max_size=20),
    family=st.sampled_from(["deepseek_v4", "deepseek_v41"]),
)
# a block opener spelled with the other family's spacing: once shown as text
@example(text="<｜DSML｜ tool_calls>", thinking=False, cuts=[], family="deepseek_v4")
@example(text="<｜DSML｜calls>", thinking=False, cuts=[5], family="deepseek_v41")
def test_arbitrary_markup_soup_never_raises_or_leaks_and_is_chunking_invariant(
    text: str, thinking: bool, cuts: list[int], family: str
) -> None:
    # CASE.4, CASE.8: run() asserts the invariants on both parses
    assume(not _splices_markup(text))
    whole = run([text], thinking=thinking, family=family)
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    chunked = run([text[a:b] for a, b in pairwise(points)], thinking=thinking, family=family)
    assert chunked.message.content == whole.message.content
    assert chunked.message.reasoning_content == whole.message.reasoning_content
    assert chunked.calls() == whole.calls()
