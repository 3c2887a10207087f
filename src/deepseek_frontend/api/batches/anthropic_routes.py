"""Anthropic's Message Batches API: ``POST /v1/messages/batches``, ``GET /v1/messages/batches``
(``after_id``, ``before_id``, ``limit`` 1-1000), ``GET`` / ``DELETE /v1/messages/batches/{id}``,
``POST .../{id}/cancel`` and ``GET .../{id}/results`` (JSONL, once the batch has ended).

The requests come in the body (``{"requests": [{"custom_id", "params"}]}``, so a message batch is
bounded by ``--max-body-bytes`` as well as by the key's batch limits); they are stored as lines at
once and the batch starts ``in_progress``. Every request runs through ``/v1/messages`` itself
(``execute.py``). Errors are Anthropic's shape (``{"type": "error", "error": {...}}``).
"""

from __future__ import annotations

from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from deepseek_frontend.api.anthropic.routes import ANTHROPIC
from deepseek_frontend.api.stored import json_response, not_stored, path_id, read_page
from deepseek_frontend.api.validation import check_id
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.errors import RequestError
from deepseek_frontend.state import StoredBatch, new_id

from .common import MAX_WINDOW_S, ActiveBatchesError, batch_limits, query_limit, require_store
from .files_routes import JSONL, stream_results
from .lines import ANTHROPIC_ENDPOINT, anthropic_requests
from .objects import message_batch

__all__ = ["ROUTES"]

DEFAULT_PAGE = 20
MAX_PAGE = 1000
#: a result of every kind: what the results file lists
_ALL_RESULTS = ["succeeded", "errored", "canceled", "expired"]


async def _answer(ctx: RequestContext, batch: StoredBatch) -> Response:
    counts = await ctx.store.batch_counts([batch.id])
    return json_response(message_batch(batch, counts[batch.id], str(ctx.request.base_url)))


@api_route("/v1/messages/batches", ANTHROPIC, prefix="msgbatch", generates=False)
async def create_message_batch(ctx: RequestContext) -> Response:
    """``POST /v1/messages/batches``: an ``in_progress`` batch of the body's requests."""
    require_store(ctx)
    body = await ctx.json()
    limits = batch_limits(ctx)
    if len(ctx.body) > limits.max_bytes:
        raise RequestError(
            f"requests: the batch is {len(ctx.body)} bytes; a batch of this API key may be at most "
            f"{limits.max_bytes} (--batch-max-bytes, or the key's batch_max_bytes)",
            param="requests",
        )
    lines = anthropic_requests(body.get("requests"), limits.max_lines)
    store = ctx.store
    now = store.now()
    retention = store.retention.expires_at(now)
    batch = StoredBatch(
        id=new_id("msgbatch"),
        owner=ctx.owner,
        api="anthropic",
        tenant=ctx.tenant.name if ctx.tenant is not None else "",
        endpoint=ANTHROPIC_ENDPOINT,
        completion_window="24h",
        status="in_progress",
        created_at=now,
        deadline=now + MAX_WINDOW_S,
        total=len(lines),
        times={"in_progress": now},
        expires_at=retention if retention is None else max(retention, now + MAX_WINDOW_S),
    )
    if not await store.create_batch(batch, lines, limits.max_active):
        raise ActiveBatchesError(
            f"this API key has {limits.max_active} batches that have not ended, the most it may "
            "(--batch-max-active, or the key's max_active_batches); create this one when one ends"
        )
    if ctx.state.batch_runner is not None:
        ctx.state.batch_runner.wake()
    return await _answer(ctx, batch)


async def _found(ctx: RequestContext) -> StoredBatch:
    require_store(ctx)
    batch_id = path_id(ctx.request, "batch_id")
    batch = await ctx.store.get_batch(ctx.owner, "anthropic", batch_id)
    if batch is None:
        raise not_stored("Message batch", batch_id, param="message_batch_id")
    return batch


@api_route("/v1/messages/batches/{id}", ANTHROPIC, prefix="msgbatch", generates=False)
async def retrieve_message_batch(ctx: RequestContext) -> Response:
    return await _answer(ctx, await _found(ctx))


@api_route("/v1/messages/batches", ANTHROPIC, prefix="msgbatch", generates=False)
async def list_message_batches(ctx: RequestContext) -> Response:
    """``GET /v1/messages/batches``: the key's message batches, newest first."""
    require_store(ctx)
    query = ctx.request.query_params
    limit = query_limit(ctx.request, "limit", DEFAULT_PAGE, MAX_PAGE)
    store = ctx.store
    batches, more = await read_page(
        store.list_batches(
            ctx.owner,
            "anthropic",
            after=check_id(query.get("after_id") or None, "after_id", default=None),
            before=check_id(query.get("before_id") or None, "before_id", default=None),
            limit=limit,
        )
    )
    counts = await store.batch_counts([b.id for b in batches])
    base = str(ctx.request.base_url)
    data = [message_batch(b, counts[b.id], base) for b in batches]
    return json_response(
        {
            "data": data,
            "has_more": more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )


@api_route("/v1/messages/batches/{id}/cancel", ANTHROPIC, prefix="msgbatch", generates=False)
async def cancel_message_batch(ctx: RequestContext) -> Response:
    """``POST .../cancel``: ``canceling`` now; the requests in flight are stopped (their engine
    requests aborted) and the rest end ``canceled``. A batch that has ended is answered as it is."""
    batch = await _found(ctx)
    cancelled = await ctx.store.cancel_batch(ctx.owner, "anthropic", batch.id, ctx.store.now())
    if cancelled is None:
        raise not_stored("Message batch", batch.id, param="message_batch_id")
    runner = ctx.state.batch_runner
    if runner is not None and cancelled.status == "cancelling":
        await runner.cancel_local(batch.id)
    return await _answer(ctx, cancelled)


def _ended(batch: StoredBatch) -> bool:
    return batch.status in ("completed", "failed", "expired", "cancelled")


@api_route("/v1/messages/batches/{id}", ANTHROPIC, prefix="msgbatch", generates=False)
async def delete_message_batch(ctx: RequestContext) -> Response:
    """``DELETE /v1/messages/batches/{id}``: an ended batch and its results (one still processing
    must be canceled first)."""
    batch = await _found(ctx)
    if not _ended(batch):
        raise RequestError(f"message batch {batch.id} is still processing; cancel it before deleting it")
    await ctx.store.delete_batch(ctx.owner, "anthropic", batch.id)
    return json_response({"id": batch.id, "type": "message_batch_deleted"})


@api_route("/v1/messages/batches/{id}/results", ANTHROPIC, prefix="msgbatch", generates=False)
async def message_batch_results(ctx: RequestContext) -> Response:
    """``GET .../results``: one JSON line per request, in request order (``results.py``)."""
    batch = await _found(ctx)
    if not _ended(batch):
        raise RequestError(f"message batch {batch.id} has not ended yet; its results come when it has")
    return StreamingResponse(stream_results(ctx.store, batch.id, _ALL_RESULTS), media_type=JSONL)


ROUTES = [
    Route("/v1/messages/batches", create_message_batch, methods=["POST"]),
    Route("/v1/messages/batches", list_message_batches, methods=["GET"]),
    Route("/v1/messages/batches/{batch_id}", retrieve_message_batch, methods=["GET"]),
    Route("/v1/messages/batches/{batch_id}", delete_message_batch, methods=["DELETE"]),
    Route("/v1/messages/batches/{batch_id}/cancel", cancel_message_batch, methods=["POST"]),
    Route("/v1/messages/batches/{batch_id}/results", message_batch_results, methods=["GET"]),
]
