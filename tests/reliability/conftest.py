"""Servers for the reliability tests: the lying fake SGLang worker and frontends in front of it.

Every server is a subprocess on a free localhost port (so a stalled event loop in the frontend
cannot stall the test that measures it), started by waiting on its address line and health, and
stopped at the end of the module.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.servers import Server, start_frontend, stop_process

HERE = Path(__file__).resolve().parent
_ADDRESS = re.compile(r"listening on (http://[0-9.]+:\d+)")


def start_fake_worker(*flags: str) -> Server:
    """Run ``fake_worker.py`` (with ``flags``, such as ``--mute``) and wait for its address."""
    fd, name = tempfile.mkstemp(prefix="dsfe-fake-worker-", suffix=".log")
    log_path = Path(name)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fake_worker.py"), "--port", "0", *flags],
        stdout=fd,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    os.close(fd)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fake worker exited: {log_path.read_text()}")
        match = _ADDRESS.search(log_path.read_text())
        if match:
            return Server(proc, match.group(1), log_path, ["fake-worker"])
        time.sleep(0.02)
    stop_process(proc)
    raise RuntimeError("fake worker did not start")


def set_fault(worker: Server, mode: str, **settings: object) -> None:
    """Make every later ``/generate`` of ``worker`` behave as ``mode`` (see fake_worker.py)."""
    r = httpx.post(worker.url + "/fault", json={"mode": mode, **settings}, timeout=5)
    assert r.status_code == 200


def worker_stats(worker: Server) -> dict[str, int]:
    return httpx.get(worker.url + "/stats", timeout=5).json()


@pytest.fixture(scope="module")
def fake_worker() -> Iterator[Server]:
    worker = start_fake_worker()
    try:
        yield worker
    finally:
        worker.stop()
        worker.log_path.unlink(missing_ok=True)


@pytest.fixture
def healthy_worker(fake_worker: Server) -> Server:
    """The module's fake worker, reset to behave."""
    set_fault(fake_worker, "ok", tokens=8, itl_ms=0)
    return fake_worker


def frontend_for(worker: Server, *flags: str) -> Server:
    """``serve --worker <worker>`` with ``flags``, health probes every 0.2 s."""
    return start_frontend("--worker", worker.url, "--health-check-interval", "0.2", *flags)


@pytest.fixture(scope="module")
def frontend(fake_worker: Server) -> Iterator[Server]:
    """A frontend with default settings in front of the module's fake worker; a module that needs
    flags defines its own ``frontend``."""
    server = frontend_for(fake_worker)
    try:
        yield server
    finally:
        server.stop()
