"""Reasoning effort: the words users send, mapped onto what a checkpoint's encoder takes.

DeepSeek-V4 turns reasoning effort into a text written before the first message in
thinking mode. Two encoder generations disagree on the words:

============  =======================  ==================================
effort        ``preview`` (April V4)   ``official`` (0731 refresh)
============  =======================  ==================================
``None``      no text                  no text (encoder default ``low``)
``"low"``     rejected                 no text
``"high"``    no text                  "Absolute maximum ..." text
``"max"``     "Absolute maximum ..."   "Beyond maximum ..." text
============  =======================  ==================================

:func:`normalize_reasoning_effort` maps the OpenAI/Anthropic words onto the second
column's or third column's keys so that a word keeps its meaning across checkpoints
as far as the checkpoint allows (see docs/formats.md for the table and reasons).
"""

from __future__ import annotations

from deepseek_frontend.errors import RequestError

REASONING_EFFORT_PROFILES: tuple[str, ...] = ("preview", "official")

# word -> encoder value, per profile. ``None`` is "the client did not say".
_MAPPING: dict[str, dict[str | None, str | None]] = {
    "preview": {
        # The preview encoder knows high (no text) and max; DeepSeek's API maps
        # low/medium to high and xhigh to max for these checkpoints.
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
        # DeepSeek's API and deepseek-recipe default to "high" when unset; the
        # encoder's own default is "low", so the unset case is resolved here.
        None: "high",
        "none": "low",
        "minimal": "low",
        "low": "low",
        "medium": "high",
        "high": "high",
        # deepseek-recipe renders xhigh with the high text.
        "xhigh": "high",
        "max": "max",
        "ultra": "max",
    },
}

EFFORT_WORDS: tuple[str, ...] = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")


def normalize_reasoning_effort(effort: str | None, profile: str) -> str | None:
    """Map a user's effort word onto the value ``dsv4.encode_messages`` takes for ``profile``.

    ``effort`` is one of :data:`EFFORT_WORDS` (case-insensitive) or ``None``.
    Raises :class:`RequestError` (``param="reasoning_effort"``) for other words and
    ``ValueError`` for an unknown profile (a server configuration error).
    Whether ``"none"`` also switches thinking off is the API layer's decision;
    here it only picks the lowest effort.
    """
    table = _MAPPING.get(profile)
    if table is None:
        raise ValueError(
            f"unknown reasoning effort profile {profile!r}; expected one of {REASONING_EFFORT_PROFILES}"
        )
    key = effort.lower() if isinstance(effort, str) else effort
    if key not in table:
        raise RequestError(
            f"reasoning_effort: unsupported value {effort!r}; expected one of {', '.join(EFFORT_WORDS)}",
            param="reasoning_effort",
        )
    return table[key]
