"""``serve`` refuses to start on an explicit ``--state-store`` it cannot write: one line on stderr,
exit status 2, before anything is bound or loaded (docs/serving.md, "Stored responses and
conversations"). The file is made immutable with ``chattr +i``, which binds root too."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from deepseek_frontend.state import open_store_url
from tests.support.servers import free_port


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "deepseek_frontend", "serve", "--port", "0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_a_read_only_state_store_file_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"

    async def make() -> None:
        await (await open_store_url(f"sqlite:///{path}")).close()

    asyncio.run(make())
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode != 0:
        pytest.skip("chattr +i is not available on this file system")
    try:
        out = _serve("--state-store", f"sqlite:///{path}")
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [
        f"deepseek-frontend serve: --state-store sqlite:///{path} cannot be opened for writing: "
        "OperationalError: attempt to write a readonly database"
    ]


def test_an_unreachable_postgres_store_stops_the_start() -> None:
    url = f"postgresql://app:hunter2@127.0.0.1:{free_port()}/state"  # nothing listens there
    out = _serve("--state-store", url)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be opened for writing" in lines[0] and "hunter2" not in lines[0]
