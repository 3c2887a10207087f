#!/usr/bin/env bash
# CI stage: the real agent CLIs (Claude Code, Codex) against `deepseek-frontend serve` (simulated engine).
#
# Installs the pinned CLIs with npm, each version into its own prefix under .ci/agent-clis (or
# $AGENT_CLIS_PREFIX), then runs the agent_cli tests, which start the server behind a logging proxy on
# loopback ports and run each CLI non-interactively through a whole tool loop. Claude Code is pinned twice:
# the newest release (which uses tool search by default) and the older release users still run; every
# Claude Code test runs against each (CLAUDE_CODE_BINS). Expects the test extras installed
# (`pip install '.[test]'`) in the active Python environment.
set -euo pipefail
cd "$(dirname "$0")/.."

# newest first; `npm view @anthropic-ai/claude-code version` / `npm view @openai/codex version`
CLAUDE_CODE_VERSIONS="2.1.332 2.1.197"
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
CLAUDE_CODE_BINS=""
for version in $CLAUDE_CODE_VERSIONS; do
    # Claude Code ships a native executable as bin/claude.exe (npm does not need to run its
    # postinstall script for it to work); one prefix per version keeps the two apart.
    npm install --global --prefix "$PREFIX/claude-code-$version" --no-save "@anthropic-ai/claude-code@$version"
    bin="$PREFIX/claude-code-$version/bin/claude"
    "$bin" --version | grep -qF "$version" || { echo "claude-code-$version: wrong version installed" >&2; exit 1; }
    "$bin" --version
    CLAUDE_CODE_BINS="${CLAUDE_CODE_BINS:+$CLAUDE_CODE_BINS:}$bin"
done
export CLAUDE_CODE_BINS
npm install --global --prefix "$PREFIX/codex-$CODEX_VERSION" --no-save "@openai/codex@${CODEX_VERSION}"

export PATH="$PREFIX/codex-$CODEX_VERSION/bin:$PATH"
codex --version

python -m pytest -m agent_cli tests/agent_clis -p no:cacheprovider "$@"
