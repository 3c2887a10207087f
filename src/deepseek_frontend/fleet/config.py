"""Server configuration: one frozen value per served model, built from the ``serve`` flags.

Everything the server needs to know at startup lives here, resolved once: the model family
(detected from the checkpoint path or served name), the context length (``config.json``
``max_position_embeddings`` when present), the engine wiring and the model names requests may use.
What the checkpoint says is read once, by ``formats.read_checkpoint``; what each family defaults to
is ``formats/detect.py``'s.

A :class:`ServerConfig` is a composition of parts, each handed whole to the component it
configures (the server's composition root, ``server/compose.py``, does the handing): the model
(:class:`ModelConfig`), the server-wide options (:class:`ServerOptions`), the engine
(``engines.config.EngineConfig``), the router (``routing.router.RouterConfig``), prefill/decode
disaggregation (``disagg.parts.PdDeployment``) and the limits (:class:`ServingLimits`).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from deepseek_frontend.disagg.parts import PdConfig, PdDeployment
from deepseek_frontend.engines.config import EngineConfig, SimConfig
from deepseek_frontend.errors import ModelNotFoundError, UnsupportedModelError
from deepseek_frontend.formats.detect import DEFAULT_CONTEXT_LENGTH, FAMILY_DISPLAY_NAME
from deepseek_frontend.images import ImageOptions
from deepseek_frontend.pipeline.chat import (
    OFFLOAD_MIN_CHARS,
    OFFLOAD_PREPARE_CHARS,
    OFFLOAD_THREADS,
    STREAM_YIELD_MS,
)
from deepseek_frontend.routing.router import RouterConfig
from deepseek_frontend.tokenization import CACHE_IDLE_SECONDS, PREFIX_CACHE_BYTES, RUN_CACHE_BYTES

from .batch_config import BatchOptions, batch_options_from_args
from .routing_flags import router_config_from_args
from .store_config import StateOptions, state_options_from_args

__all__ = [
    "API_KEY_ENV",
    "SIM_MODEL_ALIASES",
    "ModelAlias",
    "ModelConfig",
    "ServerConfig",
    "ServerOptions",
    "ServingLimits",
    "parse_model_alias",
    "unknown_model_error",
]

#: Environment variable read when --api-key is not given.
API_KEY_ENV = "DEEPSEEK_FRONTEND_API_KEY"
#: The names ``serve`` answers by default when the built-in simulated engine serves its one model
#: and no ``--model-alias`` is given: agent CLIs and SDK examples send their vendor's model names
#: (Claude Code ``claude-sonnet-...``, OpenAI examples ``gpt-...``), and a zero-configuration
#: development server should answer them. Real workers get none by default: there a name a client
#: sends for another vendor's model is more likely a mistake, which deserves the 404 that lists
#: the served names, than a request meant for DeepSeek.
SIM_MODEL_ALIASES = ("claude-*", "gpt-*")


@dataclass(frozen=True, slots=True)
class ModelAlias:
    """A model name (or glob pattern such as ``claude-*``) accepted besides the served name."""

    pattern: str
    target: str

    @property
    def is_glob(self) -> bool:
        """Whether the pattern matches many names (``claude-*``) rather than being one name."""
        return any(c in self.pattern for c in "*?[")

    def matches(self, name: str) -> bool:
        if self.is_glob:
            return fnmatch.fnmatchcase(name, self.pattern)
        return name == self.pattern


@dataclass(frozen=True, slots=True)
class ServingLimits:
    """What one client or one worker may cost the server (``serve`` flags of the "limits" group).

    Defaults are sized for DeepSeek's long prompts: a 1M-token prefill takes minutes before the
    first token, decode steps take milliseconds. A timeout of 0 turns it off.
    """

    #: requests served at once (admission control); more wait in a queue of ``max_queued_requests``
    max_concurrent_requests: int = 1024
    max_queued_requests: int = 256
    #: seconds a request may wait in that queue before its 429
    queue_timeout: float = 10.0
    #: engine requests one worker runs at once (the engine client's connections are sized to match)
    max_requests_per_worker: int = 1024
    #: seconds from sending a request to a worker to its response headers (sent before the prefill)
    worker_response_timeout: float = 10.0
    #: seconds from sending a request to a worker to its first token
    first_token_timeout: float = 600.0
    #: seconds a started stream may go without a chunk from its worker
    idle_timeout: float = 60.0
    #: seconds one engine request may take in all
    request_timeout: float = 3600.0
    #: seconds a client may take for its request line and headers, and for its body
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    #: open client connections at most (file descriptors)
    max_connections: int = 8192
    #: requests whose body is still arriving, at once and per client address (api/admission.py)
    max_body_readers: int = 512
    max_body_readers_per_client: int = 32
    #: seconds a request that starts like no recent one (a new conversation) may be held while
    #: follow-ups of recent conversations are answered first (api/arrivals.py); 0: none is held
    arrival_hold_timeout: float = 0.05
    #: threads tokenizing long prompts; uncached characters that send a prompt's tokenizing there;
    #: characters that send a whole request's preparation (rendering included) there
    offload_threads: int = OFFLOAD_THREADS
    offload_min_chars: int = OFFLOAD_MIN_CHARS
    offload_prepare_chars: int = OFFLOAD_PREPARE_CHARS
    #: milliseconds a running stream's next chunk may wait for prompt work queued before it (0: never)
    stream_yield_ms: float = STREAM_YIELD_MS

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServingLimits:
        """The limits the parsed flags give (a flag missing from ``args`` keeps its default)."""
        defaults = cls()
        values = {name: getattr(args, name, getattr(defaults, name)) for name in cls.__dataclass_fields__}
        for name, value in values.items():
            # timeouts, the queue and the stream yield may be 0 (off / no queue); counts must be positive
            may_be_zero = name.endswith("timeout") or name in ("max_queued_requests", "stream_yield_ms")
            if value is None or value < 0 or (value == 0 and not may_be_zero):
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value!r}")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """What belongs to the whole server, not to one model (the flags ``config_file.SERVER_DESTS``
    names that are not limits): where it listens, the API keys, the body limit, images, the state
    store, files and batches. With several models every model's configuration carries the command
    line's."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    #: every accepted key (``--api-key`` repeated); empty: ``api_key`` alone. Stored state is kept
    #: per key (fleet/store_config.py), so each key is a tenant of its own
    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = 32 * 1024 * 1024
    #: image limits and the remote image URL policy (images.py)
    images: ImageOptions = field(default_factory=ImageOptions)
    #: the conversation-state store (fleet/store_config.py); built directly: none
    state: StateOptions = field(default_factory=StateOptions)
    #: the Files and Batch APIs: upload and batch limits, the batch runner (fleet/batch_config.py)
    batches: BatchOptions = field(default_factory=BatchOptions)

    @property
    def accepted_api_keys(self) -> tuple[str, ...]:
        """The keys a request may present (none: no auth)."""
        return self.api_keys or ((self.api_key,) if self.api_key else ())


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What is served and how it is spoken to: the model's names, its family and files, the context
    it fits, its defaults for requests that do not say, and its prompt caches' budgets."""

    served_model_name: str
    family: str = "deepseek_v4"
    model_path: str | None = None
    #: the tokenizer.json (or a directory holding it) the model renders with (``--tokenizer``; None:
    #: ``model_path``'s)
    tokenizer_path: str | None = None
    model_aliases: tuple[ModelAlias, ...] = ()
    context_length: int = DEFAULT_CONTEXT_LENGTH
    default_thinking: bool = True
    reasoning_effort_profile: str = "preview"
    #: output limit when a request sets none; None = whatever room the context leaves
    default_max_tokens: int | None = None
    #: what /v1/responses does with hosted tools it cannot run: "drop" (warn) or "reject" (400)
    hosted_tools: str = "drop"
    #: memory budgets of the prompt-id caches and their idle expiry (see tokenization.PromptTokenizer)
    run_cache_bytes: int = RUN_CACHE_BYTES
    prefix_cache_bytes: int = PREFIX_CACHE_BYTES
    cache_idle_seconds: float = CACHE_IDLE_SECONDS

    def resolve_model(self, name: str | None) -> str:
        """The served model a request's ``model`` field names; raises ``ModelNotFoundError``.

        A missing ``model`` means the served model (there is only one).
        """
        if name is None or name == self.served_model_name:
            return self.served_model_name
        for alias in self.model_aliases:
            if alias.matches(name):
                return alias.target
        raise unknown_model_error(name, self.listed_model_names(), self.glob_aliases())

    def glob_aliases(self) -> list[str]:
        """The glob aliases (``claude-*``): answered, not listed."""
        return [alias.pattern for alias in self.model_aliases if alias.is_glob]

    def listed_model_names(self) -> list[str]:
        """The names ``GET /v1/models`` lists: the served name, then every exact (non-glob) alias in flag
        order. A glob such as ``claude-*`` is a set of names, not one, so it is answered but not listed."""
        names = [self.served_model_name]
        for alias in self.model_aliases:
            if not alias.is_glob and alias.pattern not in names:
                names.append(alias.pattern)
        return names


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One served model's resolved settings, as the parts each component receives whole.

    Build with :meth:`from_args` (or ``config_file.py`` for several models) or directly in tests,
    the model first and every other part by name:

    * ``model`` -- what is served (:class:`ModelConfig`): the tokenizer, the pipeline and the API
      read it;
    * ``server`` -- the server-wide options (:class:`ServerOptions`);
    * ``engine`` -- what serves it (``engines.config.EngineConfig``): a worker pool is built from it;
    * ``router`` -- how a pool chooses among its workers (``routing.router.RouterConfig``);
    * ``pd`` -- prefill/decode disaggregation (``disagg.parts.PdDeployment``: each role's workers
      and the orchestrator's ``PdConfig``); without workers the model is served aggregated;
    * ``limits`` -- what one client or one worker may cost (:class:`ServingLimits`).
    """

    model: ModelConfig
    _: KW_ONLY
    server: ServerOptions = field(default_factory=ServerOptions)
    engine: EngineConfig = field(default_factory=EngineConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    pd: PdDeployment = field(default_factory=PdDeployment)
    #: limits and timeouts (docs/serving.md "Limits and timeouts"); a timeout of 0 is off
    limits: ServingLimits = field(default_factory=ServingLimits)

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, sim_aliases: bool = False) -> ServerConfig:
        """Resolve the ``serve`` flags (see ``serve_command.add_arguments``).

        ``sim_aliases``: the flags are ``serve``'s own command line (not a ``--config`` file's
        model entry), so with the in-process simulated engine and no ``--model-alias`` the model
        also answers :data:`SIM_MODEL_ALIASES`.

        Raises ``UnsupportedModelError`` for a family without an encoder (V4.1) and
        ``ValueError`` for contradictory flags.
        """
        from deepseek_frontend.formats import default_effort_profile, detect_family, read_checkpoint
        from deepseek_frontend.formats.detect import context_length as family_context_length

        model_path: str | None = args.model_path
        served: str | None = args.served_model_name
        tokenizer_path: str | None = getattr(args, "tokenizer", None)
        if tokenizer_path is not None and not (
            Path(tokenizer_path).is_file() or (Path(tokenizer_path) / "tokenizer.json").is_file()
        ):
            raise ValueError(
                f"--tokenizer {tokenizer_path}: expected a tokenizer.json or a directory holding one"
            )
        checkpoint = read_checkpoint(model_path)
        family = getattr(args, "family", None) or detect_family(checkpoint, served)
        if family is None:
            if checkpoint.has_config:
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

        context_length = args.context_length or family_context_length(checkpoint, family)

        workers = tuple(w.rstrip("/") for w in args.worker)
        prefill_workers = tuple(w.rstrip("/") for w in getattr(args, "prefill_worker", None) or ())
        decode_workers = tuple(w.rstrip("/") for w in getattr(args, "decode_worker", None) or ())
        if prefill_workers or decode_workers:
            if not (prefill_workers and decode_workers):
                raise ValueError(
                    "prefill/decode disaggregation needs both --prefill-worker and --decode-worker URLs"
                )
            if workers:
                raise ValueError(
                    "--worker (aggregated workers) cannot be combined with --prefill-worker / "
                    "--decode-worker: a model is served either aggregated or disaggregated"
                )
            if args.engine == "sim":
                raise ValueError(
                    "--engine sim takes no --prefill-worker / --decode-worker; run `deepseek-frontend "
                    "sim-engine --disaggregation-mode prefill|decode` servers and pass --engine sglang"
                )
        engine = args.engine or ("sglang" if workers or prefill_workers else "sim")
        if engine == "sim" and workers:
            raise ValueError(
                "--engine sim runs the simulated engine in-process and takes no --worker; "
                "to use a `deepseek-frontend sim-engine` server pass --engine sglang --worker URL"
            )
        if engine != "sim" and not workers and not prefill_workers:
            raise ValueError(f"--engine {engine} needs at least one --worker URL")
        if getattr(args, "vllm_kv_connector", "nixl") != "nixl" and not (
            engine == "vllm" and prefill_workers
        ):
            raise ValueError(
                "--vllm-kv-connector applies to vLLM prefill/decode workers only (--engine vllm "
                "--prefill-worker ... --decode-worker ...)"
            )
        if (
            family == "deepseek_v41"
            and engine != "sim"
            and not tokenizer_path
            and not (model_path and (Path(model_path) / "tokenizer.json").is_file())
        ):
            # The bundled tokenizer is V4's: it has no <｜System｜> and spells the image token
            # <｜image2｜>. Only the simulated engine may run on the renamed stand-in.
            raise UnsupportedModelError(
                "DeepSeek-V4.1 on real workers needs the checkpoint's own tokenizer: pass "
                "--model-path DIR (a directory with the checkpoint's tokenizer.json) or --tokenizer PATH; "
                "the bundled tokenizer is DeepSeek-V4's and lacks <｜System｜> and <｜deepseek_image｜>"
            )
        profile = args.reasoning_effort_profile or default_effort_profile(checkpoint, served)
        from deepseek_frontend.formats.effort import V41_PROFILES

        if (family == "deepseek_v41") != (profile in V41_PROFILES):
            expected = "release or prerelease" if family == "deepseek_v41" else "preview or official"
            raise ValueError(f"--reasoning-effort-profile {profile}: a {family} checkpoint takes {expected}")

        alias_specs = list(args.model_alias)
        if sim_aliases and not alias_specs and engine == "sim":
            alias_specs = list(SIM_MODEL_ALIASES)
        aliases = tuple(parse_model_alias(a, served) for a in alias_specs)
        keys = args.api_key if isinstance(args.api_key, list) else [args.api_key] if args.api_key else []
        key_file = getattr(args, "api_key_file", None)
        if key_file:
            from deepseek_frontend.keys.tenants import read_api_key_file

            keys = [*keys, *read_api_key_file(key_file)]
        # the environment's key only when no flag gives one
        api_key = keys[0] if keys else os.environ.get(API_KEY_ENV) or None
        # each part in the order its flags were checked before (the first error is the same)
        router = router_config_from_args(args)
        sim = SimConfig(
            ttft_ms=args.sim_ttft_ms,
            itl_ms=args.sim_itl_ms,
            tokens_per_chunk=args.sim_tokens_per_chunk,
            behave=_sim_behave(getattr(args, "sim_behave", "ideal")),
        )
        limits = ServingLimits.from_args(args)
        images = _image_options(args)
        state = state_options_from_args(args)
        batches = batch_options_from_args(args)
        return cls(
            model=ModelConfig(
                served_model_name=served,
                family=family,
                model_path=model_path,
                tokenizer_path=tokenizer_path,
                model_aliases=aliases,
                context_length=context_length,
                default_thinking=args.default_thinking,
                reasoning_effort_profile=profile,
                default_max_tokens=args.default_max_tokens,
                hosted_tools=getattr(args, "hosted_tools", "drop") or "drop",
                run_cache_bytes=args.run_cache_bytes,
                prefix_cache_bytes=args.prefix_cache_bytes,
                cache_idle_seconds=args.cache_idle_seconds,
            ),
            server=ServerOptions(
                host=args.host,
                port=args.port,
                api_key=api_key,
                api_keys=tuple(keys),
                max_body_bytes=args.max_body_bytes,
                images=images,
                state=state,
                batches=batches,
            ),
            engine=EngineConfig(
                kind=engine,
                workers=workers,
                worker_model=getattr(args, "worker_model", None) or model_path or served,
                vllm_grammar=getattr(args, "vllm_grammar", None),
                health_check_interval=args.health_check_interval,
                health_check_timeout=getattr(args, "health_check_timeout", 30.0),
                max_retries=args.max_retries,
                migration_limit=getattr(args, "migration_limit", 0),
                sim=sim,
            ),
            router=router,
            pd=PdDeployment(
                prefill_workers=prefill_workers,
                decode_workers=decode_workers,
                orchestrator=PdConfig(
                    engine="vllm" if engine == "vllm" else "sglang",
                    transfer_timeout_s=getattr(args, "pd_transfer_timeout", 60.0) or None,
                    bootstrap_port=getattr(args, "disaggregation_bootstrap_port", None),
                    kv_connector=getattr(args, "vllm_kv_connector", "nixl"),
                ),
            ),
            limits=limits,
        )


def _image_options(args: argparse.Namespace) -> ImageOptions:
    """The image flags -> :class:`ImageOptions`; raises ValueError for a non-positive limit."""
    defaults = ImageOptions()
    options = ImageOptions(
        max_images_per_request=getattr(args, "max_images_per_request", defaults.max_images_per_request),
        max_image_bytes=getattr(args, "max_image_bytes", defaults.max_image_bytes),
        max_total_image_bytes=getattr(args, "max_total_image_bytes", defaults.max_total_image_bytes),
        url_allow=tuple(getattr(args, "image_url_allow", None) or ()),
        fetch_timeout=getattr(args, "image_fetch_timeout", defaults.fetch_timeout),
    )
    for name in ("max_images_per_request", "max_image_bytes", "max_total_image_bytes", "fetch_timeout"):
        if getattr(options, name) <= 0:
            flag = "image-fetch-timeout" if name == "fetch_timeout" else name.replace("_", "-")
            raise ValueError(f"--{flag} must be positive")
    return options


def _sim_behave(name: str) -> str:
    """``--sim-behave``: a preset name of the simulated engine; raises ValueError for another."""
    from deepseek_frontend.engines.sim.behavior import PRESETS

    if name not in PRESETS:
        raise ValueError(f"--sim-behave {name!r}: expected one of {', '.join(sorted(PRESETS))}")
    return name


def unknown_model_error(name: str, served: list[str], globs: list[str]) -> ModelNotFoundError:
    """The 404 for a ``model`` no served model answers to (or one the API key may not use): it names
    the names the key may use -- ``served``, listed by ``/v1/models``, and ``globs``, answered but not
    listed -- and how to make the server answer another (``--model-alias``, or ``aliases`` in a
    ``--config`` file). Every API words it the same, in its own error shape."""
    if served:
        answered = ", ".join(repr(n) for n in served)
        if globs:
            answered += " and any name matching " + " or ".join(repr(g) for g in globs)
        what = f"this server serves {answered}"
    else:
        what = "this API key may use no model of this server"
    return ModelNotFoundError(
        f"The model {name!r} does not exist: {what}. To answer another name, start serve with "
        "--model-alias NAME (globs allowed: --model-alias 'gpt-*'), or list it under the model's "
        "aliases in the --config file",
        param="model",
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
