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

import math

from deepseek_frontend.errors import RequestError

__all__ = [
    "EFFORT_WORDS",
    "REASONING_EFFORT_PROFILES",
    "V4_PROFILES",
    "V41_PROFILES",
    "budget_from_thinking_tokens",
    "normalize_reasoning_effort",
]

REASONING_EFFORT_PROFILES: tuple[str, ...] = ("preview", "official")
"""DeepSeek-V4's two encoders (words only)."""

V4_PROFILES = REASONING_EFFORT_PROFILES
V41_PROFILES: tuple[str, ...] = ("release", "prerelease")
"""DeepSeek-V4.1's two effort tables (low/high/max = 50/75/100, and the pre-release
low/medium/high/max = 25/50/75/100); V4.1 also takes budgets 1-100."""

#: a numeric budget sent to a V4 checkpoint (which has only words) reads as the V4.1 word
#: whose budget is the next at or above it: 1-50 low, 51-75 high, 76-100 max
_V4_WORD_FOR_BUDGET: tuple[tuple[int, str], ...] = ((50, "low"), (75, "high"), (100, "max"))

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
    # V4.1 release table (low/high/max): a word it lacks maps as DeepSeek's own converter
    # (deepseek-recipe) maps it -- none/minimal down to low, medium and xhigh to high; ultra
    # to max. ``None`` stays None: the encoder's default is high (75).
    "release": {
        None: None,
        "none": "low",
        "minimal": "low",
        "low": "low",
        "medium": "high",
        "high": "high",
        "xhigh": "high",
        "max": "max",
        "ultra": "max",
    },
    # V4.1 pre-release table (low/medium/high/max): only medium differs (its own 50).
    "prerelease": {
        None: None,
        "none": "low",
        "minimal": "low",
        "low": "low",
        "medium": "medium",
        "high": "high",
        "xhigh": "high",
        "max": "max",
        "ultra": "max",
    },
}

EFFORT_WORDS: tuple[str, ...] = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")


def normalize_reasoning_effort(
    effort: str | int | None, profile: str, *, param: str = "reasoning_effort"
) -> str | int | None:
    """Map a user's effort onto the value the family's ``encode_messages`` takes for ``profile``.

    ``effort`` is one of :data:`EFFORT_WORDS` (case-insensitive), a budget 1-100 (an
    integer, or a string of digits) or ``None``. V4.1 profiles pass a budget through;
    V4 profiles read it as the word at or above it (1-50 low, 51-75 high, 76-100 max).
    Raises :class:`RequestError` (``param``) for anything else and ``ValueError`` for an
    unknown profile (a server configuration error). Whether ``"none"`` also switches
    thinking off is the API layer's decision; here it only picks the lowest effort.
    """
    table = _MAPPING.get(profile)
    if table is None:
        raise ValueError(
            f"unknown reasoning effort profile {profile!r}; "
            f"expected one of {REASONING_EFFORT_PROFILES + V41_PROFILES}"
        )
    if isinstance(effort, str) and effort.strip().isdigit():
        effort = int(effort.strip())
    if isinstance(effort, int) and not isinstance(effort, bool):
        if not 1 <= effort <= 100:
            raise RequestError(f"{param}: a numeric effort must be 1-100, got {effort}", param=param)
        if profile in V41_PROFILES:
            return effort
        word = next(w for limit, w in _V4_WORD_FOR_BUDGET if effort <= limit)
        return table[word]
    key = effort.lower() if isinstance(effort, str) else effort
    try:
        known = key in table
    except TypeError:  # an unhashable JSON value
        known = False
    if not known:
        raise RequestError(
            f"{param}: unsupported value {effort!r}; expected one of {', '.join(EFFORT_WORDS)} "
            "or a number 1-100",
            param=param,
        )
    return table[key]


def budget_from_thinking_tokens(budget_tokens: int) -> int:
    """Anthropic ``thinking.budget_tokens`` as a V4.1 effort budget 1-100.

    Logarithmic: Anthropic's minimum budget (1024 tokens) is 25 and every doubling adds 15,
    so 32768 tokens (and more) is 100: 1024 -> 25, 2048 -> 40, 4096 -> 55, 8192 -> 70,
    16384 -> 85. Claude Code's "think" / "megathink" / "ultrathink" budgets (4000, 10000,
    31999) land near V4.1's low / high / max (55, 74, 100). Below 1024 it falls to 1.
    """
    if budget_tokens < 1:
        return 1
    return max(1, min(100, round(25 + 15 * math.log2(budget_tokens / 1024))))
