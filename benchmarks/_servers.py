"""Processes the benchmarks start: a free localhost port for one, and waiting until it is healthy.

Benchmark scripts run as ``python benchmarks/bench_x.py``, so this folder is on ``sys.path``
and they import this module as ``_servers``; it puts the repository root there too, for
:func:`tests.support.servers.free_port`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.servers import free_port  # noqa: E402

__all__ = ["free_port", "wait_healthy"]


def wait_healthy(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0, poll_s: float = 0.1
) -> None:
    """Return once ``GET url/health`` answers 200; RuntimeError with the end of ``log`` when ``proc``
    exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{log} exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(poll_s)
    raise RuntimeError(
        f"{url} never became healthy within {timeout_s:g} s:\n{log.read_text(errors='replace')[-3000:]}"
    )
