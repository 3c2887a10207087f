"""``--state-store`` URLs, spelled as SQLAlchemy spells database URLs, and the store each one names.

* ``sqlite:///RELATIVE/PATH`` -- a file relative to the working directory (three slashes);
* ``sqlite:////ABSOLUTE/PATH`` -- an absolute path (four slashes);
* ``postgresql://user:password@host:port/dbname`` (also ``postgres://`` and
  ``postgresql+asyncpg://``) -- a PostgreSQL database, passed to the driver as is;
* ``none`` -- keep nothing (stateless).
"""

from __future__ import annotations

from pathlib import Path

from .store import NullStore, Retention, StateStore

__all__ = ["DEFAULT_DB_NAME", "default_state_dir", "open_store_url", "store_for_url"]

#: the SQLite file ``serve`` keeps in its state directory when no --state-store is given
DEFAULT_DB_NAME = "state.sqlite3"


def default_state_dir(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/deepseek-frontend``, else ``~/.local/state/deepseek-frontend`` (the XDG
    base directory specification's place for state that outlives a run but is not configuration)."""
    import os

    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "deepseek-frontend"


def store_for_url(url: str, retention: Retention | None = None) -> StateStore:
    """The (not yet opened) store ``url`` names; raises ValueError for anything else."""
    if url == "none":
        return NullStore(retention)
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"--state-store {url!r}: expected sqlite:///PATH, postgresql://... or none")
    if scheme == "sqlite":
        if not rest.startswith("/") or rest == "/":
            raise ValueError(
                f"--state-store {url!r}: a SQLite URL has three slashes before a relative path "
                "(sqlite:///state.db) and four before an absolute one (sqlite:////var/lib/state.db)"
            )
        from .sqlite import SqliteStore

        return SqliteStore(Path(rest[1:]), retention)
    if scheme in ("postgresql", "postgres", "postgresql+asyncpg"):
        from .postgres import PostgresStore

        return PostgresStore("postgresql://" + rest, retention)
    raise ValueError(f"--state-store {url!r}: unknown scheme {scheme!r} (sqlite, postgresql or none)")


async def open_store_url(url: str, retention: Retention | None = None) -> StateStore:
    """:func:`store_for_url`, opened (connected and migrated)."""
    store = store_for_url(url, retention)
    await store.open()
    return store
