"""Engines: token ids in, token-id chunks out.

::

    Engine (base.py)                what serves a model: generate, supports_constraint, capabilities,
    │                               statuses, start, aclose, routers, collectors
    ├── WorkerPool (pool.py)        a Router (routing/) picks workers; per-worker slots and deadlines
    │                               (limits.py), retry and migration (dispatch.py), health checks and
    │                               discovery (upkeep.py), one worker's record (workers.py); built from an
    │                               EngineConfig (config.py) by pool_from_config
    ├── SimulatedEngine (sim/)      in-process, deterministic DSV4 output (sim/: engine.py, rules in model.py)
    └── (DisaggregatedPool)         prefill/decode pairs of pools, one layer up (disagg/)

    EngineClient (base.py)          one worker, as a pool holds it: generate, abort, check_health, discover
    ├── SGLangClient (sglang.py)    POST /generate, token mode, SSE (incremental or cumulative chunks)
    ├── VLLMClient (vllm.py)        POST /inference/v1/generate (token-in, 0.32+), else /v1/completions
    └── SimulatedEngine (sim/)      also a worker (the ``sim-engine`` server, pools in tests)

The two HTTP clients share ``_http.py`` (connection pool, SSE reading, failure mapping,
health probe). ``sim/server.py`` serves a SimulatedEngine over SGLang's HTTP protocol and
``sim/command.py`` is the ``deepseek-frontend sim-engine`` command. Failures follow
the tree in :mod:`deepseek_frontend.errors`: ``EngineUnavailableError`` before the first
chunk (retryable), ``EngineStreamError`` after it, ``EngineRejectedRequestError`` (a
``RequestError``: not retried, the worker's health untouched) when the worker refuses the request.
Each client reports what its worker can serve through ``discover()`` (``WorkerCapabilities``).
"""

from deepseek_frontend.engines._http import new_http_client
from deepseek_frontend.engines.base import Engine, EngineClient
from deepseek_frontend.engines.config import EngineConfig, SimConfig
from deepseek_frontend.engines.pool import WorkerPool, from_urls, pool_from_config
from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.engines.sim.engine import SimulatedEngine, load_sim_tokenizer
from deepseek_frontend.engines.vllm import VLLMClient
from deepseek_frontend.generation import (
    ConstraintKind,
    DecodingConstraint,
    EngineChunk,
    EngineFinishReason,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
    WorkerCapabilities,
    WorkerStatus,
)

__all__ = [
    "ConstraintKind",
    "DecodingConstraint",
    "Engine",
    "EngineChunk",
    "EngineClient",
    "EngineConfig",
    "EngineFinishReason",
    "GenerateRequest",
    "SGLangClient",
    "SamplingParams",
    "SimConfig",
    "SimulatedEngine",
    "TokenLogprob",
    "VLLMClient",
    "WorkerCapabilities",
    "WorkerPool",
    "WorkerStatus",
    "from_urls",
    "load_sim_tokenizer",
    "new_http_client",
    "pool_from_config",
]
