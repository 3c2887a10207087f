"""The schema of the conversation-state store, versioned in code.

:data:`MIGRATIONS` is an ordered list; migration ``n`` (1-based) takes the schema from version
``n - 1`` to ``n``. A store records the version it reached in ``schema_version`` (one row) and
applies the missing migrations at start-up, inside one transaction that also holds the
database's write lock (SQLite's ``BEGIN IMMEDIATE``, a PostgreSQL advisory lock), so replicas or
processes starting together migrate once. A database newer than this code is refused rather
than written to.

The SQL is the common subset of SQLite and PostgreSQL: ``TEXT``, ``BIGINT``, ``DOUBLE
PRECISION``. JSON is kept as ``TEXT`` (not ``jsonb``), byte for byte as written: the prompt a
stored item renders must be the prompt the same item renders when a client resends it.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]

_V1 = (
    """CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        status TEXT NOT NULL,
        body TEXT NOT NULL,
        request TEXT NOT NULL,
        previous_response_id TEXT,
        conversation_id TEXT,
        size BIGINT NOT NULL
    )""",
    "CREATE INDEX responses_created ON responses (created_at)",
    "CREATE INDEX responses_expires ON responses (expires_at)",
    """CREATE TABLE response_items (
        response_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        seq INTEGER NOT NULL,
        item_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (response_id, kind, seq)
    )""",
    "CREATE INDEX response_items_item ON response_items (owner, item_id)",
    """CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        metadata TEXT NOT NULL,
        size BIGINT NOT NULL
    )""",
    "CREATE INDEX conversations_created ON conversations (created_at)",
    "CREATE INDEX conversations_expires ON conversations (expires_at)",
    """CREATE TABLE conversation_items (
        conversation_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        item_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (conversation_id, seq)
    )""",
    "CREATE INDEX conversation_items_item ON conversation_items (conversation_id, item_id)",
    "CREATE INDEX conversation_items_owner_item ON conversation_items (owner, item_id)",
    """CREATE TABLE reasoning (
        owner TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        text TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        size BIGINT NOT NULL,
        PRIMARY KEY (owner, fingerprint)
    )""",
    "CREATE INDEX reasoning_created ON reasoning (created_at)",
    "CREATE INDEX reasoning_expires ON reasoning (expires_at)",
)

#: when a response was last written or, while a background task generates it, last renewed: a
#: queued or in-progress response not renewed for a while has lost its task (its process died)
_V2 = ("ALTER TABLE responses ADD COLUMN updated_at DOUBLE PRECISION",)

#: the Files and Batch APIs (api/batches/): uploaded files in chunks, batches and their lines.
#: ``data BYTEA`` is PostgreSQL's bytes type; SQLite gives the name NUMERIC affinity, which keeps a
#: blob as written. A line's ``outcome`` is ``pending`` until its one result is written;
#: ``holder`` / ``claim`` / ``lease_until`` are the lease of the replica running it (state/batch_sql.py)
_V3 = (
    """CREATE TABLE files (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        purpose TEXT NOT NULL,
        filename TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        lines BIGINT NOT NULL,
        status TEXT NOT NULL,
        status_details TEXT,
        batch_id TEXT,
        outcomes TEXT
    )""",
    "CREATE INDEX files_owner ON files (owner, created_at)",
    "CREATE INDEX files_expires ON files (expires_at)",
    """CREATE TABLE file_chunks (
        file_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (file_id, seq)
    )""",
    """CREATE TABLE batches (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        api TEXT NOT NULL,
        tenant TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        input_file_id TEXT,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        deadline DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        in_progress_at DOUBLE PRECISION,
        finalizing_at DOUBLE PRECISION,
        completed_at DOUBLE PRECISION,
        failed_at DOUBLE PRECISION,
        expired_at DOUBLE PRECISION,
        cancelling_at DOUBLE PRECISION,
        cancelled_at DOUBLE PRECISION,
        metadata TEXT NOT NULL,
        errors TEXT,
        output_file_id TEXT,
        error_file_id TEXT,
        total BIGINT NOT NULL,
        holder TEXT,
        lease_until DOUBLE PRECISION
    )""",
    "CREATE INDEX batches_owner ON batches (owner, api, created_at)",
    "CREATE INDEX batches_status ON batches (status, created_at)",
    "CREATE INDEX batches_expires ON batches (expires_at)",
    """CREATE TABLE batch_lines (
        batch_id TEXT NOT NULL,
        line INTEGER NOT NULL,
        custom_id TEXT,
        url TEXT NOT NULL,
        body TEXT NOT NULL,
        outcome TEXT NOT NULL,
        result TEXT,
        size BIGINT NOT NULL,
        holder TEXT,
        claim TEXT,
        lease_until DOUBLE PRECISION,
        attempts INTEGER NOT NULL,
        input_tokens BIGINT NOT NULL,
        cached_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL,
        reasoning_tokens BIGINT NOT NULL,
        PRIMARY KEY (batch_id, line)
    )""",
    "CREATE INDEX batch_lines_outcome ON batch_lines (batch_id, outcome, line)",
    "CREATE INDEX batch_lines_claim ON batch_lines (claim)",
    "CREATE INDEX batch_lines_holder ON batch_lines (holder)",
)

#: migration n (index n - 1) brings the schema from version n - 1 to n
MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1, _V2, _V3)
#: the version this code writes
SCHEMA_VERSION = len(MIGRATIONS)
