"""``deepseek-frontend sim-engine`` as a separate process on a free port."""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from deepseek_frontend.engines.sglang import SGLangClient

from .conftest import collect, prompt_ids, request_for

STARTUP_TIMEOUT_S = 60.0


@contextmanager
def sim_engine_process(*flags: str) -> Iterator[str]:
    """Start ``sim-engine --port 0``, wait for its listening line, yield the URL, then stop it."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deepseek_frontend",
            "sim-engine",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        output = []
        while True:
            try:
                line = lines.get(timeout=STARTUP_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(f"sim-engine did not start: {''.join(output)}") from None
            output.append(line)
            if line.startswith("sim-engine listening on "):
                yield line.removeprefix("sim-engine listening on ").strip()
                break
            if proc.poll() is not None:
                raise AssertionError(f"sim-engine exited: {''.join(output)}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_sim_engine_process_serves_generate_on_the_port_it_prints(tokenizer: Any) -> None:
    ids = prompt_ids("Reply with exactly: from another process")
    with sim_engine_process("--tokens-per-chunk", "2", "--cumulative") as url:
        assert not url.endswith(":0")
        assert httpx.get(url + "/health_generate", timeout=10).status_code == 200

        async def scenario() -> list[int]:
            client = SGLangClient(url)
            try:
                out, _ = await collect(client, request_for(ids))
                return out
            finally:
                await client.aclose()

        out = asyncio.run(scenario())
        assert tokenizer.decode(out) == "from another process<｜end▁of▁sentence｜>"
        info = httpx.get(url + "/get_server_info", timeout=10).json()
        assert info["incremental_streaming_output"] is False
        assert httpx.get(url + "/sim/stats", timeout=10).json()["finished"] == 1


@pytest.mark.slow
def test_sim_engine_fail_after_zero_reports_unhealthy() -> None:
    with sim_engine_process("--fail-after", "0", "--fail-mode", "http-500") as url:
        assert httpx.get(url + "/health_generate", timeout=10).status_code == 503
        response = httpx.post(url + "/generate", json={"input_ids": [1, 2], "stream": True}, timeout=10)
        assert response.status_code == 500
