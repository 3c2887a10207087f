"""vLLM's MooncakeConnector, as smg drives it (disagg/pool.py runs the legs).

MooncakeConnector (vLLM 0.32/0.33 ``distributed/kv_transfer/kv_connector/v1/mooncake/``) returns no
``kv_transfer_params`` from the prefill: the router mints the transfer and builds the decode's
params itself (smg ``model_gateway/src/routers/grpc/common/stages/request_execution.rs``
``mooncake_prefill_params`` / ``mooncake_decode_params``; vLLM's example proxy does the same):

* a ``transfer_id`` ``"xfer-<uuid>"`` per pair;
* the prefill leg: ``{"do_remote_decode": true, "do_remote_prefill": false, "transfer_id"}``; a
  prefill without ``transfer_id`` keeps no KV, and one that finishes otherwise than by length frees
  it (``request_finished``), so the leg's sampling cannot stop on EOS or a stop id
  (``engines/vllm.py`` ``prefill_sampling``);
* the decode leg: ``{"do_remote_prefill": true, "do_remote_decode": false, "transfer_id",
  "remote_engine_id", "remote_bootstrap_addr": "http://HOST:PORT"}``: the decode asks the prefill
  worker's bootstrap server (``HOST:PORT``, ``VLLM_MOONCAKE_BOOTSTRAP_PORT``, 8998 by default) for the
  engine and pulls the KV by ``transfer_id``. The engine id is the one the bootstrap server's
  ``/query`` lists for the prefill's data-parallel rank (``{engine_id}_dp{rank}`` with DP), so a
  prefill worker with several ranks gets the leg pinned to one (``X-data-parallel-rank``).

The legs run one after the other, as smg runs them: the decode is sent once the prefill answered.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from deepseek_frontend.engines.pool import WorkerPool
from deepseek_frontend.engines.vllm import VLLMClient
from deepseek_frontend.errors import EngineUnavailableError
from deepseek_frontend.generation import GenerateRequest

from .parts import DEFAULT_BOOTSTRAP_PORT, PdConfig

__all__ = ["MooncakeEngines", "MooncakePair"]


@dataclass(frozen=True, slots=True)
class MooncakePair:
    """One pair's Mooncake settings: the prefill leg's params and headers, the decode leg's params."""

    prefill_params: dict[str, Any]
    headers: dict[str, str]
    decode_params: dict[str, Any]


class MooncakeEngines:
    """The engine ids of each prefill worker's ranks (its bootstrap server's ``/query``), read once
    per worker and read again after a pair on it failed (a restarted vLLM has new ids)."""

    def __init__(self) -> None:
        self._engines: dict[str, dict[int, str]] = {}
        self._turn = itertools.count()

    def forget(self, url: str) -> None:
        self._engines.pop(url, None)

    async def pair(
        self, prefill: WorkerPool, config: PdConfig, url: str, request: GenerateRequest
    ) -> MooncakePair:
        """The params of a new pair with prefill worker ``url``; ``EngineUnavailableError`` when its
        bootstrap server cannot be read."""
        port = bootstrap_port(prefill, config, url)
        engines = self._engines.get(url)
        if engines is None:
            found = prefill.client_of(url)
            if found is None or not isinstance(found[0], VLLMClient):
                raise EngineUnavailableError(f"{url}: not a vLLM worker")
            engines = self._engines[url] = await found[0].mooncake_engines(port)
        ranks = sorted(engines)
        headers: dict[str, str] = {}
        rank = ranks[0]
        if len(ranks) > 1:
            router = prefill.router
            best = router.best_rank(url, request) if router is not None else None
            rank = best if best in engines else ranks[next(self._turn) % len(ranks)]
            headers["X-data-parallel-rank"] = str(rank)
        transfer_id = f"xfer-{uuid.uuid4()}"
        host = urlsplit(url).hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        return MooncakePair(
            {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id},
            headers,
            {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "transfer_id": transfer_id,
                "remote_engine_id": engines[rank],
                "remote_bootstrap_addr": f"http://{netloc}:{port}",
            },
        )


def bootstrap_port(prefill: WorkerPool, config: PdConfig, url: str) -> int:
    """The Mooncake bootstrap port of prefill worker ``url``: ``--disaggregation-bootstrap-port``,
    else what the worker reports (``VLLM_MOONCAKE_BOOTSTRAP_PORT`` in a dev-mode ``/server_info``),
    else vLLM's default, 8998."""
    if config.bootstrap_port is not None:
        return config.bootstrap_port
    found = prefill.client_of(url)
    caps = found[1] if found is not None else None
    port = caps.extra.get("mooncake_bootstrap_port") if caps is not None else None
    return port if isinstance(port, int) and port > 0 else DEFAULT_BOOTSTRAP_PORT
