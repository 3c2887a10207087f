"""A batch's requests, read and checked: the lines of an OpenAI batch file, the ``requests`` of an
Anthropic message batch.

Each becomes a :class:`~deepseek_frontend.state.BatchLineRecord`: ``pending`` with the request to
run, or -- when it cannot be a request of this batch -- already ``errored`` with its result line
naming the line number and the field at fault. Only that line fails; the batch runs the others.
What the endpoint itself refuses (a bad message, an unknown model) is the endpoint's to say when
the line runs: its answer is the line's result, exactly as a direct request would get it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import orjson

from deepseek_frontend.api.validation import check_array, check_object, json_type
from deepseek_frontend.errors import RequestError
from deepseek_frontend.state import BatchLineRecord, StateStore

from .results import LineFault, anthropic_fault_line, openai_fault_line

__all__ = [
    "ANTHROPIC_ENDPOINT",
    "OPENAI_ENDPOINTS",
    "anthropic_requests",
    "file_lines",
    "openai_line",
]

#: the endpoints an OpenAI batch runs (``endpoint`` of ``POST /v1/batches``, ``url`` of each line)
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
#: what every request of an Anthropic message batch runs
ANTHROPIC_ENDPOINT = "/v1/messages"
#: Anthropic's rule for a request's ``custom_id``
_ANTHROPIC_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
#: chunks of a file read per store call while its lines are read
_CHUNKS_PER_READ = 4


async def file_lines(store: StateStore, file_id: str) -> AsyncIterator[tuple[int, bytes]]:
    """The non-blank lines of a stored file as ``(line number, bytes)`` (numbers count every line,
    from 1; a trailing ``\\r`` is dropped), read a few chunks at a time."""
    partial = bytearray()  # a line running across chunks: appended to, never copied whole per chunk
    number = 0
    seq = 0
    while True:
        chunks = await store.file_chunks(file_id, seq, _CHUNKS_PER_READ)
        if not chunks:
            break
        seq = chunks[-1][0] + 1
        for _, data in chunks:
            start = 0
            while (end := data.find(b"\n", start)) >= 0:
                if partial:
                    partial += data[start:end]
                    line, partial = bytes(partial), bytearray()
                else:
                    line = data[start:end]
                number += 1
                line = line.removesuffix(b"\r")
                if line.strip():
                    yield number, line
                start = end + 1
            partial += data[start:]
    if partial.strip():
        yield number + 1, bytes(partial).removesuffix(b"\r")


def _fault(
    number: int, custom_id: str | None, url: str, code: str, message: str, param: str | None = None
) -> BatchLineRecord:
    fault = LineFault(code, f"line {number}: {message}", number, param)
    return BatchLineRecord(number, custom_id, url, "", "errored", openai_fault_line(custom_id, fault))


def _unbatchable(body: dict[str, Any], endpoint: str) -> tuple[str, str] | None:
    """The field of a request body a batch cannot honour, and why (a batch answers each request
    whole, once): streaming, and a Responses background request."""
    if body.get("stream"):
        return "body.stream", "a batch answers each request whole: stream must be false or left out"
    if endpoint == "/v1/responses" and body.get("background"):
        return "body.background", "a batch line runs in the batch: background must be false or left out"
    return None


def openai_line(number: int, raw: bytes, endpoint: str, seen: dict[str, int]) -> BatchLineRecord:
    """Line ``number`` of an OpenAI batch file for a batch of ``endpoint`` (``seen``: the custom ids
    of the lines before it, updated)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _fault(number, None, "", "invalid_json_line", f"not valid JSON ({exc})")
    if not isinstance(data, dict):
        return _fault(number, None, "", "invalid_json_line", f"expected a JSON object, got {json_type(data)}")
    custom_id = data.get("custom_id")
    url = data.get("url") if isinstance(data.get("url"), str) else ""
    if custom_id is None:
        return _fault(number, None, url, "missing_required_parameter", "custom_id is required", "custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _fault(
            number,
            None,
            url,
            "invalid_type",
            f"custom_id: expected a non-empty string, got {json_type(custom_id)}",
            "custom_id",
        )
    first = seen.get(custom_id)
    if first is not None:
        return _fault(
            number,
            custom_id,
            url,
            "duplicate_custom_id",
            f"custom_id {custom_id!r} is also the custom_id of line {first}; each line needs its own",
            "custom_id",
        )
    seen[custom_id] = number
    method = data.get("method")
    if method != "POST":
        code = "missing_required_parameter" if method is None else "invalid_method"
        return _fault(number, custom_id, url, code, f"method: expected 'POST', got {method!r}", "method")
    if "url" not in data:
        return _fault(number, custom_id, url, "missing_required_parameter", "url is required", "url")
    if url != endpoint:
        why = (
            f"url {data['url']!r} is not this batch's endpoint {endpoint!r}"
            if url in OPENAI_ENDPOINTS
            else f"url {data['url']!r} is not an endpoint this server batches ({', '.join(OPENAI_ENDPOINTS)})"
        )
        return _fault(number, custom_id, url, "invalid_url", why, "url")
    body = data.get("body")
    if not isinstance(body, dict):
        code = "missing_required_parameter" if body is None else "invalid_type"
        return _fault(
            number, custom_id, url, code, f"body: expected a JSON object, got {json_type(body)}", "body"
        )
    refused = _unbatchable(body, endpoint)
    if refused is not None:
        return _fault(
            number, custom_id, url, "unsupported_parameter", f"{refused[0]}: {refused[1]}", refused[0]
        )
    return BatchLineRecord(number, custom_id, url, orjson.dumps(body).decode())


def anthropic_requests(raw: Any, max_lines: int) -> list[BatchLineRecord]:
    """The ``requests`` of ``POST /v1/messages/batches`` as lines (numbered from 1). A request that
    cannot be identified -- not an object, a ``custom_id`` that is missing, malformed or repeated, no
    ``params`` object -- is a 400 naming it, as Anthropic's API answers; a request whose ``params``
    a batch cannot honour (``stream``) is an ``errored`` result and the others run."""
    requests = check_array(raw, "requests")
    if not requests:
        raise RequestError("requests: a message batch needs at least one request", param="requests")
    if len(requests) > max_lines:
        raise RequestError(
            f"requests: {len(requests)} requests, more than the {max_lines} a batch of this API key may hold",
            param="requests",
        )
    seen: dict[str, int] = {}
    lines = []
    for index, entry in enumerate(requests):
        where = f"requests[{index}]"
        entry = check_object(entry, where)
        custom_id = entry.get("custom_id")
        if not isinstance(custom_id, str) or not _ANTHROPIC_CUSTOM_ID.fullmatch(custom_id):
            raise RequestError(
                f"{where}.custom_id: expected 1 to 64 letters, digits, '_' or '-', got {json_type(custom_id)}"
                + (f" {custom_id!r}" if isinstance(custom_id, str) else ""),
                param=f"{where}.custom_id",
            )
        if custom_id in seen:
            raise RequestError(
                f"{where}.custom_id: {custom_id!r} is also the custom_id of requests[{seen[custom_id]}]; "
                "each request needs its own",
                param=f"{where}.custom_id",
            )
        seen[custom_id] = index
        params = check_object(entry.get("params"), f"{where}.params")
        refused = _unbatchable(params, ANTHROPIC_ENDPOINT)
        if refused is not None:
            message = f"{where}.params.{refused[0].removeprefix('body.')}: {refused[1]}"
            result = anthropic_fault_line(custom_id, message)
            lines.append(BatchLineRecord(index + 1, custom_id, ANTHROPIC_ENDPOINT, "", "errored", result))
            continue
        lines.append(BatchLineRecord(index + 1, custom_id, ANTHROPIC_ENDPOINT, orjson.dumps(params).decode()))
    return lines
