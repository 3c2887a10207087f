"""Claude Code (``claude -p``) runs a whole tool loop against the frontend's Anthropic API.

Claude Code is pointed at the server root (``ANTHROPIC_BASE_URL`` without ``/v1``: it appends
``/v1/messages`` itself) under a ``claude-*`` model alias, with its default tool set. The prompt
names Claude Code's ``TaskList`` tool, which makes the simulated model call it
(engines/sim/model.py rules: a prompt naming a declared tool gets a call with schema-valid
arguments). TaskList takes no arguments and needs no permission in print mode, so the call
succeeds whatever the simulated model writes. The run must go: tool call -> Claude Code runs
TaskList -> its ``tool_result`` comes back in the next request -> a text answer -> exit 0.
"""

from __future__ import annotations

import json

import pytest

from tests.support.logging_proxy import LoggingProxy

from .conftest import API_KEY, cli_path, offline_env, run_cli

pytestmark = pytest.mark.agent_cli

MODEL = "claude-sonnet-4-5"
TIMEOUT_S = 180


def test_claude_code_print_mode_completes_a_tool_loop(proxy: LoggingProxy, sandbox: dict) -> None:
    claude = cli_path("claude")
    env = offline_env(sandbox["home"])
    env.update(
        {
            "ANTHROPIC_BASE_URL": proxy.url,
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_MODEL": MODEL,
            "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
            "CLAUDE_CONFIG_DIR": str(sandbox["home"] / ".claude"),
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_BUG_COMMAND": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
            "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
            "IS_SANDBOX": "1",
        }
    )
    proc, context = run_cli(
        "claude",
        [claude, "-p", "TaskList", "--output-format", "stream-json", "--verbose"],
        sandbox["work"],
        env,
        proxy,
        TIMEOUT_S,
    )
    assert proc.returncode == 0, context
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    # the model's call, executed by Claude Code, and its result accepted as the next turn's input
    calls = [
        block
        for e in events
        if e.get("type") == "assistant"
        for block in e["message"]["content"]
        if block.get("type") == "tool_use"
    ]
    assert any(c["name"] == "TaskList" for c in calls), context
    results = [
        block
        for e in events
        if e.get("type") == "user"
        for block in e["message"]["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    assert results and not any(r.get("is_error") for r in results), context
    final = [e for e in events if e.get("type") == "result"]
    assert final and final[-1].get("subtype") == "success" and not final[-1].get("is_error"), context

    messages = [e for e in proxy.exchanges if e.path.startswith("/v1/messages") and e.method == "POST"]
    assert all(e.status == 200 for e in messages), context
    # the request after the call carries the tool_result for the call's id
    call_ids = {c["id"] for c in calls}
    sent_back = [
        block
        for e in messages
        for m in (e.body or {}).get("messages", [])
        if isinstance(m.get("content"), list)
        for block in m["content"]
        if block.get("type") == "tool_result"
    ]
    assert {b["tool_use_id"] for b in sent_back} & call_ids, context
    # every answer echoes the alias Claude Code asked for (else it drops thinking blocks)
    assert all(
        f'"model":"{MODEL}"' in e.response_text or f'"model": "{MODEL}"' in e.response_text
        for e in messages
        if e.body and e.body.get("model") == MODEL
    ), context
