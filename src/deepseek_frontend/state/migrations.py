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

#: migration n (index n - 1) brings the schema from version n - 1 to n
MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1, _V2)
#: the version this code writes
SCHEMA_VERSION = len(MIGRATIONS)
