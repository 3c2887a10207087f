"""DeepSeek chat formats: render prompts as typed segments, parse whole completions.

Public entry points::

    checkpoint = read_checkpoint(model_path)                  # config.json etc., read once
    family = detect_family(checkpoint, served_model_name)    # "deepseek_v4" | ... | None
    fmt = get_chat_format(family)                             # dsv4 / dsv41 / dsv32 module
    messages = place_instructions(messages)                    # developer / mid-conversation system
    messages = attach_request_tools(messages, tools, response_format)
    effort = normalize_reasoning_effort(word, profile)        # profile: default_effort_profile(...)
    segments = fmt.render_prompt_segments(messages, "thinking", reasoning_effort=effort,
                                          reasoning_effort_profile=profile)  # V4 only: effort args
    prompt = join_segments(segments)                          # == fmt.encode_messages(...)

Adding a family is one module exposing ``render_prompt_segments``,
``encode_messages`` and ``parse_message_from_completion_text`` plus one line in
:data:`_REGISTRY` (see docs/formats.md).
"""

from __future__ import annotations

from types import ModuleType

from deepseek_frontend.errors import UnsupportedModelError
from deepseek_frontend.formats import dsv4, dsv32, dsv41
from deepseek_frontend.formats.checkpoint import Checkpoint, read_checkpoint
from deepseek_frontend.formats.detect import default_effort_profile, detect_family
from deepseek_frontend.formats.effort import (
    EFFORT_WORDS,
    REASONING_EFFORT_PROFILES,
    normalize_reasoning_effort,
)
from deepseek_frontend.formats.request import attach_request_tools, continues_assistant, place_instructions
from deepseek_frontend.formats.segments import PromptSegment, join_segments

FAMILIES: tuple[str, ...] = ("deepseek_v4", "deepseek_v41", "deepseek_v32")
"""Every family :func:`detect_family` can return."""

_REGISTRY: dict[str, ModuleType] = {
    "deepseek_v4": dsv4,
    "deepseek_v41": dsv41,
    "deepseek_v32": dsv32,
}

_NOT_YET: dict[str, str] = {}


def get_chat_format(family: str | None) -> ModuleType:
    """The format module for ``family``: ``render_prompt_segments``, ``encode_messages``,
    ``parse_message_from_completion_text``, ``FAMILY``, ``SPECIAL_SPELLINGS``.

    Raises :class:`UnsupportedModelError` for a family without an encoder
    (``deepseek_v41`` today) or an unknown / ``None`` family.
    """
    module = _REGISTRY.get(family) if isinstance(family, str) else None
    if module is not None:
        return module
    if family in _NOT_YET:
        raise UnsupportedModelError(_NOT_YET[family])
    raise UnsupportedModelError(
        f"no DeepSeek chat format for model family {family!r}; supported: {', '.join(sorted(_REGISTRY))}"
    )


__all__ = [
    "EFFORT_WORDS",
    "FAMILIES",
    "REASONING_EFFORT_PROFILES",
    "Checkpoint",
    "PromptSegment",
    "attach_request_tools",
    "continues_assistant",
    "default_effort_profile",
    "detect_family",
    "get_chat_format",
    "join_segments",
    "normalize_reasoning_effort",
    "place_instructions",
    "read_checkpoint",
]
