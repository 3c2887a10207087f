#!/usr/bin/env bash
# CI stage: the real agent CLIs (Claude Code, Codex) against `deepseek-frontend serve` (simulated engine).
#
# Installs the pinned CLIs with npm into a local prefix (.ci/agent-clis, or $AGENT_CLIS_PREFIX), then runs
# the agent_cli tests, which start the server behind a logging proxy on loopback ports and run each CLI
# non-interactively through a whole tool loop. Expects the test extras installed (`pip install '.[test]'`)
# in the active Python environment.
set -euo pipefail
cd "$(dirname "$0")/.."

CLAUDE_CODE_VERSION=2.1.197
CODEX_VERSION=0.171.0
PREFIX="${AGENT_CLIS_PREFIX:-$PWD/.ci/agent-clis}"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    # Node is on the machine image; install it from the OS packages when it is not.
    if command -v apt-get >/dev/null; then
        SUDO=""
        [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        $SUDO apt-get update -q
        $SUDO apt-get install -y -q nodejs npm
    else
        echo "node and npm are required" >&2
        exit 1
    fi
fi

# npm's own update check and funding notices are noise in CI logs.
export NPM_CONFIG_UPDATE_NOTIFIER=false NPM_CONFIG_FUND=false NPM_CONFIG_AUDIT=false
npm install --global --prefix "$PREFIX" --no-save \
    "@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION}" "@openai/codex@${CODEX_VERSION}"

export PATH="$PREFIX/bin:$PATH"
claude --version
codex --version

python -m pytest -m agent_cli tests/agent_clis -p no:cacheprovider "$@"
