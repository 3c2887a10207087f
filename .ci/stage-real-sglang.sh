#!/usr/bin/env bash
# CI stage: the frontend against a real SGLang (0.5.23, pinned) on the CPU, aggregated and prefill/decode,
# serving a tiny random-weight Llama that carries our bundled DeepSeek-V4 tokenizer. Runs
# `pytest -m real_engine` on the SGLang modules of tests/real_engine, in the order that starts each server set-up
# once: the aggregated server's APIs, the smoke tests (aggregated, then the prefill/decode pair), the pair's APIs.
#
# SGLang's wheel declares a CUDA build (torch 2.14.1, sglang-kernel, flashinfer, ...), so the virtualenv
# (.venv-sglang in the checkout, git-ignored) gets SGLang with --no-deps, the CPU torch, the plain-Python
# packages SGLang imports (.ci/sglang-requirements.txt), Mooncake's non-CUDA transfer engine for the
# prefill/decode pair, and import-only stand-ins for sgl_kernel and torchvision (.ci/sglang-standins);
# .ci/sglang-constraints.txt keeps pip from swapping in CUDA builds. It is reused when it already holds the
# pinned SGLang and torch (a developer re-running the stage); a fresh clone builds it (about 3 GB).
#
# Environment: REAL_SGLANG_VENV overrides the virtualenv path.
set -euo pipefail
cd "$(dirname "$0")/.."

SGLANG_VERSION="0.5.23"
TORCH_VERSION="2.13.0+cpu"
VENV="${REAL_SGLANG_VENV:-.venv-sglang}"
CONSTRAINTS=".ci/sglang-constraints.txt"
started=$(date +%s)
# pip's and apt's chatter goes here, shown on failure
LOG="$(mktemp)"
STANDINS="$(mktemp -d)"
trap 'status=$?; if [ $status -ne 0 ] && [ -s "$LOG" ]; then echo "install output:"; tail -n 40 "$LOG"; fi; rm -rf "$LOG" "$STANDINS"' EXIT

# Mooncake's transfer engine links libibverbs even when it moves data over TCP
if ! ldconfig -p | grep -q 'libibverbs\.so\.1 '; then
    echo "real-SGLang stage: installing Debian's libibverbs1 (Mooncake's transfer engine links it)"
    apt-get update -qq >>"$LOG" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >>"$LOG" 2>&1
fi

pinned() {  # pinned PACKAGE VERSION: the virtualenv holds exactly that version
    # grep reads all of pip's output: with -q it could exit first and fail the pipe (pipefail)
    "$VENV/bin/python" -m pip show "$1" 2>/dev/null | grep -xF "Version: $2" >/dev/null
}
if [ ! -x "$VENV/bin/python" ] || ! pinned sglang "$SGLANG_VERSION" || ! pinned torch "$TORCH_VERSION"; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip setuptools >>"$LOG" 2>&1
    # the CPU build first, so nothing later resolves torch to anything else
    "$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" "torch==$TORCH_VERSION" >>"$LOG" 2>&1
    "$VENV/bin/python" -m pip install --quiet --no-deps "sglang==$SGLANG_VERSION" >>"$LOG" 2>&1
fi
# the stand-ins, from a copy (setuptools writes build/ and *.egg-info/ next to the sources), every run so an
# edit to them takes effect
cp -r .ci/sglang-standins/sgl_kernel .ci/sglang-standins/torchvision "$STANDINS/"
# the placeholder machinery both stand-ins share, kept once in the tree
cp .ci/sglang-standins/_standin.py "$STANDINS/sgl_kernel/sgl_kernel/_standin.py"
cp .ci/sglang-standins/_standin.py "$STANDINS/torchvision/torchvision/_standin.py"
"$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation --force-reinstall \
    "$STANDINS/sgl_kernel" "$STANDINS/torchvision" >>"$LOG" 2>&1
# our package without its dependency resolution, then its runtime dependencies as pyproject.toml lists them,
# resolved together with SGLang's so pip picks versions both accept, and what the tests import
"$VENV/bin/python" -m pip install --quiet --no-deps -e . >>"$LOG" 2>&1
"$VENV/bin/python" - >"$VENV/frontend-requirements.txt" <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PY
"$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" -r .ci/sglang-requirements.txt \
    -r "$VENV/frontend-requirements.txt" "pytest>=8" "pytest-timeout>=2.3" >>"$LOG" 2>&1
echo "real-SGLang stage: environment ready after $(($(date +%s) - started)) s ($(du -sh "$VENV" | cut -f1) in $VENV)"
# from here on a failure is the tests', not the installers'
: >"$LOG"

"$VENV/bin/python" -m pytest -m real_engine tests/real_engine/test_sglang_apis.py \
    tests/real_engine/test_sglang_smoke.py tests/real_engine/test_sglang_pd_apis.py -p no:cacheprovider \
    --durations=8 "$@"
echo "real-SGLang stage: done after $(($(date +%s) - started)) s"
