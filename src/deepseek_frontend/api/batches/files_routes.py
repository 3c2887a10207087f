"""The Files API, as the Batch API uses it: ``POST /v1/files`` (``purpose: batch``, JSONL),
``GET /v1/files`` (``after``, ``limit`` 1-10000, ``order``, ``purpose``), ``GET`` / ``DELETE
/v1/files/{id}`` and ``GET /v1/files/{id}/content``.

A file of another API key, a deleted one or an expired one is a 404. Contents are streamed from
the store a few chunks (an output or error file: a few hundred results) at a time, whatever the
file's size.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from deepseek_frontend.api.stored import json_response, not_stored, path_id, read_page
from deepseek_frontend.api.validation import check_id
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.errors import RequestError
from deepseek_frontend.state import StateStore, StoredFile

from .common import query_limit, require_store
from .objects import file_object
from .upload import receive_upload

__all__ = ["ROUTES", "stream_results"]

#: ``limit`` of ``GET /v1/files``: OpenAI's default and largest page
MAX_FILES_PAGE = 10_000
#: chunks, and results, read per store call while a content is streamed
_CHUNKS_PER_READ = 4
_RESULTS_PER_READ = 64
JSONL = "application/jsonl"


def _file_id(ctx: RequestContext) -> str:
    return path_id(ctx.request, "file_id")


async def _found(ctx: RequestContext) -> StoredFile:
    require_store(ctx)
    file_id = _file_id(ctx)
    file = await ctx.store.get_file(ctx.owner, file_id)
    if file is None:
        raise not_stored("File", file_id)
    return file


@api_route("/v1/files", prefix="file", streams_body=True)
async def create_file(ctx: RequestContext) -> Response:
    """``POST /v1/files``: the upload, streamed into the store (``upload.py``); the file object."""
    require_store(ctx)
    return json_response(file_object(await receive_upload(ctx)))


@api_route("/v1/files", prefix="file", generates=False)
async def list_files(ctx: RequestContext) -> Response:
    """``GET /v1/files``: the key's files, newest first unless ``order=asc``."""
    require_store(ctx)
    query = ctx.request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise RequestError(f"order: expected 'asc' or 'desc', got {order!r}", param="order")
    limit = query_limit(ctx.request, "limit", MAX_FILES_PAGE, MAX_FILES_PAGE)
    files, more = await read_page(
        ctx.store.list_files(
            ctx.owner,
            purpose=check_id(query.get("purpose") or None, "purpose", default=None),
            after=check_id(query.get("after") or None, "after", default=None),
            limit=limit,
            order=order,
        )
    )
    return json_response(
        {
            "object": "list",
            "data": [file_object(f) for f in files],
            "first_id": files[0].id if files else None,
            "last_id": files[-1].id if files else None,
            "has_more": more,
        }
    )


@api_route("/v1/files/{id}", prefix="file", generates=False)
async def retrieve_file(ctx: RequestContext) -> Response:
    return json_response(file_object(await _found(ctx)))


@api_route("/v1/files/{id}", prefix="file", generates=False)
async def delete_file(ctx: RequestContext) -> Response:
    """``DELETE /v1/files/{id}``. A batch still reading the input file fails; one that has read it
    runs on (its lines are its own)."""
    file = await _found(ctx)
    if not await ctx.store.delete_file(ctx.owner, file.id):
        raise not_stored("File", file.id)
    return json_response({"id": file.id, "object": "file", "deleted": True})


async def _chunks(store: StateStore, file_id: str) -> AsyncIterator[bytes]:
    seq = 0
    while True:
        chunks = await store.file_chunks(file_id, seq, _CHUNKS_PER_READ)
        if not chunks:
            return
        for _, data in chunks:
            yield data
        seq = chunks[-1][0] + 1


async def stream_results(store: StateStore, batch_id: str, outcomes: list[str]) -> AsyncIterator[bytes]:
    """A batch's results whose outcome is one of ``outcomes``, as JSONL, in line order."""
    after = 0
    while True:
        rows = await store.line_results(batch_id, outcomes, after, _RESULTS_PER_READ)
        if not rows:
            return
        yield "".join(result + "\n" for _, result in rows).encode()
        after = rows[-1][0]


@api_route("/v1/files/{id}/content", prefix="file", generates=False)
async def file_content(ctx: RequestContext) -> Response:
    """``GET /v1/files/{id}/content``: the file's bytes (an output or error file: its batch's
    results, one JSON line each)."""
    file = await _found(ctx)
    if file.batch_id is not None:
        body = stream_results(ctx.store, file.batch_id, (file.outcomes or "").split(","))
    else:
        body = _chunks(ctx.store, file.id)
    headers = {"content-disposition": "attachment; filename=" + orjson.dumps(file.filename).decode()}
    return StreamingResponse(body, media_type=JSONL, headers=headers)


ROUTES = [
    Route("/v1/files", create_file, methods=["POST"]),
    Route("/v1/files", list_files, methods=["GET"]),
    Route("/v1/files/{file_id}", retrieve_file, methods=["GET"]),
    Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
    Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
]
