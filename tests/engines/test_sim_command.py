"""``deepseek-frontend sim-engine`` as a separate process on a free port.

The process is started by ``tests/support/servers.py`` (``--port 0``; the URL is the one the process prints
in its ``listening on`` line).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from deepseek_frontend.engines.sglang import SGLangClient
from tests.support.servers import start_sim_engine

from .conftest import collect, prompt_ids, request_for


@pytest.mark.slow
def test_sim_engine_process_serves_generate_on_the_port_it_prints(prompt_tokenizer: Any) -> None:
    ids = prompt_ids("Reply with exactly: from another process")
    with start_sim_engine("--tokens-per-chunk", "2", "--cumulative") as server:
        url = server.url
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
        assert prompt_tokenizer.decode(out) == "from another process<｜end▁of▁sentence｜>"
        info = httpx.get(url + "/get_server_info", timeout=10).json()
        assert info["incremental_streaming_output"] is False
        assert httpx.get(url + "/sim/stats", timeout=10).json()["finished"] == 1


@pytest.mark.slow
def test_sim_engine_fail_after_zero_reports_unhealthy() -> None:
    with start_sim_engine("--fail-after", "0", "--fail-mode", "http-500") as server:
        url = server.url
        assert httpx.get(url + "/health_generate", timeout=10).status_code == 503
        response = httpx.post(url + "/generate", json={"input_ids": [1, 2], "stream": True}, timeout=10)
        assert response.status_code == 500


def test_tokens_per_chunk_takes_a_number_or_a_range() -> None:
    import argparse

    from deepseek_frontend.engines.sim.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--tokens-per-chunk", "1-4"]).tokens_per_chunk == (1, 4)
    assert parser.parse_args(["--tokens-per-chunk", "3"]).tokens_per_chunk == (3, 3)
    for bad in ("4-1", "0", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--tokens-per-chunk", bad])


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--port", "--disaggregation-bootstrap-port"])
def test_a_port_in_use_is_one_line_naming_the_flag_and_exit_2(flag: str) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        pd = ["--disaggregation-mode", "prefill"]
        args = ["--port", port] if flag == "--port" else ["--port", "0", *pd, flag, port]
        proc = subprocess.run(
            [sys.executable, "-m", "deepseek_frontend", "sim-engine", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    where = "--host 127.0.0.1 --port" if flag == "--port" else flag
    assert line.startswith(f"deepseek-frontend sim-engine: cannot listen on {where} {port}: "), line
    assert "already in use" in line.lower(), line
