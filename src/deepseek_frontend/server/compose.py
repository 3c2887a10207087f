"""The composition root: what a served model is made of, built from its typed configuration.

Which tokenizer (the checkpoint's, the bundled one, the V4.1 stand-in), which engine (the in-process
simulated engine, a worker pool, or a prefill/decode pair of pools), which router, and the
pipeline's settings are decided here and nowhere else. Each component receives its part of the
:class:`~deepseek_frontend.fleet.config.ServerConfig` whole: a pool its ``EngineConfig`` and the
:class:`StreamLimits` the server's limits give, a router its ``RouterConfig``, the prefill/decode
orchestrator its ``PdConfig`` and its two pools, the simulated engine its ``SimConfig``, the
pipeline a :class:`PipelineConfig`. :class:`~deepseek_frontend.fleet.served_model.ServedModel`
receives the tokenizer, engine and pipeline built and imports nothing of this.

``server/app.py`` builds the served models with :func:`build_models`, ``server/reload.py`` the models
a reload brings with :func:`build_model`. Tests and benchmarks may hand :func:`build_model` a
tokenizer and an engine of their own (any :class:`~deepseek_frontend.engines.base.Engine`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from deepseek_frontend.disagg.pool import DisaggregatedPool
from deepseek_frontend.engines.base import Engine
from deepseek_frontend.engines.config import EngineConfig
from deepseek_frontend.engines.pool import StreamLimits, WorkerPool, pool_from_config
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.upkeep import aggregated_role_refusal
from deepseek_frontend.errors import StartupError
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServingLimits
from deepseek_frontend.fleet.metrics import FrontendMetrics
from deepseek_frontend.fleet.registry import ModelRegistry
from deepseek_frontend.fleet.served_model import ServedModel
from deepseek_frontend.pipeline.chat import ChatPipeline, PipelineConfig
from deepseek_frontend.routing.router import Router
from deepseek_frontend.tokenization import PromptTokenizer, has_own_tokenizer, load_for_family

__all__ = [
    "build_engine",
    "build_model",
    "build_models",
    "load_tokenizer",
    "pipeline_config",
    "stream_limits",
]

log = logging.getLogger("deepseek_frontend.api")


def load_tokenizer(model: ModelConfig) -> PromptTokenizer:
    """The tokenizer ``model`` renders with (``tokenization.load_for_family``), with its caches'
    budgets. The V4.1 stand-in (a V4.1 model without a checkpoint: simulated engine only,
    ``ServerConfig.from_args`` refuses real workers) is logged. A tokenizer that does not load is a
    ``StartupError`` naming the flag that chose it."""
    source = model.tokenizer_path or model.model_path
    if model.family == "deepseek_v41" and not has_own_tokenizer(source):
        log.warning(
            "DeepSeek-V4.1 on the simulated engine: using a stand-in tokenizer derived from the bundled "
            "DeepSeek-V4 tokenizer (ids 128799 and 129264 renamed to <｜System｜> and <｜deepseek_image｜>); "
            "real workers need the checkpoint's tokenizer (--model-path or --tokenizer)"
        )
    try:
        return load_for_family(
            model.family,
            source,
            run_cache_bytes=model.run_cache_bytes,
            prefix_cache_bytes=model.prefix_cache_bytes,
            cache_idle_s=model.cache_idle_seconds,
        )
    except Exception as exc:  # a missing or unreadable tokenizer.json: name the flag that chose it
        flag = f"--tokenizer {model.tokenizer_path}" if model.tokenizer_path else f"--model-path {source}"
        what = (
            f"model {model.served_model_name}: cannot load its tokenizer ({flag})"
            if source
            else (f"model {model.served_model_name}: cannot load the bundled tokenizer")
        )
        raise StartupError.because(what, exc) from exc


def stream_limits(limits: ServingLimits, vocab_size: int | None) -> StreamLimits:
    """What a worker pool bounds per engine request, from the server's ``limits`` (a timeout of 0 is
    none) and the tokenizer's ``vocab_size`` (ids at or past it are the worker's fault)."""
    return StreamLimits(
        max_in_flight_per_worker=limits.max_requests_per_worker,
        # every admitted request may hold an engine stream; n > 1 choices wait for a slot
        max_in_flight=max(limits.max_concurrent_requests, limits.max_requests_per_worker),
        capacity_wait_s=limits.queue_timeout,
        first_token_timeout_s=limits.first_token_timeout or None,
        response_timeout_s=limits.worker_response_timeout or None,
        idle_timeout_s=limits.idle_timeout or None,
        request_timeout_s=limits.request_timeout or None,
        vocab_size=vocab_size,
    )


def build_engine(config: ServerConfig, tokenizer: PromptTokenizer) -> Engine:
    """The engine ``config`` asks for, not started: the simulated engine (``engine.kind == "sim"``),
    a prefill/decode pair of pools (``pd`` has workers), else one pool of ``engine.workers``. Each
    pool has its own router; the server's pool starts without waiting for its workers' discovery
    (the server answers ``/live`` at once; a request meanwhile gets a 503 with ``Retry-After``)."""
    engine = config.engine
    if engine.kind == "sim":
        return SimulatedEngine.from_config(engine.sim, tokenizer)
    # vLLM requests name the model the workers serve: by default, the one this server serves
    engine = dataclasses.replace(engine, worker_model=engine.worker_model or config.model.served_model_name)
    limits = stream_limits(config.limits, tokenizer.vocab_size)
    if config.pd.enabled:
        return _disaggregated(config, engine, limits)
    pool = pool_from_config(engine, limits, Router(config.router), discover_in_background=True)
    # a prefill or decode worker given as --worker stops the start (a role the pool cannot use)
    pool.vet = aggregated_role_refusal
    pool.refuse_at_start = True
    return pool


def _disaggregated(config: ServerConfig, engine: EngineConfig, limits: StreamLimits) -> DisaggregatedPool:
    """A prefill and a decode pool, one router each, under the orchestrator. A leg runs where the pair
    put it (no retry inside a role's pool: the orchestrator retries pairs, and migrates)."""

    def role(workers: tuple[str, ...]) -> WorkerPool:
        settings = dataclasses.replace(engine, workers=workers, max_retries=0, migration_limit=0)
        return pool_from_config(settings, limits, Router(config.router))

    return DisaggregatedPool(
        role(config.pd.prefill_workers),
        role(config.pd.decode_workers),
        config.pd.orchestrator,
        migration_limit=engine.migration_limit,
    )


def pipeline_config(config: ServerConfig) -> PipelineConfig:
    """The pipeline's settings: the model's identity and defaults, the engine's kind, the offload
    limits."""
    model, limits = config.model, config.limits
    return PipelineConfig(
        served_model_name=model.served_model_name,
        family=model.family,
        engine=config.engine.kind,
        context_length=model.context_length,
        reasoning_effort_profile=model.reasoning_effort_profile,
        default_max_tokens=model.default_max_tokens,
        offload_threads=limits.offload_threads,
        offload_min_chars=limits.offload_min_chars,
        offload_prepare_chars=limits.offload_prepare_chars,
        stream_yield_ms=limits.stream_yield_ms,
    )


def build_model(
    config: ServerConfig,
    *,
    tokenizer: PromptTokenizer | None = None,
    engine: Engine | None = None,
    shared_with: ServedModel | None = None,
) -> ServedModel:
    """The served model of ``config``, not started: its tokenizer (``tokenizer``, else loaded), its
    engine (``engine``, else :func:`build_engine`), its metrics and its pipeline. With
    ``shared_with``, the pipeline takes that model's offload threads and loop turns (one process,
    one CPU budget)."""
    if tokenizer is None:
        tokenizer = load_tokenizer(config.model)
    if engine is None:
        engine = build_engine(config, tokenizer)
    metrics = FrontendMetrics()
    shared = shared_with.pipeline if shared_with is not None else None
    pipeline = ChatPipeline(
        pipeline_config(config),
        tokenizer,
        engine,
        metrics,
        offload=shared.offload if shared is not None else None,
        turns=shared.turns if shared is not None else None,
    )
    return ServedModel(config, tokenizer=tokenizer, engine=engine, pipeline=pipeline, metrics=metrics)


def build_models(
    configs: Sequence[ServerConfig],
    *,
    tokenizer: PromptTokenizer | None = None,
    engine: Engine | None = None,
) -> ModelRegistry:
    """The served models of ``configs``, not started. ``tokenizer`` and ``engine`` (tests and
    benchmarks) apply to the first model; every model shares the first one's loop turns and offload
    threads."""
    first = build_model(configs[0], tokenizer=tokenizer, engine=engine)
    return ModelRegistry([first, *(build_model(c, shared_with=first) for c in configs[1:])])
