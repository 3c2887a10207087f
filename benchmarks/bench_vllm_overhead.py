"""The frontend's added latency over calling vLLM directly, same prompt, interleaved.

Usage (needs a Python with vLLM, e.g. the real-engine stage's virtualenv)::

    .venv-vllm/bin/python benchmarks/bench_vllm_overhead.py              # starts its own tiny vLLM
    .venv-vllm/bin/python benchmarks/bench_vllm_overhead.py --quick
    python benchmarks/bench_vllm_overhead.py --vllm-url http://127.0.0.1:8001 --worker-model NAME

What runs: one vLLM server (unless ``--vllm-url``: by default the tiny random-weight Llama of
``tests/real_engine/make_tiny_model.py`` with ``--load-format dummy``, our DeepSeek-V4 tokenizer,
``--enable-scale-out``), and one ``deepseek-frontend serve --engine vllm`` in front of it. The
prompt is one chat request (thinking off, greedy); ``deepseek-frontend tokenize`` gives its token
ids. Each round sends it both ways, in alternating order so that neither path always runs on a
warmer server:

* **direct** -- ``POST /inference/v1/generate`` to vLLM with those ids and the sampling settings
  the frontend itself sends (streamed, token ids only): the engine's own cost.
* **frontend** -- ``POST /v1/chat/completions`` to the frontend (streamed): render + tokenize +
  the HTTP hop to vLLM + detokenize + parse + SSE.

Metrics, per ``max_tokens`` row, medians over the rounds: **TTFT** (request sent -> first
token-bearing event), **total** (request sent -> stream closed), **added** = frontend - direct,
**ratio** = frontend / direct. Both paths must produce the same number of completion tokens
(greedy decoding of the same ids); a row where they differ is reported, not averaged away.
The client is one synchronous ``httpx`` connection per path, so the figures are single-request
latency, not throughput (``bench_serving.py`` measures that).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.real_engine.make_tiny_model import write_tiny_model  # noqa: E402

from _servers import free_port, wait_healthy  # noqa: E402

SERVED = "deepseek-v4-flash"
MESSAGES = [{"role": "user", "content": "Write a short note about the harbour and the boats in it."}]
ROWS = (1, 32, 128)


def start(
    cmd: list[str], url: str, timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    fd, name = tempfile.mkstemp(prefix="bench-vllm-", suffix=".log")
    proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env)
    os.close(fd)
    try:
        wait_healthy(url, proc, Path(name), timeout_s, poll_s=0.5)
    except RuntimeError as err:
        sys.exit(str(err))
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def prompt_ids(max_tokens: int) -> list[int]:
    """The ids the frontend sends for the benchmark request (``deepseek-frontend tokenize --json``)."""
    body = {"model": SERVED, "messages": MESSAGES, "thinking": {"type": "disabled"}, "max_tokens": max_tokens}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(body, f)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "deepseek_frontend.cli", "tokenize", "--json", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(f.name)
    return list(json.loads(out)["ids"])


def timed_stream(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float, int]:
    """(TTFT s, total s, completion tokens) of one streamed request; both APIs end with a usage event."""
    sent = time.perf_counter()
    first = None
    tokens = 0
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if first is None and any(
                c.get("token_ids") or (c.get("delta") or {}).get("content")
                for c in event.get("choices") or ()
            ):
                first = time.perf_counter()
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    done = time.perf_counter()
    return (first or done) - sent, done - sent, tokens


def measure(vllm_url: str, frontend_url: str, worker_model: str, rounds: int) -> list[dict[str, Any]]:
    rows = []
    with httpx.Client(timeout=120.0) as direct_client, httpx.Client(timeout=120.0) as front_client:
        for max_tokens in ROWS:
            ids = prompt_ids(max_tokens)
            direct_body = {
                "model": worker_model,
                "token_ids": ids,
                "sampling_params": {
                    "max_tokens": max_tokens,
                    "temperature": 0.0,
                    "skip_special_tokens": False,
                    "detokenize": False,
                    "stop_token_ids": [1],
                },
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            front_body = {
                "model": SERVED,
                "messages": MESSAGES,
                "thinking": {"type": "disabled"},
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            paths = {
                "direct": (direct_client, vllm_url + "/inference/v1/generate", direct_body),
                "frontend": (front_client, frontend_url + "/v1/chat/completions", front_body),
            }
            for client, url, body in paths.values():  # warm-up, not measured
                timed_stream(client, url, body)
            samples: dict[str, list[tuple[float, float, int]]] = {"direct": [], "frontend": []}
            for i in range(rounds):
                order = ("direct", "frontend") if i % 2 == 0 else ("frontend", "direct")
                for name in order:
                    client, url, body = paths[name]
                    samples[name].append(timed_stream(client, url, body))
            row: dict[str, Any] = {"max_tokens": max_tokens, "prompt_tokens": len(ids)}
            for name, values in samples.items():
                row[f"{name}_ttft"] = statistics.median(v[0] for v in values) * 1000
                row[f"{name}_total"] = statistics.median(v[1] for v in values) * 1000
                row[f"{name}_tokens"] = sorted({v[2] for v in values})
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-url", help="a running vLLM (0.32+, --enable-scale-out); default: start one")
    parser.add_argument("--worker-model", default="tiny", help="the model name that vLLM serves")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="10 rounds")
    args = parser.parse_args()
    rounds = 10 if args.quick else args.rounds

    procs: list[subprocess.Popen[bytes]] = []
    try:
        vllm_url = args.vllm_url
        max_model_len = 2048
        if vllm_url is None:
            model_dir = write_tiny_model(tempfile.mkdtemp(prefix="bench-tiny-"))
            port = free_port()
            vllm_url = f"http://127.0.0.1:{port}"
            env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
            cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
            cmd += ["--served-model-name", args.worker_model, "--load-format", "dummy", "--enforce-eager"]
            cmd += ["--max-model-len", str(max_model_len), "--enable-scale-out", "--port", str(port)]
            cmd += ["--host", "127.0.0.1"]
            procs.append(start(cmd, vllm_url, 600.0, env))
        front_port = free_port()
        frontend_url = f"http://127.0.0.1:{front_port}"
        cmd = [
            sys.executable,
            "-m",
            "deepseek_frontend.cli",
            "serve",
            "--engine",
            "vllm",
            "--worker",
            vllm_url,
        ]
        cmd += ["--served-model-name", SERVED, "--worker-model", args.worker_model, "--port", str(front_port)]
        cmd += ["--context-length", str(max_model_len)]
        procs.append(start(cmd, frontend_url, 60.0))
        rows = measure(vllm_url, frontend_url, args.worker_model, rounds)
    finally:
        for proc in reversed(procs):
            stop(proc)

    print(f"rounds per row: {rounds} (medians, ms)\n")
    print(
        "| max_tokens | prompt tokens | direct TTFT | frontend TTFT | added TTFT | direct total | "
        "frontend total | added total | ratio total | completion tokens (direct / frontend) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['max_tokens']} | {r['prompt_tokens']} | {r['direct_ttft']:.1f} | "
            f"{r['frontend_ttft']:.1f} | {r['frontend_ttft'] - r['direct_ttft']:.1f} | "
            f"{r['direct_total']:.1f} | "
            f"{r['frontend_total']:.1f} | {r['frontend_total'] - r['direct_total']:.1f} | "
            f"{r['frontend_total'] / r['direct_total']:.2f} | {r['direct_tokens']} / {r['frontend_tokens']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
