"""The objects the Files and Batch endpoints answer with, as the official SDKs read them.

* :func:`file_object` -- OpenAI's ``File`` (``openai.types.FileObject``).
* :func:`openai_batch` -- OpenAI's ``Batch`` (``openai.types.Batch``): Unix-second timestamps per
  status, ``request_counts`` (``completed``: lines that succeeded; ``failed``: lines that errored,
  malformed ones included), ``usage`` summed over the lines that ran.
* :func:`message_batch` -- Anthropic's ``MessageBatch`` (``anthropic.types.messages.MessageBatch``):
  RFC 3339 times, ``processing_status`` (``in_progress`` while validating, running or finalizing;
  ``canceling``; ``ended``), ``request_counts`` by result type and ``results_url`` once ended.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from deepseek_frontend.state import BatchCounts, StoredBatch, StoredFile

__all__ = ["ENDED_AT", "file_object", "message_batch", "openai_batch", "rfc3339"]

#: the status whose time is when an ended batch ended
ENDED_AT = {"completed": "completed", "failed": "failed", "expired": "expired", "cancelled": "cancelled"}


def _seconds(value: float | None) -> int | None:
    return None if value is None else int(value)


def rfc3339(value: float | None) -> str | None:
    if value is None:
        return None
    return datetime.fromtimestamp(value, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def file_object(file: StoredFile) -> dict[str, Any]:
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": int(file.created_at),
        "expires_at": _seconds(file.expires_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": file.status_details,
    }


def openai_batch(batch: StoredBatch, counts: BatchCounts) -> dict[str, Any]:
    times = batch.times
    errors = orjson.loads(batch.errors) if batch.errors else None
    metadata = orjson.loads(batch.metadata)
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "in_progress_at": _seconds(times.get("in_progress")),
        "expires_at": int(batch.deadline),
        "finalizing_at": _seconds(times.get("finalizing")),
        "completed_at": _seconds(times.get("completed")),
        "failed_at": _seconds(times.get("failed")),
        "expired_at": _seconds(times.get("expired")),
        "cancelling_at": _seconds(times.get("cancelling")),
        "cancelled_at": _seconds(times.get("cancelled")),
        "request_counts": {
            "total": max(batch.total, counts.total),
            "completed": counts.succeeded,
            "failed": counts.errored,
        },
        "metadata": metadata or None,
        "usage": {
            "input_tokens": counts.input_tokens,
            "input_tokens_details": {"cached_tokens": counts.cached_tokens},
            "output_tokens": counts.output_tokens,
            "output_tokens_details": {"reasoning_tokens": counts.reasoning_tokens},
            "total_tokens": counts.input_tokens + counts.output_tokens,
        },
    }


def _processing_status(status: str) -> str:
    if status in ENDED_AT:
        return "ended"
    return "canceling" if status == "cancelling" else "in_progress"


def message_batch(batch: StoredBatch, counts: BatchCounts, base_url: str) -> dict[str, Any]:
    """``base_url``: where the client reached this server (``results_url`` is absolute, as
    Anthropic's is, and points back at the server that answered)."""
    times = batch.times
    processing = _processing_status(batch.status)
    ended = processing == "ended"
    ended_at = times.get(ENDED_AT[batch.status]) if ended else None
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": processing,
        "request_counts": {
            # lines a failed batch never ran count as errored: the counts add up to its requests
            "processing": 0 if ended else counts.pending,
            "succeeded": counts.succeeded,
            "errored": counts.errored + (counts.pending if ended else 0),
            "canceled": counts.canceled,
            "expired": counts.expired,
        },
        "ended_at": rfc3339(ended_at),
        "created_at": rfc3339(batch.created_at),
        "expires_at": rfc3339(batch.deadline),
        "archived_at": None,
        "cancel_initiated_at": rfc3339(times.get("cancelling")),
        "results_url": f"{base_url.rstrip('/')}/v1/messages/batches/{batch.id}/results" if ended else None,
    }
