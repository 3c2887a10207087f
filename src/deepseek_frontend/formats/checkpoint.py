"""What a checkpoint directory says about itself, read once at start-up.

The only module of ``formats/`` that reads files: a checkpoint's ``config.json`` and its bundled
reference encoder (``encoding/encoding_dsv4.py``). :func:`read_checkpoint` reads both once into a
:class:`Checkpoint`; family detection, the default effort profile (``formats/detect.py``) and the
server's configuration (its context length) all read that record, never the files. Renderers stay
pure.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Checkpoint", "read_checkpoint"]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The facts of one checkpoint directory the frontend uses (all absent: no directory).

    A field is None when ``config.json`` is missing, unreadable, not a JSON object, or does not set
    it to a value of its type (a ``model_type`` that is not a non-empty string is None).
    """

    #: the directory (``--model-path``); None: none given
    path: str | None = None
    #: whether ``config.json`` exists as a file, readable or not
    has_config: bool = False
    #: ``config.json`` ``model_type`` (``deepseek_v4``, ``deepseek_v32``, ``llama``, ...)
    model_type: str | None = None
    #: ``config.json`` ``architectures``, the strings among them
    architectures: tuple[str, ...] = ()
    #: ``config.json`` ``max_position_embeddings`` when a positive integer: the context length
    max_position_embeddings: int | None = None
    #: ``config.json`` ``dsv4_reasoning_effort_profile`` (the key SGLang reads for converted checkpoints)
    dsv4_reasoning_effort_profile: str | None = None
    #: ``config.json`` ``dsv41_reasoning_effort_profile`` (``prerelease`` for a pre-release V4.1)
    dsv41_reasoning_effort_profile: str | None = None
    #: the text of the bundled ``encoding/encoding_dsv4.py`` ("" when absent or unreadable)
    encoder_source: str = ""

    @property
    def directory_name(self) -> str:
        """The last component of :attr:`path` ("" without one)."""
        return Path(self.path).name if self.path else ""


def read_checkpoint(model_path: str | os.PathLike[str] | None) -> Checkpoint:
    """Read ``model_path``'s ``config.json`` and bundled encoder once; a missing or unreadable file
    leaves its fields empty (never raises)."""
    if not model_path:
        return Checkpoint()
    folder = Path(model_path)
    config_file = folder / "config.json"
    config = _read_json_object(config_file)
    try:
        encoder = (folder / "encoding" / "encoding_dsv4.py").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        encoder = ""
    architectures = config.get("architectures")
    positions = config.get("max_position_embeddings")
    return Checkpoint(
        path=str(model_path),
        has_config=config_file.is_file(),
        model_type=_text(config.get("model_type")),
        architectures=(
            tuple(a for a in architectures if isinstance(a, str)) if isinstance(architectures, list) else ()
        ),
        max_position_embeddings=positions if isinstance(positions, int) and positions > 0 else None,
        dsv4_reasoning_effort_profile=_text(config.get("dsv4_reasoning_effort_profile")),
        dsv41_reasoning_effort_profile=_text(config.get("dsv41_reasoning_effort_profile")),
        encoder_source=encoder,
    )


def _read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when it is missing, unreadable or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
