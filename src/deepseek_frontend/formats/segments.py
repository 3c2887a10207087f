"""The renderer's output unit: prompt text tagged by who wrote it.

A renderer returns the prompt as a list of :class:`PromptSegment`. ``special``
segments are template special tokens written by the renderer itself (BOS,
``<｜User｜>``, ``</think>``, ``｜DSML｜``, ...); each must be exactly one token.
Everything else -- request text and the template's plain prose alike -- is
``special=False`` and is tokenized with special-token recognition off, so a user
who types ``<｜end▁of▁sentence｜>`` gets ordinary text tokens.

``"".join(s.text for s in segments)`` is exactly the prompt string.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from typing import NamedTuple


class PromptSegment(NamedTuple):
    """One piece of the prompt: ``text``, and whether it is one special token.

    A named tuple rather than a (frozen) dataclass because a long agent prompt
    holds tens of thousands of segments: a tuple is immutable and hashable like a
    frozen dataclass but several times cheaper to build, and renderers build the
    plain ones in C (``tuple.__new__``), never through a Python ``__init__``.
    Equality is by value, so ``PromptSegment("a") == ("a", False)``.
    """

    text: str
    special: bool = False


_text_of = itemgetter(0)


def join_segments(segments: Iterable[PromptSegment]) -> str:
    """The prompt string the segments spell."""
    return "".join(map(_text_of, segments))
