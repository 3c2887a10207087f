"""The two legs of a prefill/decode pair (disagg/pool.py): the legs' requests (SGLang's bootstrap
fields and DP rank hints) and the runs of the prefill leg (SGLang streamed, vLLM unstreamed; vLLM's
MooncakeConnector params are disagg/mooncake.py's)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any
from urllib.parse import urlsplit

from deepseek_frontend.engines.limits import Slot
from deepseek_frontend.engines.pool import WorkerPool
from deepseek_frontend.engines.vllm import VLLMClient
from deepseek_frontend.errors import EngineTimeoutError, EngineUnavailableError
from deepseek_frontend.generation import EngineChunk, GenerateRequest

from .parts import DEFAULT_BOOTSTRAP_PORT, PdConfig

__all__ = ["VLLM_PREFILL_PARAMS", "bootstrap_port", "sglang_legs", "sglang_prefill", "vllm_prefill"]

#: the ``kv_transfer_params`` of vLLM's prefill request (NixlConnector's sequential flow)
VLLM_PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def bootstrap_port(prefill: WorkerPool, config: PdConfig, url: str) -> int:
    """The bootstrap port of prefill worker ``url``: the override, else what its ``/server_info``
    reports, else SGLang's default."""
    if config.bootstrap_port is not None:
        return config.bootstrap_port
    found = prefill.client_of(url)
    caps = found[1] if found is not None else None
    port = caps.extra.get("disaggregation_bootstrap_port") if caps is not None else None
    return (
        port if isinstance(port, int) and not isinstance(port, bool) and port > 0 else DEFAULT_BOOTSTRAP_PORT
    )


def sglang_legs(
    prefill: WorkerPool,
    decode: WorkerPool,
    config: PdConfig,
    request: GenerateRequest,
    prefill_url: str,
    decode_url: str,
    room: int,
) -> tuple[GenerateRequest, GenerateRequest]:
    """The two legs' requests: the same body plus the bootstrap trio and DP rank hints.

    Rank hints (SGLang 0.5.23, engine-facts C2) when a role's router places requests on ranks (kv
    modes, a worker with several DP ranks): the prefill leg carries ``routed_dp_rank`` = the prefill
    rank and ``disagg_prefill_dp_rank`` = the same rank -- without the latter the prefill's
    ``follow_bootstrap_room`` check fails the room whenever ``routed_dp_rank != bootstrap_room % N``
    (``disaggregation/common/conn.py:2109-2183``); the decode leg carries ``disagg_prefill_dp_rank``
    = the prefill rank (where its KV is) and ``routed_dp_rank`` = the decode router's rank. Without
    a prefill rank neither leg names one and SGLang derives it from the room on both sides.
    """
    common: dict[str, Any] = {
        "bootstrap_host": urlsplit(prefill_url).hostname or "",
        "bootstrap_port": bootstrap_port(prefill, config, prefill_url),
        "bootstrap_room": room,
    }
    prefill_fields, decode_fields = dict(common), common
    p_router, d_router = prefill.router, decode.router
    p_rank = p_router.rank_for(prefill_url, request) if p_router is not None else None
    if p_rank is not None:
        prefill_fields["routed_dp_rank"] = p_rank
        prefill_fields["disagg_prefill_dp_rank"] = p_rank
        decode_fields["disagg_prefill_dp_rank"] = p_rank
    d_rank = d_router.rank_for(decode_url, request) if d_router is not None else None
    if d_rank is not None:
        decode_fields["routed_dp_rank"] = d_rank
    return (
        dataclasses.replace(request, extra_fields=prefill_fields),
        dataclasses.replace(request, extra_fields=decode_fields),
    )


async def sglang_prefill(
    prefill: WorkerPool, url: str, request: GenerateRequest, slot: Slot | None = None
) -> float:
    """Run the SGLang prefill leg on ``url`` (in ``slot``, held for it) to its end; the loop time it
    ended. Raises on a bad answer (an answer that is missing or an abort)."""
    stream = prefill.generate_on(url, request, slot)
    last: EngineChunk | None = None
    try:
        async for chunk in stream:
            last = chunk
            if chunk.finish_reason is not None:
                break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    if last is None or last.finish_reason is None:
        raise EngineUnavailableError(f"{url}: the prefill leg ended without an answer")
    if last.finish_reason == "abort":
        raise EngineUnavailableError(
            f"{url}: the prefill leg was aborted: {last.message or 'no reason given'}"
        )
    return asyncio.get_running_loop().time()


async def vllm_prefill(
    prefill: WorkerPool,
    url: str,
    request: GenerateRequest,
    slot: Slot | None = None,
    *,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run vLLM's unstreamed prefill leg on ``url``; the answer's ``kv_transfer_params``.

    ``params``: the leg's ``kv_transfer_params`` (None: NixlConnector's, :data:`VLLM_PREFILL_PARAMS`,
    whose answer must carry the decode's; given: MooncakeConnector's, disagg/mooncake.py, whose
    answer carries none). The leg holds a slot of the prefill pool while it runs (``slot``, or one
    ``WorkerPool.occupy`` waits for: in flight, the router's load, the worker's health) and is bounded
    by the pool's first-token deadline (the prefill is the wait for the first token): past it,
    ``EngineTimeoutError`` (504).
    """
    limit = prefill.limits.first_token_timeout_s
    sent = dict(params if params is not None else VLLM_PREFILL_PARAMS)
    leg = dataclasses.replace(request, extra_fields={"kv_transfer_params": sent})
    async with prefill.occupy(url, request, slot) as client:
        if not isinstance(client, VLLMClient):
            raise EngineUnavailableError(f"{url}: not a vLLM worker")
        try:
            async with asyncio.timeout(limit):
                params = await client.remote_prefill(leg, returns_params=params is None, headers=headers)
        except TimeoutError:
            raise EngineTimeoutError(
                f"the prefill worker did not answer within {limit:g} s; the request was aborted"
            ) from None
    return dict(params)
