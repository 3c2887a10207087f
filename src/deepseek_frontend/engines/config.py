"""What serves a model, as configured: the engine kind, its workers and how the pool treats them.

:class:`EngineConfig` is the ``engine`` part of a served model's configuration
(``fleet/config.py``'s ``ServerConfig.engine``, from the ``serve`` flags of the same names). A worker
pool is built from it whole (:func:`~deepseek_frontend.engines.pool.pool_from_config`), and the
in-process simulated engine from its :class:`SimConfig` (``SimulatedEngine.from_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from deepseek_frontend.engines.upkeep import HEALTH_INTERVAL_S, HEALTH_TIMEOUT_S

__all__ = ["DEFAULT_MAX_RETRIES", "EngineConfig", "EngineKind", "SimConfig"]

EngineKind = Literal["sglang", "vllm", "sim"]
#: workers a request may be retried on after the first failed before its first token
DEFAULT_MAX_RETRIES = 2


@dataclass(frozen=True, slots=True)
class SimConfig:
    """The in-process simulated engine's settings (``--sim-*`` flags)."""

    #: milliseconds before the first chunk, and between chunks
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    #: tokens per chunk
    tokens_per_chunk: int = 1
    #: the behaviour preset (engines/sim/behavior.py ``PRESETS``): what a real engine would refuse
    behave: str = "ideal"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine that serves a model (see module docstring)."""

    #: the workers' protocol, or ``sim`` for the in-process simulated engine
    kind: EngineKind = "sim"
    #: aggregated workers (``--worker``): ``http://host:port`` or ``dns+http://host:port``
    workers: tuple[str, ...] = ()
    #: the ``model`` field of requests to vLLM workers (their --served-model-name); None: the served name
    worker_model: str | None = None
    #: whether vLLM workers get the DSML tool grammar (``--[no-]vllm-grammar``); None: yes (the default)
    vllm_grammar: bool | None = None
    #: seconds between health checks of every worker
    health_check_interval: float = HEALTH_INTERVAL_S
    #: seconds one health probe or capability discovery may take (above SGLang's 20 s health wait)
    health_check_timeout: float = HEALTH_TIMEOUT_S
    #: other workers a request may try after a failure before its first token
    max_retries: int = DEFAULT_MAX_RETRIES
    #: times a response broken mid-stream continues on another worker (``--migration-limit``)
    migration_limit: int = 0
    #: the simulated engine's settings (``kind == "sim"``)
    sim: SimConfig = field(default_factory=SimConfig)

    @property
    def uses_builtin_sim(self) -> bool:
        """True when the in-process simulated engine serves requests."""
        return self.kind == "sim"
