"""OpenAI's Batch API: ``POST /v1/batches``, ``GET /v1/batches`` (``after``, ``limit`` 1-100),
``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``.

A batch is created ``validating`` from an uploaded ``batch`` file and answered at once; a runner
(``runner.py``, any process or replica) reads the file into lines, runs them and finishes it
(``lifecycle.py``). Limits of the request's API key, checked at creation: the file's lines and
bytes (400, naming ``input_file_id``) and the batches it has unfinished (429).
"""

from __future__ import annotations

import orjson
from starlette.responses import Response
from starlette.routing import Route

from deepseek_frontend.api.stored import json_response, not_stored, path_id, read_page
from deepseek_frontend.api.validation import check_id, check_metadata, check_object, check_string
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.errors import RequestError
from deepseek_frontend.state import StoredBatch, new_id

from .common import (
    ActiveBatchesError,
    batch_limits,
    completion_window_seconds,
    query_limit,
    require_store,
)
from .lines import OPENAI_ENDPOINTS
from .objects import openai_batch
from .upload import MAX_EXPIRY_S, MIN_EXPIRY_S

__all__ = ["ROUTES"]

#: ``limit`` of ``GET /v1/batches``: OpenAI's default and largest page
DEFAULT_PAGE = 20
MAX_PAGE = 100


def _output_ttl(raw: object) -> int | None:
    """``output_expires_after``: seconds the output and error files are kept (None: the store's TTL)."""
    if raw is None:
        return None
    policy = check_object(raw, "output_expires_after")
    if policy.get("anchor") != "created_at":
        raise RequestError(
            f"output_expires_after.anchor: expected 'created_at', got {policy.get('anchor')!r}",
            param="output_expires_after.anchor",
        )
    seconds = policy.get("seconds")
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int)
        or not MIN_EXPIRY_S <= seconds <= MAX_EXPIRY_S
    ):
        raise RequestError(
            f"output_expires_after.seconds: expected {MIN_EXPIRY_S} to {MAX_EXPIRY_S}, got {seconds!r}",
            param="output_expires_after.seconds",
        )
    return seconds


async def _answer(ctx: RequestContext, batch: StoredBatch) -> Response:
    counts = await ctx.store.batch_counts([batch.id])
    return json_response(openai_batch(batch, counts[batch.id]))


@api_route("/v1/batches", prefix="batch", generates=False)
async def create_batch(ctx: RequestContext) -> Response:
    """``POST /v1/batches``: a ``validating`` batch of the file's lines."""
    require_store(ctx)
    body = await ctx.json()
    input_file_id = check_id(body.get("input_file_id"), "input_file_id")
    endpoint = check_string(body.get("endpoint"), "endpoint")
    if endpoint not in OPENAI_ENDPOINTS:
        raise RequestError(
            f"endpoint: this server batches {', '.join(OPENAI_ENDPOINTS)}; got {endpoint!r}", param="endpoint"
        )
    window_s = completion_window_seconds(body.get("completion_window"))
    metadata = check_metadata(body.get("metadata"))
    output_ttl = _output_ttl(body.get("output_expires_after"))
    store, owner = ctx.store, ctx.owner
    file = await store.get_file(owner, input_file_id)
    if file is None:
        raise not_stored("File", input_file_id, param="input_file_id")
    if file.purpose != "batch":
        raise RequestError(
            f"input_file_id: {input_file_id} is a {file.purpose!r} file; a batch reads a 'batch' file",
            param="input_file_id",
        )
    limits = batch_limits(ctx)
    if file.lines > limits.max_lines:
        raise RequestError(
            f"input_file_id: the file has {file.lines} requests; a batch of this API key holds at most "
            f"{limits.max_lines} (--batch-max-lines, or the key's batch_max_lines)",
            param="input_file_id",
        )
    if file.bytes > limits.max_bytes:
        raise RequestError(
            f"input_file_id: the file is {file.bytes} bytes; a batch of this API key reads at most "
            f"{limits.max_bytes} (--batch-max-bytes, or the key's batch_max_bytes)",
            param="input_file_id",
        )
    now = store.now()
    retention = store.retention.expires_at(now)
    if output_ttl is not None:
        retention = now + window_s + output_ttl  # the results outlive the batch's run by that much
    batch = StoredBatch(
        id=new_id("batch"),
        owner=owner,
        api="openai",
        tenant=ctx.tenant.name if ctx.tenant is not None else "",
        endpoint=endpoint,
        completion_window=check_string(body.get("completion_window"), "completion_window"),
        status="validating",
        created_at=now,
        deadline=now + window_s,
        input_file_id=input_file_id,
        metadata=orjson.dumps(metadata).decode(),
        expires_at=retention if retention is None else max(retention, now + window_s),
    )
    if not await store.create_batch(batch, [], limits.max_active):
        raise ActiveBatchesError(
            f"this API key has {limits.max_active} batches that have not finished, the most it may "
            "(--batch-max-active, or the key's max_active_batches); create this one when one ends"
        )
    if ctx.state.batch_runner is not None:
        ctx.state.batch_runner.wake()
    return await _answer(ctx, batch)


def _batch_id(ctx: RequestContext) -> str:
    return path_id(ctx.request, "batch_id")


async def _found(ctx: RequestContext) -> StoredBatch:
    require_store(ctx)
    batch_id = _batch_id(ctx)
    batch = await ctx.store.get_batch(ctx.owner, "openai", batch_id)
    if batch is None:
        raise not_stored("Batch", batch_id)
    return batch


@api_route("/v1/batches/{id}", prefix="batch", generates=False)
async def retrieve_batch(ctx: RequestContext) -> Response:
    return await _answer(ctx, await _found(ctx))


@api_route("/v1/batches", prefix="batch", generates=False)
async def list_batches(ctx: RequestContext) -> Response:
    """``GET /v1/batches``: the key's batches, newest first."""
    require_store(ctx)
    limit = query_limit(ctx.request, "limit", DEFAULT_PAGE, MAX_PAGE)
    after = check_id(ctx.request.query_params.get("after") or None, "after", default=None)
    store = ctx.store
    batches, more = await read_page(
        store.list_batches(ctx.owner, "openai", after=after, before=None, limit=limit)
    )
    counts = await store.batch_counts([b.id for b in batches])
    data = [openai_batch(b, counts[b.id]) for b in batches]
    return json_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }
    )


@api_route("/v1/batches/{id}/cancel", prefix="batch", generates=False)
async def cancel_batch(ctx: RequestContext) -> Response:
    """``POST /v1/batches/{id}/cancel``: ``cancelling`` now, ``cancelled`` once its lines in flight
    are stopped (their engine requests aborted) and the rest are reported ``batch_cancelled``.
    A batch that already ended is answered as it is."""
    batch = await _found(ctx)
    cancelled = await ctx.store.cancel_batch(ctx.owner, "openai", batch.id, ctx.store.now())
    if cancelled is None:
        raise not_stored("Batch", batch.id)
    runner = ctx.state.batch_runner
    if runner is not None and cancelled.status == "cancelling":
        await runner.cancel_local(batch.id)
    return await _answer(ctx, cancelled)


ROUTES = [
    Route("/v1/batches", create_batch, methods=["POST"]),
    Route("/v1/batches", list_batches, methods=["GET"]),
    Route("/v1/batches/{batch_id}", retrieve_batch, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
]
