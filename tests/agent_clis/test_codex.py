"""Codex (``codex exec``) runs a whole tool loop against the frontend's Responses API.

Codex reads a custom model provider from ``$CODEX_HOME/config.toml`` (``wire_api =
"responses"``). Its default session declares a ``namespace`` tool and hosted tools such as
``web_search``, which the frontend flattens and drops (``--hosted-tools drop``). The prompt
names Codex's ``exec_command`` tool, so the simulated model calls it with the prompt's words as
the command (``echo exec_command``: the simulated model reads past Codex's
``<environment_context>`` block); Codex runs it (no sandbox: the test's temp folder is the
sandbox), sends the output back as a ``function_call_output`` and gets a text answer quoting
it; it must exit 0.
"""

from __future__ import annotations

import json

import pytest

from tests.support.logging_proxy import LoggingProxy

from .conftest import API_KEY, SERVED_MODEL, cli_path, offline_env, run_cli

pytestmark = pytest.mark.agent_cli

TIMEOUT_S = 180


def write_config(codex_home, base_url: str) -> None:  # type: ignore[no-untyped-def]
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'''model = "{SERVED_MODEL}"
model_provider = "dsfe"
check_for_update_on_startup = false

[model_providers.dsfe]
name = "deepseek-frontend"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "DSFE_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
''',
        encoding="utf-8",
    )


def test_codex_exec_completes_a_tool_loop(proxy: LoggingProxy, sandbox: dict) -> None:
    codex = cli_path("codex")
    codex_home = sandbox["home"] / ".codex"
    write_config(codex_home, proxy.url)
    env = offline_env(sandbox["home"])
    env.update({"CODEX_HOME": str(codex_home), "DSFE_API_KEY": API_KEY, "RUST_LOG": "error"})
    proc, context = run_cli(
        "codex",
        [
            codex,
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--ephemeral",
            "--dangerously-bypass-approvals-and-sandbox",
            "echo exec_command",
        ],
        sandbox["work"],
        env,
        proxy,
        TIMEOUT_S,
    )
    assert proc.returncode == 0, context
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert any(e.get("type") == "turn.completed" for e in events), context
    runs = [
        e["item"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "command_execution"
    ]
    assert runs and runs[0]["exit_code"] == 0 and "exec_command" in runs[0]["aggregated_output"], context
    answers = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    assert answers and "exec_command" in answers[-1], context

    posts = [e for e in proxy.exchanges if e.path.startswith("/v1/responses") and e.method == "POST"]
    assert posts and all(e.status == 200 for e in posts), context
    # the model called a tool, Codex ran it and sent the output back under the call's id
    called = {
        item["call_id"]
        for e in posts
        for line in e.response_text.splitlines()
        if line.startswith("data: ") and '"response.output_item.done"' in line
        for item in [json.loads(line[6:])["item"]]
        if item.get("type") == "function_call"
    }
    outputs = {
        item.get("call_id")
        for e in posts
        for item in (e.body or {}).get("input", [])
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }
    assert called and called <= outputs, context
    # Codex's default session declares a namespace tool and a hosted web_search: both are accepted
    first = posts[0].body or {}
    kinds = {tool.get("type") for tool in first.get("tools", [])}
    assert {"namespace", "web_search"} <= kinds, context
