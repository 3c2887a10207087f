"""Which DeepSeek family and effort profile a deployment serves, and what each family defaults to.

Everything a checkpoint says comes from its :class:`~.checkpoint.Checkpoint`, read once by
``formats/checkpoint.py``; this module reads no file itself (a function given a directory instead
of a record has ``read_checkpoint`` read it).
"""

from __future__ import annotations

import os
import re

from deepseek_frontend.formats.checkpoint import Checkpoint, read_checkpoint
from deepseek_frontend.formats.effort import REASONING_EFFORT_PROFILES

__all__ = [
    "DEFAULT_CONTEXT_LENGTH",
    "FAMILY_CONTEXT_LENGTH",
    "FAMILY_DISPLAY_NAME",
    "context_length",
    "default_effort_profile",
    "detect_family",
]

#: Context window used when neither the checkpoint nor the family says (DeepSeek-V4: 1M tokens).
DEFAULT_CONTEXT_LENGTH = 1_048_576
#: Per-family context windows, for a checkpoint whose config.json does not say.
FAMILY_CONTEXT_LENGTH = {"deepseek_v4": 1_048_576, "deepseek_v41": 1_048_576, "deepseek_v32": 163_840}
#: The name a model of each family is served as when nothing else names it.
FAMILY_DISPLAY_NAME = {
    "deepseek_v4": "deepseek-v4-flash",
    "deepseek_v41": "deepseek-v4.1-flash",
    "deepseek_v32": "deepseek-v3.2",
}

CheckpointSource = Checkpoint | str | os.PathLike[str] | None
"""A checkpoint already read, or the directory to read it from (None: no checkpoint)."""

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


def _checkpoint(source: CheckpointSource) -> Checkpoint:
    return source if isinstance(source, Checkpoint) else read_checkpoint(source)


def _family_from_config(checkpoint: Checkpoint) -> tuple[bool, str | None]:
    """(decided, family): ``decided`` is False when the config says nothing usable."""
    model_type = checkpoint.model_type
    archs = checkpoint.architectures
    if any("DeepseekV41" in a for a in archs) or model_type == "deepseek_v41":
        return True, "deepseek_v41"
    if model_type:
        return True, _MODEL_TYPES.get(model_type)
    # No model_type: architectures are the next best authority.
    if any("DeepseekV4" in a for a in archs):
        return True, "deepseek_v4"
    if any("DeepseekV32" in a for a in archs):
        return True, "deepseek_v32"
    return False, None


def detect_family(model_path: CheckpointSource = None, served_model_name: str | None = None) -> str | None:
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
    decided, family = _family_from_config(_checkpoint(model_path))
    if decided:
        return family
    if not served_model_name:
        return None
    basename = served_model_name.rsplit("/", 1)[-1]
    for family, pattern in _NAME_PATTERNS:
        if pattern.match(basename):
            return family
    return None


def default_effort_profile(model_path: CheckpointSource = None, served_model_name: str | None = None) -> str:
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
    checkpoint = _checkpoint(model_path)
    if detect_family(checkpoint, served_model_name) == "deepseek_v41":
        # V4.1: the release table unless the checkpoint declares the pre-release one.
        return "prerelease" if checkpoint.dsv41_reasoning_effort_profile == "prerelease" else "release"
    declared = checkpoint.dsv4_reasoning_effort_profile
    if declared in REASONING_EFFORT_PROFILES:
        return str(declared)
    if "REASONING_EFFORT_PROMPTS" in checkpoint.encoder_source:
        return "official"
    if "REASONING_EFFORT_MAX" in checkpoint.encoder_source:
        return "preview"
    names = [served_model_name or "", checkpoint.directory_name]
    if any(_OFFICIAL_NAME.search(name) for name in names):
        return "official"
    return "preview"


def context_length(checkpoint: Checkpoint, family: str) -> int:
    """The context window of ``family``'s model in ``checkpoint``: its ``max_position_embeddings``,
    else the family's, else :data:`DEFAULT_CONTEXT_LENGTH`."""
    if checkpoint.max_position_embeddings is not None:
        return checkpoint.max_position_embeddings
    return FAMILY_CONTEXT_LENGTH.get(family, DEFAULT_CONTEXT_LENGTH)
