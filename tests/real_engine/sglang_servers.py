"""Real SGLang workers for the ``real_engine`` tests (run by ``.ci/stage-real-sglang.sh``).

SGLang 0.5.23 runs on the CPU here (``SGLANG_USE_CPU_ENGINE=1``, ``--device cpu``, the ``torch_native``
attention backend, no CUDA graphs, no overlap scheduler), in the virtualenv the stage builds: SGLang without
its CUDA dependencies, the CPU torch, and import-only stand-ins for ``sgl_kernel`` and ``torchvision``
(.ci/sglang-standins/README.md). Every server serves the tiny Llama of
:mod:`tests.real_engine.make_tiny_model` with the seeded weights of :mod:`tests.real_engine.random_weights`
(``--load-format auto``): SGLang's ``--load-format dummy`` weights make a near-uniform model whose greedy
continuation ignores most of the prompt, so "the disaggregated decode answers like the aggregated server"
could not fail on a wrong KV transfer.

Two set-ups, the ones ``serve --engine sglang`` is deployed over:

* aggregated: one server that publishes its KV cache events on ZMQ (``--kv-events-config`` with
  ``"bind": true``, so the PUB socket binds the port and a subscriber such as the frontend's KV router
  connects to it);
* prefill/decode: a ``--disaggregation-mode prefill`` and a ``decode`` server moving the KV cache over
  Mooncake's TCP transport (``--disaggregation-transfer-backend mooncake_tcp``, PyPI
  ``mooncake-transfer-engine-non-cuda``). Two CPU-only settings it needs: the decode server backs retracted
  requests up to a CPU tensor (``--disaggregation-decode-retraction-backup cpu_tensor``), and the prefill
  server runs with ``SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER=1``. Without the latter SGLang 0.5.23's
  prefill hands the Mooncake sender its page indices through pinned host memory and a CUDA event
  (``disaggregation/prefill.py``, ``_send_kv_chunk``, taken whenever the sender says
  ``supports_host_tensor_indices``); on a machine without CUDA that raises ``RuntimeError: pin_memory=True
  requires a CUDA or other accelerator backend`` on the first transfer and the prefill scheduler dies. The
  setting makes it take the plain path instead; with a context-parallel size of 1 it changes nothing else
  (the one CP rank is every CP rank).

The servers are started on demand by :class:`SGLangFleet`, which keeps at most two alive (the machine has
two cores; a server the next test does not need is stopped first), each on free localhost ports, logging to
a file that a failure shows, waited for on ``/health`` with a bound, and stopped with SIGTERM (SGLang then
stops its scheduler and detokenizer processes) or, past a bound, SIGKILL to its whole process group.

The tests import nothing of SGLang: they talk HTTP to the servers, which run under this interpreter. Under
an interpreter without SGLang (the vLLM stage also collects ``tests/real_engine``) the fixtures skip.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.real_engine.make_tiny_model import write_tiny_model
from tests.real_engine.random_weights import write_random_llama_weights
from tests.support.servers import free_engine_port, stop_process_group

#: the name the workers serve the tiny model under (SGLang's /generate names no model; /v1/models says it)
SGLANG_WORKER_MODEL = "tiny"
#: the workers' context length (the frontend's --context-length must not exceed it)
SGLANG_CONTEXT_LENGTH = 2048
#: tokens of KV cache per server (SGLang's default is a fraction of all free memory: 13 GB here, 35 s to
#: allocate)
SGLANG_KV_TOKENS = 16384
#: seconds a server may take to become healthy: about 30-50 s alone on two idle cores, 100-200 s for a
#: prefill/decode pair starting together on a busy machine
SGLANG_START_TIMEOUT_S = 600.0
#: seconds SIGTERM may take (a disaggregated server takes about 25 s) before its process group is killed
SGLANG_STOP_TIMEOUT_S = 60.0
#: at most this many SGLang servers run at once
MAX_ALIVE = 2

#: flags every server gets: the CPU path, and the worker settings the frontend's docs ask for
COMMON_FLAGS: tuple[str, ...] = (
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--sampling-backend",
    "pytorch",
    "--cuda-graph-backend-decode",
    "disabled",
    "--cuda-graph-backend-prefill",
    "disabled",
    "--disable-overlap-schedule",
    # the warm-up request would cost a few seconds of every start and tests nothing
    "--skip-server-warmup",
    # the scheduler otherwise polls at full speed while idle: half a core per server on this machine
    "--sleep-on-idle",
    # each streamed chunk carries only the new ids (the frontend copes with both forms; this is the recipe's)
    "--incremental-streaming-output",
    "--context-length",
    str(SGLANG_CONTEXT_LENGTH),
    "--max-total-tokens",
    str(SGLANG_KV_TOKENS),
    "--served-model-name",
    SGLANG_WORKER_MODEL,
    # /metrics: sglang:num_aborted_requests_total, sglang:num_running_reqs (the abort tests read them)
    "--enable-metrics",
    # compact JSON for json_schema constraints: xgrammar's default lets a constrained model write whitespace
    # without end, which the random-weight model does (docs/serving.md)
    "--constrained-json-disable-any-whitespace",
)


def sglang_available() -> bool:
    """Whether this interpreter can run an SGLang server (the SGLang stage's virtualenv)."""
    return importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("torch") is not None


@dataclass
class SGLangServer:
    """One launched ``python -m sglang.launch_server``."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    #: the ZMQ port of its KV event publisher, when it has one
    kv_events_port: int | None = None
    #: the port of its disaggregation bootstrap server (a prefill server)
    bootstrap_port: int | None = None
    started_at: float = field(default_factory=time.monotonic)
    #: seconds from launch to a healthy ``/health``
    start_seconds: float | None = None

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_healthy(self, timeout_s: float = SGLANG_START_TIMEOUT_S) -> None:
        """Poll ``/health`` until 200; fail with the server's log if it exits or the time runs out."""
        deadline = self.started_at + timeout_s
        while self.start_seconds is None:
            if self.proc.poll() is not None:
                pytest.fail(f"SGLang ({self.name}) exited with {self.proc.returncode}:\n{self.log()[-8000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"SGLang ({self.name}) not healthy within {timeout_s:g} s:\n{self.log()[-8000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/health", timeout=5.0).status_code == 200:
                    self.start_seconds = time.monotonic() - self.started_at
                    return
            time.sleep(0.5)

    def server_info(self) -> dict[str, Any]:
        response = httpx.get(self.url + "/server_info", timeout=30.0)
        response.raise_for_status()
        return response.json()

    def generate(self, input_ids: Sequence[int], max_new_tokens: int, **extra: Any) -> dict[str, Any]:
        """One greedy, non-streamed ``/generate`` on token ids (``extra`` adds top-level fields)."""
        body = {
            "input_ids": list(input_ids),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens},
            **extra,
        }
        response = httpx.post(self.url + "/generate", json=body, timeout=120.0)
        assert response.status_code == 200, f"{self.name}: {response.status_code} {response.text}"
        return response.json()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the process group (the scheduler and detokenizer too) past the bound."""
        stop_process_group(self.proc, SGLANG_STOP_TIMEOUT_S)


def launch_sglang(
    model_dir: Path,
    name: str,
    *,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    kv_events_port: int | None = None,
    bootstrap_port: int | None = None,
) -> SGLangServer:
    """Start an SGLang server for ``model_dir`` on a free port (not waiting for it).

    ``extra_args`` / ``extra_env`` add flags and environment; ``kv_events_port`` / ``bootstrap_port`` are only
    recorded on the returned server (the caller puts them into ``extra_args``).
    """
    port = free_engine_port()
    fd, log_name = tempfile.mkstemp(prefix=f"sglang-{name}-", suffix=".log")
    env = {
        **os.environ,
        "SGLANG_USE_CPU_ENGINE": "1",
        # every address SGLang advertises (bootstrap, Mooncake sessions) on loopback, not a probed interface
        "SGLANG_HOST_IP": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_dir),
        "--load-format",
        "auto",
        *COMMON_FLAGS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra_args,
    ]
    proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    os.close(fd)
    return SGLangServer(
        name,
        proc,
        f"http://127.0.0.1:{port}",
        Path(log_name),
        kv_events_port=kv_events_port,
        bootstrap_port=bootstrap_port,
    )


def kv_events_config(port: int) -> str:
    """``--kv-events-config`` for a ZMQ publisher on ``port``: SGLang's ``KVEventsConfig`` JSON
    (``disaggregation/kv_events.py``); ``"bind": true`` makes the PUB socket bind, so subscribers connect."""
    return json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv", "bind": True})


@dataclass(frozen=True)
class SGLangPair:
    """A prefill and a decode server joined by Mooncake over TCP."""

    prefill: SGLangServer
    decode: SGLangServer

    def bootstrap(self, room: int) -> dict[str, Any]:
        """The fields both legs of a disaggregated request carry (SGLang's bootstrap handshake)."""
        assert self.prefill.bootstrap_port is not None
        return {
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": self.prefill.bootstrap_port,
            "bootstrap_room": room,
        }


def launch_aggregated(model_dir: Path, *extra_args: str) -> SGLangServer:
    """The aggregated server, publishing KV events on a free port."""
    events = free_engine_port()
    return launch_sglang(
        model_dir,
        "aggregated",
        extra_args=("--kv-events-config", kv_events_config(events), *extra_args),
        kv_events_port=events,
    )


def launch_pd_pair(model_dir: Path) -> SGLangPair:
    """A prefill and a decode server (not waiting for them)."""
    bootstrap = free_engine_port()
    transfer = ("--disaggregation-transfer-backend", "mooncake_tcp")
    prefill = launch_sglang(
        model_dir,
        "prefill",
        extra_args=(
            "--disaggregation-mode",
            "prefill",
            *transfer,
            "--disaggregation-bootstrap-port",
            str(bootstrap),
        ),
        # see the module docstring: no pinned-memory page indices on the CPU
        extra_env={"SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": "1"},
        bootstrap_port=bootstrap,
    )
    decode = launch_sglang(
        model_dir,
        "decode",
        extra_args=(
            "--disaggregation-mode",
            "decode",
            *transfer,
            "--disaggregation-decode-retraction-backup",
            "cpu_tensor",
        ),
    )
    return SGLangPair(prefill, decode)


class SGLangFleet:
    """The session's SGLang servers, started when a test first needs them and kept while later tests do.

    At most :data:`MAX_ALIVE` run at once: asking for the pair stops the aggregated server and the other way
    round, so tests that use the same set-up should sit together. Each server's log is kept until the end of
    the session (shown when a start fails); :meth:`stop_all` stops everything.
    """

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self._aggregated: SGLangServer | None = None
        self._pair: SGLangPair | None = None
        self._stopped: list[SGLangServer] = []
        #: (name, seconds to healthy) of every start, for the stage's summary
        self.start_times: list[tuple[str, float]] = []

    def aggregated(self) -> SGLangServer:
        if self._aggregated is not None and not self._aggregated.alive():
            pytest.fail(f"SGLang (aggregated) died:\n{self._aggregated.log()[-8000:]}")
        if self._aggregated is None:
            self._stop_pair()
            self._aggregated = launch_aggregated(self.model_dir)
            self._healthy(self._aggregated)
        return self._aggregated

    def pd_pair(self) -> SGLangPair:
        if self._pair is not None:
            for server in (self._pair.prefill, self._pair.decode):
                if not server.alive():
                    pytest.fail(f"SGLang ({server.name}) died:\n{server.log()[-8000:]}")
        if self._pair is None:
            self._stop_aggregated()
            self._pair = launch_pd_pair(self.model_dir)
            # launched together, so their start-ups overlap
            self._healthy(self._pair.prefill)
            self._healthy(self._pair.decode)
        return self._pair

    def _healthy(self, server: SGLangServer) -> None:
        server.wait_healthy()
        assert server.start_seconds is not None
        self.start_times.append((server.name, server.start_seconds))

    def _stop_aggregated(self) -> None:
        if self._aggregated is not None:
            self._aggregated.stop()
            self._stopped.append(self._aggregated)
            self._aggregated = None

    def _stop_pair(self) -> None:
        if self._pair is not None:
            self._pair.prefill.stop()
            self._pair.decode.stop()
            self._stopped += [self._pair.prefill, self._pair.decode]
            self._pair = None

    def stop_all(self) -> None:
        self._stop_aggregated()
        self._stop_pair()
        # SGLANG_TEST_KEEP_LOGS=1 keeps the servers' logs (their paths printed) for a failure's post-mortem
        keep = os.environ.get("SGLANG_TEST_KEEP_LOGS") == "1"
        for server in self._stopped:
            if keep:
                print(f"SGLang ({server.name}) log kept: {server.log_path}")
            else:
                server.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def sglang_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with seeded weights (written once per session)."""
    if not sglang_available():
        pytest.skip("no SGLang with torch in this interpreter; .ci/stage-real-sglang.sh runs these tests")
    model = write_tiny_model(tmp_path_factory.mktemp("tiny-llama-sglang"))
    write_random_llama_weights(model)
    return model


@pytest.fixture(scope="session")
def sglang_fleet(sglang_model: Path, request: pytest.FixtureRequest) -> Iterator[SGLangFleet]:
    fleet = SGLangFleet(sglang_model)
    try:
        yield fleet
    finally:
        fleet.stop_all()
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if fleet.start_times and reporter is not None and capture is not None:
            starts = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in fleet.start_times)
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"\nSGLang start-up times: {starts}")


@pytest.fixture
def sglang_aggregated(sglang_fleet: SGLangFleet) -> SGLangServer:
    """The aggregated SGLang server (KV events on ``kv_events_port``), healthy."""
    return sglang_fleet.aggregated()


@pytest.fixture
def sglang_pd(sglang_fleet: SGLangFleet) -> SGLangPair:
    """The prefill/decode pair, both healthy."""
    return sglang_fleet.pd_pair()
