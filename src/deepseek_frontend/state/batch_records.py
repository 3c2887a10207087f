"""What the store keeps for the Files and Batch APIs: plain records, no I/O.

A *file* is bytes kept in chunks (an uploaded input file), or -- for a batch's output and error
files -- a view of the batch's line results (``batch_id`` and the ``outcomes`` it lists). A
*batch* is its settings, status, timestamps and lease; its *lines* are the requests it runs, each
with one outcome: ``pending`` until its single result is written, then ``succeeded``,
``errored``, ``canceled`` or ``expired``. The results are JSON lines already in the API's shape
(the API layer renders them); the store never parses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "ACTIVE_BATCH_STATUSES",
    "BATCH_TIME_COLUMNS",
    "FINAL_BATCH_STATUSES",
    "BatchCounts",
    "BatchLineRecord",
    "ClaimedLine",
    "LineResult",
    "Outcome",
    "StoredBatch",
    "StoredFile",
]

#: a line's outcome; ``pending`` until its one result is written
Outcome = Literal["pending", "succeeded", "errored", "canceled", "expired"]

#: statuses of a batch that still has work to do (counted against a key's active batches)
ACTIVE_BATCH_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")
#: statuses after which a batch never changes
FINAL_BATCH_STATUSES = ("completed", "failed", "expired", "cancelled")
#: the column holding the time a batch entered each status (OpenAI's ``<status>_at`` fields)
BATCH_TIME_COLUMNS = {
    "in_progress": "in_progress_at",
    "finalizing": "finalizing_at",
    "completed": "completed_at",
    "failed": "failed_at",
    "expired": "expired_at",
    "cancelling": "cancelling_at",
    "cancelled": "cancelled_at",
}


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A file: an uploaded one (``purpose`` ``batch``, bytes in chunks) or a batch's output or error
    file (``purpose`` ``batch_output``: the results of ``batch_id``'s lines whose outcome is in
    ``outcomes``, comma-separated)."""

    id: str
    owner: str
    created_at: float
    purpose: str
    filename: str
    bytes: int = 0
    #: non-empty lines (an uploaded JSONL file)
    lines: int = 0
    #: ``uploading`` (invisible until finished) or ``processed``
    status: str = "processed"
    status_details: str | None = None
    expires_at: float | None = None
    batch_id: str | None = None
    outcomes: str | None = None


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A batch: what it runs (``endpoint``, ``api``: ``openai`` or ``anthropic``), for whom
    (``owner``; ``tenant``: the API key's name, whose model permissions its lines get), its status
    and when it entered each status (``times``: status -> Unix seconds)."""

    id: str
    owner: str
    api: str
    tenant: str
    endpoint: str
    completion_window: str
    status: str
    created_at: float
    #: when its lines stop being run (``completion_window`` after creation): then ``expired``
    deadline: float
    input_file_id: str | None = None
    #: JSON text of the metadata object
    metadata: str = "{}"
    #: JSON text of a failed batch's errors (a list of ``{code, message, line, param}``)
    errors: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    #: the number of lines, once known (0 while validating)
    total: int = 0
    times: dict[str, float] = field(default_factory=dict)
    #: when the store forgets the batch (retention); None: kept until deleted
    expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class BatchLineRecord:
    """A line as a batch is created or validated: ``pending`` with the request to run (``url``,
    ``body`` JSON text), or already ``errored`` with its ``result`` (a malformed line)."""

    line: int
    custom_id: str | None
    url: str
    body: str
    outcome: Outcome = "pending"
    result: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimedLine:
    """A pending line this replica holds a lease on, with what running it needs."""

    batch_id: str
    line: int
    custom_id: str | None
    url: str
    body: str
    #: how many times it was claimed, this claim included
    attempts: int
    owner: str
    tenant: str
    api: str


@dataclass(frozen=True, slots=True)
class LineResult:
    """A line's one result: its outcome, the JSON line its output or error file lists (no newline),
    and the tokens it used."""

    outcome: Outcome
    result: str
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """A batch's lines by outcome, and the tokens its lines used."""

    pending: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total(self) -> int:
        return self.pending + self.succeeded + self.errored + self.canceled + self.expired
