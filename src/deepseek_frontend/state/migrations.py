"""The schema of the conversation-state store, versioned in code.

:data:`MIGRATIONS` is an ordered list; migration ``n`` (1-based) takes the schema from version
``n - 1`` to ``n``. A store records the version it reached in ``schema_version`` (one row) and
applies the missing migrations at start-up, inside one transaction that also holds the
database's write lock (SQLite's ``BEGIN IMMEDIATE``, a PostgreSQL advisory lock), so replicas or
processes starting together migrate once. A database newer than this code is refused rather
than written to.

The SQL is the common subset of SQLite and PostgreSQL: ``TEXT``, ``BIGINT``, ``DOUBLE
PRECISION``. JSON is kept as ``TEXT`` (not ``jsonb``), byte for byte as written: the prompt a
stored item renders must be the prompt the same item renders when a client resends it. A
migration whose SQL differs per database (triggers) is a mapping from the store's ``kind``
(``sqlite``, ``postgresql``) to its statements.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "USAGE_SHARDS", "Migration", "statements_for"]

#: one migration: its statements, or its statements per store kind
Migration = tuple[str, ...] | Mapping[str, tuple[str, ...]]

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

#: rows of ``store_usage`` on PostgreSQL: a writer adds to the row of its connection
#: (``pg_backend_pid() % USAGE_SHARDS``), so concurrent writers rarely wait on one counter row
USAGE_SHARDS = 16
_SIZED = ("responses", "conversations", "reasoning")
_TOTAL = " + ".join(f"(SELECT COALESCE(SUM(size), 0) FROM {table})" for table in _SIZED)


def _sqlite_usage_triggers(table: str) -> tuple[str, ...]:
    change = "UPDATE store_usage SET bytes = bytes + {} WHERE shard = 0;"
    return (
        f"CREATE TRIGGER {table}_usage_insert AFTER INSERT ON {table} BEGIN {change.format('NEW.size')} END",
        f"CREATE TRIGGER {table}_usage_update AFTER UPDATE OF size ON {table}"
        f" BEGIN {change.format('NEW.size - OLD.size')} END",
        f"CREATE TRIGGER {table}_usage_delete AFTER DELETE ON {table} BEGIN {change.format('-OLD.size')} END",
    )


#: the stored bytes the size budget counts (``--state-max-bytes``), kept exact by the database
#: itself: a trigger on every insert, size update and delete of a sized object adds its change to
#: ``store_usage``, whatever statement made it (a write, a delete, the purge, an eviction); the
#: total is the sum of its rows. Read on every write that adds bytes, so the budget holds at once.
_V4: Migration = {
    "sqlite": (
        "CREATE TABLE store_usage (shard INTEGER PRIMARY KEY, bytes BIGINT NOT NULL)",
        f"INSERT INTO store_usage (shard, bytes) VALUES (0, {_TOTAL})",
        *(statement for table in _SIZED for statement in _sqlite_usage_triggers(table)),
    ),
    "postgresql": (
        "CREATE TABLE store_usage (shard INTEGER PRIMARY KEY, bytes BIGINT NOT NULL)",
        "INSERT INTO store_usage (shard, bytes)"
        f" SELECT g, 0 FROM generate_series(0, {USAGE_SHARDS - 1}) AS g",
        f"UPDATE store_usage SET bytes = {_TOTAL} WHERE shard = 0",
        f"""CREATE FUNCTION dsfe_store_usage() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE change BIGINT;
        BEGIN
            IF TG_OP = 'INSERT' THEN change := NEW.size;
            ELSIF TG_OP = 'UPDATE' THEN change := NEW.size - OLD.size;
            ELSE change := -OLD.size;
            END IF;
            UPDATE store_usage SET bytes = bytes + change WHERE shard = pg_backend_pid() % {USAGE_SHARDS};
            RETURN NULL;
        END $$""",
        *(
            f"CREATE TRIGGER {table}_usage AFTER INSERT OR DELETE OR UPDATE OF size ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION dsfe_store_usage()"
            for table in _SIZED
        ),
    ),
}

#: migration n (index n - 1) brings the schema from version n - 1 to n
MIGRATIONS: tuple[Migration, ...] = (_V1, _V2, _V3, _V4)
#: the version this code writes
SCHEMA_VERSION = len(MIGRATIONS)


def statements_for(migration: Migration, kind: str) -> tuple[str, ...]:
    """The statements of ``migration`` for a store of ``kind``."""
    if isinstance(migration, Mapping):
        return migration[kind]
    return migration
