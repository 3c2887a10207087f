"""A private PostgreSQL server for tests: a fresh cluster in a temporary folder on a free port.

Uses the server binaries of the machine (Debian's ``postgresql`` package puts them in
``/usr/lib/postgresql/N/bin``; ``.ci/stage-postgres.sh`` installs it). ``initdb`` refuses to run
as root, so as root the cluster is created and run as the ``postgres`` user that package adds
(``runuser``). Trust authentication on 127.0.0.1 only; the folder is removed on stop.
"""

from __future__ import annotations

import asyncio
import glob
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.servers import free_port

__all__ = ["PostgresServer", "create_database", "find_pg_bin", "postgres_server", "start_postgres"]


def find_pg_bin() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl`` (the newest installed version)."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(os.path.realpath(on_path)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[-3]))
    if not versions:
        raise RuntimeError(
            "PostgreSQL server binaries not found: install them with .ci/stage-postgres.sh "
            "(apt-get install postgresql)"
        )
    return Path(versions[-1]).parent


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass
class PostgresServer:
    root: Path
    port: int
    bin: Path

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        subprocess.run(
            _as_server_user(
                [str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "stop"]
            ),
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> PostgresServer:
    """initdb + pg_ctl start (waiting until it accepts connections); raises with the server's log."""
    pg_bin = find_pg_bin()
    root = Path(tempfile.mkdtemp(prefix="dsfe-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    port = free_port()
    subprocess.run(
        _as_server_user(
            [
                str(pg_bin / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        ),
        capture_output=True,
        timeout=120,
        check=True,
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    started = subprocess.run(
        _as_server_user(
            [
                str(pg_bin / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(root / "log"),
                "-w",
                "-t",
                "60",
                "start",
            ]
        ),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    server = PostgresServer(root, port, pg_bin)
    if started.returncode != 0:
        log = (root / "log").read_text(errors="replace") if (root / "log").exists() else ""
        server.stop()
        raise RuntimeError(f"pg_ctl start failed: {started.stdout}{started.stderr}\n{log}")
    return server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One private PostgreSQL server for the test session (import this fixture into a conftest)."""
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


def create_database(server: PostgresServer) -> str:
    """A new empty database on ``server``; its ``postgresql://`` URL."""
    import asyncpg

    name = "t_" + secrets.token_hex(6)

    async def create() -> None:
        conn = await asyncpg.connect(server.admin_url)
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()

    asyncio.run(create())
    return server.url(name)
