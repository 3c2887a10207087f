"""Tenants: who an API key belongs to, which models it may use and what limits it has.

A :class:`TenantTable` is built from a keys file (:func:`load_keys_file`, YAML or JSON), from
configuration entries (:meth:`TenantTable.from_entries`) or from plain ``--api-key`` values
(:meth:`TenantTable.from_plain_keys`). It keeps only the SHA-256 digest of every key, so a
configuration may give ``key_sha256`` instead of the key itself, and the process never holds more
than the digest of a key it was told. :meth:`TenantTable.authenticate` compares the presented key's
digest with every entry's in constant time per entry and without stopping at a match, so timing
does not tell which entry was close. Validation messages name the path of what is wrong and never
a key's value.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from deepseek_frontend.generation import MAX_PRIORITY, MIN_PRIORITY

__all__ = ["Tenant", "TenantLimits", "TenantTable", "load_keys_file", "read_api_key_file"]

_RATE_FIELDS = ("requests_per_minute", "tokens_per_minute", "concurrent_requests")
#: the Batch APIs' limits of a key (api/batches/): lines and bytes of one batch, batches not finished
_BATCH_FIELDS = ("batch_max_lines", "batch_max_bytes", "max_active_batches")
_LIMIT_FIELDS = (*_RATE_FIELDS, *_BATCH_FIELDS)
#: a key's priority (edge/priority.py): the default of its requests, and the ceiling they cannot pass
_PRIORITY_FIELDS = ("priority", "max_priority")
_FIELDS = ("name", "key", "key_sha256", "models", *_LIMIT_FIELDS, *_PRIORITY_FIELDS)


def key_name(key: bytes) -> str:
    """How logs name an API key that has no name: ``key-`` and 8 hex digits of its SHA-256.

    Enough to tell a deployment's keys apart, not to recover one (keys are long random strings).
    """
    return "key-" + hashlib.sha256(key).hexdigest()[:8]


@dataclass(frozen=True)
class TenantLimits:
    """A tenant's limits; ``None`` is unlimited (for the batch limits: the server's ``--batch-*``
    flags apply)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_requests: int | None = None
    #: requests (lines) one batch may hold; bytes of one batch's input; batches not finished at once
    batch_max_lines: int | None = None
    batch_max_bytes: int | None = None
    max_active_batches: int | None = None
    #: the priority of the key's requests that state none (None: the default tier's, 0), and the
    #: highest any of its requests gets (None: no ceiling); a request asking for more is clamped
    #: to it (edge/priority.py). Both on the frontend's scale (generation.py), higher first.
    priority: int | None = None
    max_priority: int | None = None

    @property
    def unlimited(self) -> bool:
        """Whether no rate limit applies (requests, tokens, concurrency; the batch limits are not
        rate limits: the batch endpoints check them)."""
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.concurrent_requests is None
        )


UNLIMITED = TenantLimits()


@dataclass(frozen=True)
class Tenant:
    """One API key: its name (logs, metrics, error messages), digest, models and limits."""

    name: str
    #: SHA-256 digest of the key (32 bytes); left out of repr, which logs may show
    key_sha256: bytes = field(repr=False)
    #: the model names this key may use; ``None``: every model
    models: frozenset[str] | None = None
    limits: TenantLimits = UNLIMITED

    def may_use(self, model_name: str) -> bool:
        return self.models is None or model_name in self.models


class TenantTable:
    """The configured tenants, looked up by the key a request presents."""

    def __init__(self, tenants: Sequence[Tenant] = ()) -> None:
        names: set[str] = set()
        digests: set[bytes] = set()
        for tenant in tenants:
            if len(tenant.key_sha256) != 32:
                raise ValueError(f"tenant {tenant.name!r}: key_sha256 must be 32 bytes")
            if tenant.name in names:
                raise ValueError(f"tenant name {tenant.name!r} is given twice")
            if tenant.key_sha256 in digests:
                raise ValueError(f"tenant {tenant.name!r} has the same key as another tenant")
            names.add(tenant.name)
            digests.add(tenant.key_sha256)
        self._tenants: tuple[Tenant, ...] = tuple(tenants)

    @classmethod
    def from_entries(cls, entries: object, where: str = "keys") -> TenantTable:
        """Validate a list of key entries (mappings) from configuration; ``where`` is the path
        error messages start with (``keys[1].name: ...``)."""
        if not isinstance(entries, list):
            raise ValueError(f"{where}: must be a list of key entries, got {_kind(entries)}")
        if not entries:
            raise ValueError(f"{where}: must list at least one key")
        tenants: list[Tenant] = []
        first_by_name: dict[str, int] = {}
        first_by_digest: dict[bytes, int] = {}
        for index, entry in enumerate(entries):
            path = f"{where}[{index}]"
            tenant = _tenant_from_entry(entry, path)
            if tenant.name in first_by_name:
                raise ValueError(
                    f"{path}.name: {tenant.name!r} is also the name of {where}[{first_by_name[tenant.name]}]"
                )
            if tenant.key_sha256 in first_by_digest:
                raise ValueError(f"{path}: the same key as {where}[{first_by_digest[tenant.key_sha256]}]")
            first_by_name[tenant.name] = index
            first_by_digest[tenant.key_sha256] = index
            tenants.append(tenant)
        return cls(tenants)

    @classmethod
    def from_plain_keys(cls, keys: Sequence[str]) -> TenantTable:
        """Unlimited tenants allowed every model, one per distinct key, named by :func:`key_name`."""
        tenants: list[Tenant] = []
        seen: set[bytes] = set()
        for key in keys:
            raw = key.encode()
            digest = hashlib.sha256(raw).digest()
            if digest not in seen:
                seen.add(digest)
                tenants.append(Tenant(name=key_name(raw), key_sha256=digest))
        return cls(tenants)

    def authenticate(self, presented: bytes) -> Tenant | None:
        """The tenant whose key is ``presented``, or ``None``.

        Every entry's digest is compared (``hmac.compare_digest``), also after a match: the time
        taken depends on the number of entries only.
        """
        digest = hashlib.sha256(presented).digest()
        found: Tenant | None = None
        for tenant in self._tenants:
            if hmac.compare_digest(digest, tenant.key_sha256):
                found = tenant
        return found

    def by_name(self, name: str) -> Tenant | None:
        """The tenant named ``name`` (the work a key left running, such as a batch, finds its key's
        permissions again by name; the key itself is never kept)."""
        for tenant in self._tenants:
            if tenant.name == name:
                return tenant
        return None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tenant.name for tenant in self._tenants)

    def __len__(self) -> int:
        return len(self._tenants)

    def __iter__(self) -> Iterator[Tenant]:
        return iter(self._tenants)

    def __repr__(self) -> str:
        return f"TenantTable({list(self.names)!r})"


def read_api_key_file(path: str | Path) -> list[str]:
    """The keys of an ``--api-key-file``: one key per line, as a mounted secret holds one (blank
    lines and lines starting with ``#`` skipped, whitespace around a key dropped). Each is a key
    like ``--api-key``'s (unnamed, unlimited); names and limits take ``--keys-file``. Raises
    ValueError naming the file (never a key) when it cannot be read or holds no key."""
    label = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{label}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{label}: not UTF-8 text") from None
    keys = [line.strip() for line in text.splitlines()]
    keys = [key for key in keys if key and not key.startswith("#")]
    if not keys:
        raise ValueError(f"{label}: holds no key (one key per line)")
    for number, key in enumerate(keys, 1):
        if any(c.isspace() for c in key):
            raise ValueError(f"{label}: key {number} holds whitespace (one key per line)")
    return keys


def load_keys_file(path: str | Path) -> TenantTable:
    """Read a keys file: a YAML or JSON list of key entries, or a mapping with a ``keys:`` list.

    ``.json`` files are parsed as JSON, others as YAML. Messages start with the file's path.
    """
    label = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{label}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{label}: not UTF-8 text") from None
    document = _parse(text, label, as_json=label.endswith(".json"))
    if isinstance(document, Mapping):
        unknown = [str(given) for given in document if given != "keys"]
        if unknown:
            raise ValueError(f"{label}: unknown field {unknown[0]!r} (a keys file has only 'keys')")
        if "keys" not in document:
            raise ValueError(f"{label}: keys: required")
        return TenantTable.from_entries(document["keys"], where=f"{label}: keys")
    if isinstance(document, list):
        return TenantTable.from_entries(document, where=label)
    raise ValueError(
        f"{label}: must be a list of key entries or a mapping with a 'keys' list, got {_kind(document)}"
    )


def _parse(text: str, label: str, as_json: bool) -> object:
    # the parsers' own messages quote the offending line, which may hold a key: only the
    # position and the problem are reported
    if as_json:
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{label}: line {e.lineno}, column {e.colno}: not valid JSON: {e.msg}") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ValueError(f"{label}: {where}not valid YAML: {e.problem or 'syntax error'}") from None
    except yaml.YAMLError:
        raise ValueError(f"{label}: not valid YAML") from None


def _tenant_from_entry(entry: object, path: str) -> Tenant:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{path}: must be a mapping, got {_kind(entry)}")
    for given in entry:
        if given not in _FIELDS:
            raise ValueError(f"{path}: unknown field {str(given)!r} (allowed: {', '.join(_FIELDS)})")
    name = entry.get("name")
    if name is None:
        raise ValueError(f"{path}.name: required")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{path}.name: must be a non-empty string, got {_shown(name)}")
    priorities = {field: _priority(entry.get(field), f"{path}.{field}") for field in _PRIORITY_FIELDS}
    default, ceiling = priorities["priority"], priorities["max_priority"]
    if default is not None and ceiling is not None and default > ceiling:
        raise ValueError(f"{path}.priority: {default} is above the key's max_priority ({ceiling})")
    return Tenant(
        name=name,
        key_sha256=_digest(entry, path),
        models=_models(entry.get("models"), f"{path}.models"),
        limits=TenantLimits(
            **{limit: _limit(entry.get(limit), f"{path}.{limit}") for limit in _LIMIT_FIELDS},
            **priorities,
        ),
    )


def _digest(entry: Mapping[object, object], path: str) -> bytes:
    has_key = entry.get("key") is not None
    has_digest = entry.get("key_sha256") is not None
    if has_key and has_digest:
        raise ValueError(f"{path}: give either key or key_sha256, not both")
    if not has_key and not has_digest:
        raise ValueError(f"{path}: give key or key_sha256")
    if has_key:
        key = entry["key"]
        # the value is never shown, not even a wrong one: it may be a real key mistyped
        if not isinstance(key, str) or not key:
            raise ValueError(f"{path}.key: must be a non-empty string, got {_kind(key)}")
        return hashlib.sha256(key.encode()).digest()
    digest = entry["key_sha256"]
    if not isinstance(digest, str):
        raise ValueError(f"{path}.key_sha256: must be 64 hexadecimal digits, got {_kind(digest)}")
    try:
        raw = bytes.fromhex(digest.strip())
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ValueError(
            f"{path}.key_sha256: must be 64 hexadecimal digits (a SHA-256 digest), "
            f"got {len(digest)} characters"
        )
    return raw


def _models(models: object, path: str) -> frozenset[str] | None:
    if models is None:
        return None
    if not isinstance(models, list):
        raise ValueError(f"{path}: must be a list of model names, got {_kind(models)}")
    if not models:
        raise ValueError(f"{path}: must name at least one model (leave it out to allow every model)")
    for index, model in enumerate(models):
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"{path}[{index}]: must be a non-empty string, got {_shown(model)}")
    return frozenset(models)


def _limit(value: object, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{path}: must be a positive integer, got {_shown(value)}")
    return value


def _priority(value: object, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(
            f"{path}: must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY} (higher is more important), "
            f"got {_shown(value)}"
        )
    return value


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "a string"}.get(type(value), type(value).__name__)


def _shown(value: object) -> str:
    """A wrong value as a message shows it (short; only for fields that are not keys)."""
    if isinstance(value, list | dict):
        return _kind(value)
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."
