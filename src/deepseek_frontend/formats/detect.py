"""Which DeepSeek family and effort profile a deployment serves.

The only module of ``formats/`` that reads files: ``config.json`` and the
checkpoint's bundled reference encoder, once at startup. Renderers stay pure.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from deepseek_frontend.formats.effort import REASONING_EFFORT_PROFILES

# Served-name fallbacks, anchored at the start of the name's last path component
# (``deepseek-ai/DeepSeek-V4-Flash`` is a Hugging Face repo id for DeepSeek-V4-Flash;
# ``my-deepseek-v4`` and ``foo/my-deepseek-v4`` are someone else's model). The
# trailing group stops ``deepseek-v40`` / ``deepseek-v4pro``. V4.1 is tried before
# V4, whose pattern would also accept ``deepseek-v4.1``.
_NAME_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("deepseek_v41", re.compile(r"^deepseek[-_.]?v4[-_.]?1([-_.]|$)", re.IGNORECASE)),
    ("deepseek_v4", re.compile(r"^deepseek[-_.]?v4([-_.]|$)", re.IGNORECASE)),
    ("deepseek_v32", re.compile(r"^deepseek[-_.]?v3[-_.]?2([-_.]|$)", re.IGNORECASE)),
)

_MODEL_TYPES = {
    "deepseek_v4": "deepseek_v4",
    "deepseek_v41": "deepseek_v41",
    "deepseek_v32": "deepseek_v32",
    "deepseek_v3_2": "deepseek_v32",
}

# Checkpoint names known to ship the official (0731) effort encoder, for when
# neither config nor encoder file says.
_OFFICIAL_NAME = re.compile(r"(^|[-_./])0731([-_.]|$)")


def _read_config(model_path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    if not model_path:
        return None
    try:
        with open(Path(model_path) / "config.json", encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _family_from_config(config: dict[str, Any]) -> tuple[bool, str | None]:
    """(decided, family): ``decided`` is False when the config says nothing usable."""
    model_type = config.get("model_type")
    architectures = config.get("architectures")
    archs = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    if any("DeepseekV41" in a for a in archs) or model_type == "deepseek_v41":
        return True, "deepseek_v41"
    if isinstance(model_type, str) and model_type:
        return True, _MODEL_TYPES.get(model_type)
    # No model_type: architectures are the next best authority.
    if any("DeepseekV4" in a for a in archs):
        return True, "deepseek_v4"
    if any("DeepseekV32" in a for a in archs):
        return True, "deepseek_v32"
    return False, None


def detect_family(
    model_path: str | os.PathLike[str] | None = None, served_model_name: str | None = None
) -> str | None:
    """``"deepseek_v4"``, ``"deepseek_v41"``, ``"deepseek_v32"`` or ``None``.

    ``config.json`` in ``model_path`` decides when it names a ``model_type`` (or,
    without one, a DeepSeek architecture): a concrete other type such as ``llama``
    gives ``None`` whatever the served name says. Only without a usable config
    (no path, no file, unreadable, empty ``model_type``) is ``served_model_name``
    matched, anchored and case-insensitive, against its last ``/``-separated
    component so that Hugging Face repo ids work (``deepseek-v4-flash`` and
    ``deepseek-ai/DeepSeek-V4-Flash`` yes; ``my-deepseek-v4``, ``foo/my-deepseek-v4``
    and ``deepseek-v40`` no).
    """
    config = _read_config(model_path)
    if config is not None:
        decided, family = _family_from_config(config)
        if decided:
            return family
    if not served_model_name:
        return None
    basename = served_model_name.rsplit("/", 1)[-1]
    for family, pattern in _NAME_PATTERNS:
        if pattern.match(basename):
            return family
    return None


def default_effort_profile(
    model_path: str | os.PathLike[str] | None = None, served_model_name: str | None = None
) -> str:
    """The reasoning-effort profile a V4 checkpoint was trained with, best guess.

    A V4.1 checkpoint: ``release``, or ``prerelease`` when its ``config.json`` sets
    ``dsv41_reasoning_effort_profile: "prerelease"``. A V4 checkpoint, in order:
    ``config.json`` key ``dsv4_reasoning_effort_profile`` (the key SGLang
    reads for converted checkpoints); the checkpoint's bundled
    ``encoding/encoding_dsv4.py`` (``REASONING_EFFORT_PROMPTS`` means official,
    ``REASONING_EFFORT_MAX`` preview); a ``0731`` tag in the served name or the
    model directory name; else ``"preview"``. The server flag
    ``--reasoning-effort-profile`` overrides all of this.
    """
    config = _read_config(model_path)
    if detect_family(model_path, served_model_name) == "deepseek_v41":
        # V4.1: the release table unless the checkpoint declares the pre-release one.
        declared = (config or {}).get("dsv41_reasoning_effort_profile")
        return "prerelease" if declared == "prerelease" else "release"
    if config is not None:
        declared = config.get("dsv4_reasoning_effort_profile")
        if declared in REASONING_EFFORT_PROFILES:
            return str(declared)
    if model_path:
        try:
            source = (Path(model_path) / "encoding" / "encoding_dsv4.py").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            source = ""
        if "REASONING_EFFORT_PROMPTS" in source:
            return "official"
        if "REASONING_EFFORT_MAX" in source:
            return "preview"
    names = [served_model_name or "", Path(model_path).name if model_path else ""]
    if any(_OFFICIAL_NAME.search(name) for name in names):
        return "official"
    return "preview"
