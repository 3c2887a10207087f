"""Frontend stop strings: matched across chunk boundaries, nothing after the match leaks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from deepseek_frontend.pipeline.stop import StopStringMatcher


def run(stops: list[str], pieces: list[str]) -> tuple[str, str | None]:
    m = StopStringMatcher(stops)
    out = []
    matched = None
    for piece in pieces:
        text, matched = m.feed(piece)
        out.append(text)
        if matched is not None:
            break
    else:
        out.append(m.flush())
    return "".join(out), m.matched


def test_a_stop_split_across_chunks_is_matched_and_never_emitted() -> None:
    m = StopStringMatcher(["END"])
    assert m.feed("abcE") == ("abc", None)
    assert m.feed("N") == ("", None)
    assert m.feed("D and more") == ("", "END")
    assert m.matched == "END"
    assert m.feed("later") == ("", "END")
    assert m.flush() == ""


def test_held_text_is_released_once_it_cannot_start_a_stop() -> None:
    m = StopStringMatcher(["END"])
    assert m.feed("abcE") == ("abc", None)
    assert m.feed("Nx") == ("ENx", None)


def test_text_is_flushed_at_the_end_when_no_stop_matched() -> None:
    m = StopStringMatcher(["</answer>"])
    assert m.feed("done </ans") == ("done ", None)
    assert m.flush() == "</ans"


def test_the_earliest_of_several_stops_wins() -> None:
    assert run(["cat", "at the"], ["look at the cat"]) == ("look ", "at the")
    assert run(["b", "abc"], ["xxabc"]) == ("xx", "abc")


def test_empty_stop_strings_are_ignored() -> None:
    m = StopStringMatcher(["", ""])
    assert not m
    assert m.feed("anything") == ("anything", None)


@given(
    text=st.text(alphabet="abE ND", max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=6),
    stops=st.lists(st.text(alphabet="abEND", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_any_chunking_gives_the_one_shot_result(text: str, cuts: list[int], stops: list[str]) -> None:
    bounds = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    expected_cut = min((i for i in (text.find(s) for s in stops) if i != -1), default=-1)
    got_text, got_stop = run(stops, pieces)
    if expected_cut == -1:
        assert (got_text, got_stop) == (text, None)
    else:
        assert got_text == text[:expected_cut]
        assert got_stop is not None and text.startswith(got_stop, expected_cut)


def test_a_stop_that_starts_earlier_wins_over_one_already_complete() -> None:
    # Hypothesis found this: "E" is complete in "DbE", but "bED" starts earlier and completes next.
    assert run(["E", "bED"], ["DbE", "D"]) == ("D", "bED")


def test_a_held_complete_stop_is_still_found_when_the_stream_ends() -> None:
    # "E" waits because "bE" may still become "bEX"; the stream ends: the one-shot answer cuts at "E".
    m = StopStringMatcher(["E", "bEX"])
    assert m.feed("abE") == ("a", None)  # "bE" may still become "bEX"
    assert m.flush() == "b"  # "a" + "b": the text before the stop
    assert m.matched == "E"
