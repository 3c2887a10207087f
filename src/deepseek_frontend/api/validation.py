"""Field validators shared by every request adapter (OpenAI chat and completions, Anthropic, Responses).

Each validator takes a JSON value and the JSON path it came from, returns the value
typed, or raises :class:`~deepseek_frontend.errors.RequestError` with ``param`` set to
that path. Every message names the path first, then what was expected and what came:
``check_string(3, "messages[2].content")`` raises ``RequestError`` with param
``messages[2].content`` and message ``messages[2].content: expected a string, got number``.

``default``: a field that is absent or JSON ``null`` (``value is None``) gives
``default`` when one is passed; without one, ``None`` fails the type check
(``... got null``). Booleans are never numbers here, although ``bool`` is an
``int`` subclass in Python: ``true`` is no valid temperature or token count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

from deepseek_frontend.errors import RequestError

__all__ = [
    "check_array",
    "check_boolean",
    "check_id",
    "check_integer",
    "check_number",
    "check_object",
    "check_string",
    "check_tool_name",
    "json_type",
]

D = TypeVar("D")


class _Required:
    """Sentinel type: no default, ``None`` is an error."""

    def __repr__(self) -> str:
        return "REQUIRED"


_REQUIRED: Final[Any] = _Required()


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for error messages (``"null"``, ``"number"``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _mismatch(path: str, expected: str, value: Any) -> RequestError:
    return RequestError(f"{path}: expected {expected}, got {json_type(value)}", param=path)


def check_object(value: Any, path: str, *, default: D = _REQUIRED) -> Mapping[str, Any] | D:
    """A JSON object."""
    if value is None and default is not _REQUIRED:
        return default
    if not isinstance(value, Mapping):
        raise _mismatch(path, "an object", value)
    return value


def check_array(value: Any, path: str, *, non_empty: bool = False) -> list[Any]:
    """A JSON array (with ``non_empty``: at least one element)."""
    if not isinstance(value, list):
        raise _mismatch(path, "an array", value)
    if non_empty and not value:
        raise RequestError(f"{path}: must not be empty", param=path)
    return value


def check_string(value: Any, path: str, *, non_empty: bool = False, default: D = _REQUIRED) -> str | D:
    """A JSON string (with ``non_empty``: not ``""``)."""
    if value is None and default is not _REQUIRED:
        return default
    if not isinstance(value, str):
        raise _mismatch(path, "a string", value)
    if non_empty and not value:
        raise RequestError(f"{path}: must not be empty", param=path)
    return value


#: longest id of a stored object a client may name (path ids, list cursors, item ids): ids are
#: index keys of the state store, and PostgreSQL refuses index entries past ~2.7 KB
MAX_ID_CHARS = 512


def check_id(value: Any, path: str, *, default: D = _REQUIRED) -> str | D:
    """The id of a stored object as a client names it (in a URL, a list cursor, a body): a
    non-empty string of at most :data:`MAX_ID_CHARS` characters without NUL. PostgreSQL's text
    holds no U+0000 (and SQLite's does): one rule for both stores, so a NUL is the same 400
    whichever store the server has, never a 500."""
    text = check_string(value, path, non_empty=True, default=default)
    if text is default:
        return text
    if "\x00" in text:
        raise RequestError(f"{path}: ids cannot contain NUL (U+0000)", param=path)
    if len(text) > MAX_ID_CHARS:
        raise RequestError(f"{path}: ids are at most {MAX_ID_CHARS} characters, got {len(text)}", param=path)
    return text


def check_boolean(value: Any, path: str, *, default: D = _REQUIRED) -> bool | D:
    """``true`` or ``false``."""
    if value is None and default is not _REQUIRED:
        return default
    if not isinstance(value, bool):
        raise _mismatch(path, "a boolean", value)
    return value


def check_integer(
    value: Any,
    path: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    default: D = _REQUIRED,
) -> int | D:
    """A whole number within ``[minimum, maximum]`` (each bound optional)."""
    if value is None and default is not _REQUIRED:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _mismatch(path, "an integer", value)
    if minimum is not None and value < minimum:
        raise RequestError(f"{path}: must be at least {minimum}, got {value}", param=path)
    if maximum is not None and value > maximum:
        raise RequestError(f"{path}: must be at most {maximum}, got {value}", param=path)
    return value


def check_number(
    value: Any, path: str, *, minimum: float, maximum: float, default: D = _REQUIRED
) -> float | D:
    """A finite number within ``[minimum, maximum]``, as a float."""
    if value is None and default is not _REQUIRED:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _mismatch(path, "a number", value)
    if not math.isfinite(value):  # orjson refuses inf and nan, but json.loads (the CLI commands) reads them
        raise RequestError(f"{path}: expected a finite number, got {value}", param=path)
    if not minimum <= value <= maximum:
        raise RequestError(f"{path}: must be between {minimum:g} and {maximum:g}, got {value}", param=path)
    return float(value)


def check_tool_name(value: Any, path: str, tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """A tool choice's tool name, which ``tools`` (OpenAI function tools) must declare.

    Returns OpenAI's named tool choice, ``{"type": "function", "function": {"name": ...}}``.
    """
    name = check_string(value, path)
    if name not in {t["function"]["name"] for t in tools or ()}:
        raise RequestError(f"{path}: no tool named {name!r} is declared", param=path)
    return {"type": "function", "function": {"name": name}}


def check_metadata(raw: Any) -> dict[str, str]:
    """OpenAI's metadata rules: an object of at most 16 string values (keys <= 64, values <= 512)."""
    if raw is None:
        return {}
    metadata = check_object(raw, "metadata")
    if len(metadata) > 16:
        raise RequestError(f"metadata: at most 16 pairs, got {len(metadata)}", param="metadata")
    for key, value in metadata.items():
        if len(key) > 64:
            raise RequestError(
                f"metadata: key {key[:20]!r}... is longer than 64 characters", param="metadata"
            )
        if not isinstance(value, str) or len(value) > 512:
            raise RequestError(
                f"metadata.{key}: expected a string of at most 512 characters", param=f"metadata.{key}"
            )
    return dict(metadata)
