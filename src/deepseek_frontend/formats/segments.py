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

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PromptSegment:
    text: str
    special: bool = False


def join_segments(segments: list[PromptSegment]) -> str:
    """The prompt string the segments spell."""
    return "".join(s.text for s in segments)
