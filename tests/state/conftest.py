"""Every storage-interface test runs against SQLite (a file in a temporary folder) and a real
PostgreSQL server (a private cluster started once per session, a fresh database per test)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from deepseek_frontend.state import Retention, StateStore, open_store_url
from tests.support.postgres import PostgresServer, create_database, postgres_server

__all__ = ["postgres_server"]  # the session fixture, re-exported for this package


@pytest.fixture()
def postgres_url(postgres_server: PostgresServer) -> str:
    """A ``postgresql://`` URL of an empty database of its own."""
    return create_database(postgres_server)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state.sqlite3"  # tmp_path is absolute: four slashes in all
    return create_database(request.getfixturevalue("postgres_server"))


StoreTest = Callable[[StateStore], Awaitable[Any]]


def run_with_store(url: str, test: StoreTest, retention: Retention | None = None) -> Any:
    """Open the store at ``url``, run ``test`` on it inside one event loop, close it."""

    async def main() -> Any:
        store = await open_store_url(url, retention)
        try:
            return await test(store)
        finally:
            await store.close()

    return asyncio.run(asyncio.wait_for(main(), 120))
