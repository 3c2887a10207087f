"""The ``serve`` flags of the conversation-state store, and the store and owners they give.

``--state-store`` names the store (``sqlite:///...``, ``postgresql://...``, ``none``); without
it ``serve`` keeps a SQLite file in ``--state-dir`` (default: the XDG state directory,
``~/.local/state/deepseek-frontend``), created when the server starts. ``--state-ttl`` and
``--state-max-bytes`` bound what is kept (docs/serving.md, "Stored responses and conversations").
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from deepseek_frontend.errors import StartupError, StoreUnavailableError, describe
from deepseek_frontend.state import (
    DEFAULT_DB_NAME,
    NullStore,
    Retention,
    StateStore,
    default_state_dir,
    store_for_url,
)

__all__ = [
    "StateOptions",
    "add_state_arguments",
    "check_state_store",
    "open_state_store",
    "state_options_from_args",
]

log = logging.getLogger("deepseek_frontend.api")

#: OpenAI keeps stored responses 30 days; so do we by default
DEFAULT_TTL_S = 30 * 24 * 3600.0
DEFAULT_MAX_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class StateOptions:
    """Where conversation state lives and how much of it is kept.

    Built directly (tests, benchmarks) the store is ``none``; ``serve`` resolves its default
    SQLite file in :func:`state_options_from_args`."""

    url: str = "none"
    ttl_s: float | None = DEFAULT_TTL_S
    max_bytes: int | None = DEFAULT_MAX_BYTES
    #: ``store`` of a ``/v1/responses`` request that does not say (OpenAI: true)
    store_by_default: bool = True
    purge_interval_s: float = 60.0
    #: False when ``url`` is serve's default file: a default store that cannot be opened (a read-only
    #: home folder) leaves the server stateless with a warning instead of refusing to start
    explicit: bool = True

    def retention(self) -> Retention:
        return Retention(self.ttl_s, self.max_bytes, self.purge_interval_s)

    def build(self) -> StateStore:
        """The (not yet opened) store these options name."""
        return store_for_url(self.url, self.retention())


def add_state_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``state`` flag group of ``serve``."""
    group = parser.add_argument_group(
        "conversation state (docs/serving.md, 'Stored responses and conversations')"
    )
    group.add_argument(
        "--state-store",
        default=None,
        metavar="URL",
        help="where stored responses, conversations and kept reasoning live: sqlite:///RELATIVE/PATH, "
        "sqlite:////ABSOLUTE/PATH, postgresql://USER:PASSWORD@HOST:PORT/DB (several replicas; needs "
        "the 'postgres' extra) or none (stateless) (default: a SQLite file in --state-dir)",
    )
    group.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="folder of the default SQLite store, created at start-up "
        "(default: $XDG_STATE_HOME/deepseek-frontend, else ~/.local/state/deepseek-frontend)",
    )
    group.add_argument(
        "--state-ttl",
        type=float,
        default=DEFAULT_TTL_S,
        metavar="SECONDS",
        help="seconds a stored object is kept after its creation (a conversation: after its last "
        "change); 0 keeps them until deleted or evicted (default: 2592000, 30 days)",
    )
    group.add_argument(
        "--state-max-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help="size budget of the stored JSON, held by every write: the oldest objects are evicted to make "
        "room, one object larger than the whole budget is refused (413); 0: no budget (default: 1 GiB)",
    )
    group.add_argument(
        "--responses-store-default",
        choices=("on", "off"),
        default="on",
        help="'store' of a /v1/responses request that does not set it: on, as OpenAI's API (default: on)",
    )


def state_options_from_args(args: argparse.Namespace) -> StateOptions:
    """The options the parsed flags give; raises ValueError for a bad URL or a negative bound."""
    url = getattr(args, "state_store", None)
    explicit = url is not None
    if url is None:
        folder = Path(getattr(args, "state_dir", None) or default_state_dir())
        url = "sqlite:///" + str(folder / DEFAULT_DB_NAME)  # a relative folder: three slashes
    ttl = getattr(args, "state_ttl", DEFAULT_TTL_S)
    max_bytes = getattr(args, "state_max_bytes", DEFAULT_MAX_BYTES)
    if ttl is None or ttl < 0:
        raise ValueError(f"--state-ttl must be 0 or positive, got {ttl!r}")
    if max_bytes is None or max_bytes < 0:
        raise ValueError(f"--state-max-bytes must be 0 or positive, got {max_bytes!r}")
    options = StateOptions(
        url=url,
        ttl_s=ttl or None,
        max_bytes=max_bytes or None,
        store_by_default=getattr(args, "responses_store_default", "on") == "on",
        explicit=explicit,
    )
    store_for_url(url)  # a bad URL fails at start-up, naming the flag
    if _is_postgres(url) and importlib.util.find_spec("asyncpg") is None:
        raise ValueError(
            f"--state-store {_redacted(url)}: PostgreSQL needs the asyncpg package: "
            "pip install 'deepseek-frontend[postgres]'"
        )
    return options


def _is_postgres(url: str) -> bool:
    return url.partition("://")[0] in ("postgresql", "postgres", "postgresql+asyncpg")


async def open_state_store(options: StateOptions, store: StateStore) -> StateStore:
    """Open ``store`` (built from ``options``); the store to use. An explicit ``--state-store`` that
    fails stops the start-up with a ``StartupError`` naming the flag and its URL (password hidden);
    serve's default file that cannot be created gives a stateless server."""
    try:
        await store.open()
    except Exception as exc:
        expected = isinstance(exc, OSError | sqlite3.Error | StoreUnavailableError)
        if options.explicit or not expected:
            # check_state_store refused what it could before the server bound its port; this is a
            # store that failed between that check and the start-up, or serve's default file failing
            # in a way a missing folder does not explain
            where = f"--state-store {_redacted(options.url)}: cannot open the state store"
            if _is_postgres(options.url):
                hint = "check that PostgreSQL runs there and takes these credentials"
            else:
                hint = "check that its folder exists and is writable"
            cause = exc.__cause__ if isinstance(exc, StoreUnavailableError) and exc.__cause__ else exc
            raise StartupError(
                f"{where}: {describe(cause)} ({hint}, or pass --state-store none to run without stored state)"
            ) from exc
        log.warning(
            "conversation state disabled: the default store %s cannot be opened (%s); "
            "pass --state-dir or --state-store (or --state-store none to silence this)",
            options.url,
            exc,
        )
        return NullStore(options.retention())
    return store


def _redacted(url: str) -> str:
    """``url`` without the password a PostgreSQL URL may carry."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def check_state_store(options: StateOptions) -> str | None:
    """Open, migrate (which writes) and close the store ``options`` name, before the server starts;
    the one-line error that should stop ``serve`` (None: fine). An explicit ``--state-store`` that
    cannot be opened for writing -- a read-only file or folder, a database that refuses writes or
    cannot be reached -- stops the start-up; serve's default file is left to the start-up, which
    runs stateless with a warning when it cannot be opened."""
    if options.url == "none" or not options.explicit:
        return None
    store = options.build()

    async def probe() -> None:
        try:
            await store.open()
        finally:
            await store.close()

    try:
        asyncio.run(probe())
    except Exception as exc:
        cause = exc.__cause__ if isinstance(exc, StoreUnavailableError) and exc.__cause__ else exc
        reason = f"{type(cause).__name__}: {cause}"  # the operator's own terminal: the cause as it is
        return f"--state-store {_redacted(options.url)} cannot be opened for writing: {reason}"
    return None
