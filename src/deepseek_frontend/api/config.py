"""Server configuration: one frozen value built from the ``serve`` flags.

Everything the server needs to know at startup lives here, resolved once:
the model family (detected from the checkpoint path or served name), the
context length (``config.json`` ``max_position_embeddings`` when present), the
engine wiring and the model names requests may use.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from deepseek_frontend.errors import ModelNotFoundError, UnsupportedModelError

EngineKind = Literal["sglang", "vllm", "sim"]

#: Context window used when the checkpoint does not say (DeepSeek-V4: 1M tokens).
DEFAULT_CONTEXT_LENGTH = 1_048_576
#: Per-family fallbacks when no config.json is available.
FAMILY_CONTEXT_LENGTH = {"deepseek_v4": 1_048_576, "deepseek_v32": 163_840}
#: Name served when neither --served-model-name nor --model-path gives one.
FAMILY_DISPLAY_NAME = {"deepseek_v4": "deepseek-v4-flash", "deepseek_v32": "deepseek-v3.2"}
#: Environment variable read when --api-key is not given.
API_KEY_ENV = "DEEPSEEK_FRONTEND_API_KEY"


@dataclass(frozen=True, slots=True)
class ModelAlias:
    """A model name (or glob pattern such as ``claude-*``) accepted besides the served name."""

    pattern: str
    target: str

    def matches(self, name: str) -> bool:
        if any(c in self.pattern for c in "*?["):
            return fnmatch.fnmatchcase(name, self.pattern)
        return name == self.pattern


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Resolved server settings. Build with :meth:`from_args` or directly in tests."""

    served_model_name: str
    family: str = "deepseek_v4"
    model_path: str | None = None
    engine: EngineKind = "sim"
    workers: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    default_thinking: bool = True
    reasoning_effort_profile: str = "preview"
    api_key: str | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    context_length: int = DEFAULT_CONTEXT_LENGTH
    #: output limit when a request sets none; None = whatever room the context leaves
    default_max_tokens: int | None = None
    model_aliases: tuple[ModelAlias, ...] = ()
    #: the ``model`` field of requests to vLLM workers (their --served-model-name)
    worker_model: str | None = None
    #: vLLM workers accept the DSML tool grammar (``--vllm-grammar``)
    vllm_grammar: bool = False
    health_check_interval: float = 5.0
    max_retries: int = 2
    sim_ttft_ms: float = 0.0
    sim_itl_ms: float = 0.0
    sim_tokens_per_chunk: int = 1
    extra: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def uses_builtin_sim(self) -> bool:
        """True when the in-process simulated engine serves requests."""
        return self.engine == "sim"

    def resolve_model(self, name: str | None) -> str:
        """The served model a request's ``model`` field names; raises ``ModelNotFoundError``.

        A missing ``model`` means the served model (there is only one).
        """
        if name is None or name == self.served_model_name:
            return self.served_model_name
        for alias in self.model_aliases:
            if alias.matches(name):
                return alias.target
        raise ModelNotFoundError(
            f"The model {name!r} does not exist; this server serves {self.served_model_name!r}",
            param="model",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerConfig:
        """Resolve the ``serve`` flags (see ``serve_command.add_arguments``).

        Raises ``UnsupportedModelError`` for a family without an encoder (V4.1) and
        ``ValueError`` for contradictory flags.
        """
        from deepseek_frontend.formats import default_effort_profile, detect_family

        model_path: str | None = args.model_path
        served: str | None = args.served_model_name
        family = detect_family(model_path, served)
        if family == "deepseek_v41":
            raise UnsupportedModelError(
                "DeepSeek-V4.1 was detected but this frontend has no V4.1 prompt encoder yet; "
                "serve a V4 or V3.2 checkpoint (or pass --served-model-name to override detection)"
            )
        if family is None:
            if model_path and (Path(model_path) / "config.json").is_file():
                # The checkpoint says what it is, and it is not a family this frontend renders.
                raise UnsupportedModelError(
                    f"{model_path}/config.json does not describe a DeepSeek-V4 or V3.2 model; "
                    "this frontend renders only DeepSeek chat formats"
                )
            # Nothing known (no config.json, a served name we do not recognise): the bundled
            # tokenizer and format are DeepSeek-V4's.
            family = "deepseek_v4"
        if served is None:
            if model_path:
                served = Path(model_path).resolve().name
            else:
                served = FAMILY_DISPLAY_NAME.get(family, family)

        context_length = args.context_length or _context_length_from_checkpoint(model_path)
        if context_length is None:
            context_length = FAMILY_CONTEXT_LENGTH.get(family, DEFAULT_CONTEXT_LENGTH)

        workers = tuple(w.rstrip("/") for w in args.worker)
        engine = args.engine or ("sglang" if workers else "sim")
        if engine == "sim" and workers:
            raise ValueError(
                "--engine sim runs the simulated engine in-process and takes no --worker; "
                "to use a `deepseek-frontend sim-engine` server pass --engine sglang --worker URL"
            )
        if engine != "sim" and not workers:
            raise ValueError(f"--engine {engine} needs at least one --worker URL")

        aliases = tuple(parse_model_alias(a, served) for a in args.model_alias)
        api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
        return cls(
            served_model_name=served,
            family=family,
            model_path=model_path,
            engine=engine,
            workers=workers,
            host=args.host,
            port=args.port,
            default_thinking=args.default_thinking,
            reasoning_effort_profile=args.reasoning_effort_profile
            or default_effort_profile(model_path, args.served_model_name),
            api_key=api_key,
            max_body_bytes=args.max_body_bytes,
            context_length=context_length,
            default_max_tokens=args.default_max_tokens,
            model_aliases=aliases,
            worker_model=getattr(args, "worker_model", None) or model_path or served,
            vllm_grammar=bool(getattr(args, "vllm_grammar", False)),
            health_check_interval=args.health_check_interval,
            max_retries=args.max_retries,
            sim_ttft_ms=args.sim_ttft_ms,
            sim_itl_ms=args.sim_itl_ms,
            sim_tokens_per_chunk=args.sim_tokens_per_chunk,
        )


def parse_model_alias(spec: str, served_model_name: str) -> ModelAlias:
    """``NAME`` or ``NAME=SERVED`` (SERVED must be the served model) -> :class:`ModelAlias`."""
    name, sep, target = spec.partition("=")
    name = name.strip()
    target = target.strip() if sep else served_model_name
    if not name:
        raise ValueError(f"--model-alias {spec!r}: empty name")
    if target != served_model_name:
        raise ValueError(
            f"--model-alias {spec!r}: this server serves only {served_model_name!r}, "
            f"cannot alias to {target!r}"
        )
    return ModelAlias(name, target)


def _context_length_from_checkpoint(model_path: str | None) -> int | None:
    if not model_path:
        return None
    path = Path(model_path) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = data.get("max_position_embeddings") if isinstance(data, dict) else None
    return value if isinstance(value, int) and value > 0 else None
