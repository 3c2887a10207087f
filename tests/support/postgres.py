"""A private PostgreSQL server for tests: a fresh cluster in a temporary folder on a free port.

The server binaries come from the ``pgserver`` wheel of the test extra (PostgreSQL built for
manylinux, in ``pgserver/pginstall``; only its files are used, never its Python layer), so the
README's test command needs no system package; without that wheel, the machine's own (Debian's
``/usr/lib/postgresql/N/bin``). ``initdb`` refuses to run as root, so as root the cluster is created
and run as an unprivileged user (``postgres`` where it exists, else ``nobody``, through ``runuser``),
with the wheel's binaries copied into the cluster's folder where that user can run them. Trust
authentication on 127.0.0.1 only; the folder is removed on stop.
"""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import os
import pwd
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


def _wheel_install() -> Path | None:
    """``pgserver``'s PostgreSQL install tree (bin/, lib/, share/), when the wheel is installed."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    tree = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    return tree if (tree / "bin" / "initdb").is_file() else None


def _server_user() -> str | None:
    """The user the server runs as: None (the current one) unless this is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root and neither a postgres nor a nobody user exists to run PostgreSQL")


def find_pg_bin() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl``: the ``pgserver`` wheel's, else the machine's."""
    wheel = _wheel_install()
    if wheel is not None:
        return wheel / "bin"
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(os.path.realpath(on_path)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[-3]))
    if not versions:
        raise RuntimeError(
            "PostgreSQL server binaries not found: install the test extra (pip install '.[test]', which "
            "brings the pgserver wheel) or the machine's postgresql package"
        )
    return Path(versions[-1]).parent


def _as_server_user(cmd: list[str]) -> list[str]:
    user = _server_user()
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


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
    user = _server_user()
    if user is not None:
        if _wheel_install() is not None:
            # the wheel lives under a folder the server's user may not enter (a root-owned checkout
            # or virtualenv): its tree is copied beside the data with the libraries auditwheel put
            # in pgserver.libs, keeping the binaries' relative rpath ($ORIGIN/../../../pgserver.libs)
            site = pg_bin.parents[2]
            shutil.copytree(pg_bin.parent, root / "wheel" / "pgserver" / "pginstall", symlinks=True)
            if (site / "pgserver.libs").is_dir():
                shutil.copytree(site / "pgserver.libs", root / "wheel" / "pgserver.libs", symlinks=True)
            pg_bin = root / "wheel" / "pgserver" / "pginstall" / "bin"
        for path in (root, *root.rglob("*")):
            shutil.chown(path, user)
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
