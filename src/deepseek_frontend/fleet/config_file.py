"""``serve --config FILE``: several models and their API keys in one YAML file.

The file's shape::

    models:
      - name: deepseek-v4-flash            # the served name (--served-model-name)
        aliases: ["claude-*"]              # --model-alias, one per entry
        model_path: /models/DeepSeek-V4-Flash
        engine: sglang
        workers: ["http://10.0.0.5:30000"] # --worker; none: the in-process simulated engine
        prefill_workers: [...]             # --prefill-worker / --decode-worker: disaggregated
        decode_workers: [...]
        router_mode: kv
      - name: deepseek-v4.1-flash
    keys:                                  # api/tenants.py; with keys, every request needs one
      - {name: alice, key: sk-..., models: [deepseek-v4-flash], requests_per_minute: 60}
    keys_file: keys.yaml                   # more keys, relative to this file

Every per-model ``serve`` flag may be set in a model entry under its long name with ``_`` for
``-`` (``max_concurrent_requests: 64``, ``health_check_interval: 2``); a flag given on the command
line is every model's default. Server-wide flags (address, processes, body and connection
limits, the state store, files and batches, logging) stay on the command line. Every value is
checked as the flag would be, and an error names its place: ``models[1].router_mode: ...``.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepseek_frontend.keys.tenants import TenantTable, load_keys_file

from .config import ServerConfig

#: model-entry keys whose flag is spelled differently
ENTRY_KEY_DEST = {
    "name": "served_model_name",
    "aliases": "model_alias",
    "workers": "worker",
    "prefill_workers": "prefill_worker",
    "decode_workers": "decode_worker",
    "tokenizer": "tokenizer",
}
#: flags that belong to the server, not to one model (set on the command line only)
SERVER_DESTS = frozenset(
    {
        "help",
        "config",
        "keys_file",
        "key_limit_slots",
        "host",
        "port",
        "frontend_processes",
        "probe_port",
        "api_key",
        "api_key_file",
        "max_body_bytes",
        "max_images_per_request",
        "max_image_bytes",
        "max_total_image_bytes",
        "image_url_allow",
        "image_fetch_timeout",
        "log_level",
        "log_format",
        "header_timeout",
        "body_timeout",
        "max_connections",
        "max_body_readers",
        "max_body_readers_per_client",
        "arrival_hold_timeout",
        "offload_threads",
        "state_store",
        "state_dir",
        "state_ttl",
        "state_max_bytes",
        "responses_store_default",
        "max_file_bytes",
        "batch_max_lines",
        "batch_max_bytes",
        "batch_max_active",
        "batch_concurrency",
        "batch_lease_timeout",
    }
)
#: flags a configuration file replaces: given on the command line with --config, they are an error
PER_MODEL_ONLY = (
    "served_model_name",
    "model_path",
    "model_alias",
    "worker",
    "prefill_worker",
    "decode_worker",
)
TOP_LEVEL_KEYS = frozenset({"models", "keys", "keys_file"})


class ConfigFileError(ValueError):
    """The configuration file is missing, not YAML, or has a value that does not fit."""


@dataclass(frozen=True, slots=True)
class Fleet:
    """What a server serves: its models' resolved configurations (first: the default model) and
    its API keys (None: no key needed, or the plain ``--api-key`` keys of ``models[0]``)."""

    models: tuple[ServerConfig, ...]
    tenants: TenantTable | None = None
    #: the file it was read from (None: the command line); SIGHUP reads it again
    path: str | None = None


def fleet_from_args(args: argparse.Namespace, actions: Mapping[str, argparse.Action]) -> Fleet:
    """The fleet ``serve``'s flags describe: ``--config FILE`` read, or the one model of the flags.

    ``actions`` maps each ``serve`` flag's dest to its argparse action (to check file values as
    the flag would). Raises ``ConfigFileError`` / ``ValueError`` naming what is wrong.
    """
    path = getattr(args, "config", None)
    if path:
        return load_fleet(path, args, actions)
    config = ServerConfig.from_args(args, sim_aliases=True)
    keys_files = [Path(args.keys_file)] if getattr(args, "keys_file", None) else []
    return Fleet((config,), _tenants(None, keys_files, config.server.accepted_api_keys))


def load_fleet(path: str, args: argparse.Namespace, actions: Mapping[str, argparse.Action]) -> Fleet:
    """Read the configuration file at ``path`` over the command line's ``args``."""
    import yaml

    given = [f"--{dest.replace('_', '-')}" for dest in PER_MODEL_ONLY if getattr(args, dest, None)]
    if given:
        raise ConfigFileError(
            f"{', '.join(given)}: set per model in the configuration file {path}, not with --config"
        )
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(f"cannot read the configuration file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a mapping with a 'models' list, got {type(data).__name__}")
    unknown = sorted(set(data) - TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigFileError(
            f"{path}: unknown key {unknown[0]!r} (expected {', '.join(sorted(TOP_LEVEL_KEYS))})"
        )
    entries = data.get("models")
    if not isinstance(entries, list) or not entries:
        raise ConfigFileError(f"{path}: 'models' must be a non-empty list of model entries")
    models = tuple(
        _model_config(entry, f"models[{i}]", args, actions, path) for i, entry in enumerate(entries)
    )
    _check_names(models, path)
    keys_files = []
    in_file = data.get("keys_file")
    if in_file is not None:
        if not isinstance(in_file, str) or not in_file:
            raise ConfigFileError(f"{path}: keys_file must be a path, got {in_file!r}")
        keys_files.append(Path(path).parent / in_file)  # relative to the configuration file
    if getattr(args, "keys_file", None):
        keys_files.append(Path(args.keys_file))  # relative to the working directory, as any flag
    plain_keys = models[0].server.accepted_api_keys
    tenants = _tenants(data.get("keys"), keys_files, plain_keys, where=f"{path}: keys")
    served = {m.model.served_model_name for m in models}
    for tenant in tenants or ():
        for name in sorted((tenant.models or frozenset()) - served):
            raise ConfigFileError(
                f"{path}: key {tenant.name!r} names the model {name!r}, which no entry serves"
            )
    return Fleet(models, tenants, path)


def _model_config(
    entry: object, where: str, args: argparse.Namespace, actions: Mapping[str, argparse.Action], path: str
) -> ServerConfig:
    if not isinstance(entry, dict):
        raise ConfigFileError(f"{path}: {where}: expected a mapping, got {type(entry).__name__}")
    if not isinstance(entry.get("name"), str) or not entry["name"]:
        raise ConfigFileError(f"{path}: {where}.name: every model needs its served name")
    ns = copy.copy(args)
    for dest in PER_MODEL_ONLY:
        setattr(
            ns,
            dest,
            [] if isinstance(actions[dest], argparse._AppendAction | argparse._ExtendAction) else None,
        )
    for key, value in entry.items():
        dest = ENTRY_KEY_DEST.get(key, key)
        action = actions.get(dest) if isinstance(key, str) else None
        if action is None or dest in SERVER_DESTS:
            why = (
                "is set for the whole server on the command line"
                if action is not None
                else "is not a serve flag"
            )
            raise ConfigFileError(f"{path}: {where}.{key}: {why}")
        setattr(ns, dest, _flag_value(value, action, f"{where}.{key}", path))
    try:
        return ServerConfig.from_args(ns)
    except ValueError as exc:
        raise ConfigFileError(f"{path}: {where} ({entry['name']}): {exc}") from None


def _flag_value(value: Any, action: argparse.Action, where: str, path: str) -> Any:
    """``value`` from the file, converted and checked as ``action``'s flag converts and checks it."""
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        if not isinstance(value, bool):
            raise ConfigFileError(f"{path}: {where}: expected true or false, got {value!r}")
        return value
    if isinstance(action, argparse._AppendAction | argparse._ExtendAction):
        items = value if isinstance(value, list) else [value]
        return [_scalar(item, action, f"{where}[{i}]", path) for i, item in enumerate(items)]
    return _scalar(value, action, where, path)


def _scalar(value: Any, action: argparse.Action, where: str, path: str) -> Any:
    if value is None:
        return None
    if isinstance(value, list | dict):
        raise ConfigFileError(f"{path}: {where}: expected a single value, got a {type(value).__name__}")
    if isinstance(value, bool):
        value = "on" if value else "off"  # a yes/no flag spelled as a YAML boolean
    text = str(value)
    converted: Any = text
    if callable(action.type):
        try:
            converted = action.type(text)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise ConfigFileError(f"{path}: {where}: {exc or 'invalid value'} ({value!r})") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ConfigFileError(f"{path}: {where}: {value!r} is not one of {choices}")
    return converted


def _check_names(models: tuple[ServerConfig, ...], path: str) -> None:
    """Each name answers for one model: served names and exact aliases are unique across models."""
    owner: dict[str, int] = {}
    for i, model in enumerate(models):
        for name in model.model.listed_model_names():
            other = owner.setdefault(name, i)
            if other != i:
                raise ConfigFileError(
                    f"{path}: models[{i}]: the name {name!r} is already answered by models[{other}] "
                    f"({models[other].model.served_model_name})"
                )


def _tenants(
    entries: object, keys_files: list[Path], plain_keys: tuple[str, ...], where: str = "keys"
) -> TenantTable | None:
    """The API keys: the configuration's ``keys``, the keys files' and the plain ``--api-key`` keys
    (None: none at all)."""
    tables: list[TenantTable] = []
    if entries is not None:
        tables.append(TenantTable.from_entries(entries, where=where))
    for file in keys_files:
        tables.append(load_keys_file(file))
    if plain_keys:
        tables.append(TenantTable.from_plain_keys(plain_keys))
    if not tables:
        return None
    # one table: a name or a key given twice across the sources is an error naming it
    return TenantTable([tenant for table in tables for tenant in table])
