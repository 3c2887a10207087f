"""Claude Code (``claude -p``) runs a whole tool loop against the frontend's Anthropic API.

Every test runs once per pinned Claude Code install (``claude_bin``, see conftest: the stage
installs the newest release and the older one users still run). Claude Code is pointed at the
server root (``ANTHROPIC_BASE_URL`` without ``/v1``: it appends ``/v1/messages`` itself) under a
``claude-*`` model alias, with its default tool set. The prompt names Claude Code's ``TaskList``
tool (no arguments, no permission needed in print mode), which makes the simulated model call it
(engines/sim/model.py rules). The run must go: tool call -> Claude Code runs TaskList -> its
``tool_result`` comes back in the next request -> a text answer -> exit 0.

With tool search (``ENABLE_TOOL_SEARCH=true``; 2.1.332 uses it by default) TaskList is a
deferred tool: only its name is in a ``<system-reminder>``, so the simulated model calls
``ToolSearch`` with ``select:TaskList`` ("Tool search" rule); Claude Code answers with a
``tool_reference`` block and declares TaskList with ``defer_loading: true``; the frontend writes
TaskList's schema into that tool result and the model calls it ("Loaded tools" rule).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.logging_proxy import Exchange, LoggingProxy
from tests.support.servers import Server, start_frontend

from .conftest import API_KEY, claude_path, offline_env, run_cli

pytestmark = pytest.mark.agent_cli

MODEL = "claude-sonnet-4-5"
TIMEOUT_S = 180


def claude_env(
    sandbox: dict, proxy: LoggingProxy, *, model: str | None = MODEL, key: str = API_KEY
) -> dict[str, str]:
    """Claude Code's environment: the proxy as its API, every model name ``model`` (None: Claude
    Code's own defaults), no telemetry; ``IS_SANDBOX=1`` lets it skip permission prompts as root."""
    env = offline_env(sandbox["home"])
    if model is not None:
        env.update(
            {
                "ANTHROPIC_MODEL": model,
                "ANTHROPIC_SMALL_FAST_MODEL": model,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
                "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
                "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            }
        )
    env.update(
        {
            "ANTHROPIC_BASE_URL": proxy.url,
            "ANTHROPIC_API_KEY": key,
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
    return env


def run_task_list(
    claude_bin: str, proxy: LoggingProxy, sandbox: dict, env: dict[str, str] | None = None, **extra_env: str
) -> tuple[list, str]:
    """``claude -p TaskList`` to the end (in ``env``, default :func:`claude_env`): its stream-json
    events and the failure context."""
    env = dict(env if env is not None else claude_env(sandbox, proxy))
    env.update(extra_env)
    proc, context = run_cli(
        "claude",
        [claude_path(claude_bin), "-p", "TaskList", "--output-format", "stream-json", "--verbose"],
        sandbox["work"],
        env,
        proxy,
        TIMEOUT_S,
    )
    assert proc.returncode == 0, context
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")], context


def message_posts(proxy: LoggingProxy) -> list[Exchange]:
    return [e for e in proxy.exchanges if e.path.startswith("/v1/messages") and e.method == "POST"]


def tool_uses(events: list) -> list[dict]:
    """The ``tool_use`` blocks of every assistant message in Claude Code's stream-json ``events``."""
    return [
        block
        for e in events
        if e.get("type") == "assistant"
        for block in e["message"]["content"]
        if block.get("type") == "tool_use"
    ]


def assert_task_list_loop(events: list, proxy: LoggingProxy, context: str) -> None:
    """TaskList was called and ran, its result went back, the run ended in success, every
    request got 200 and every answer echoes the model name its request sent."""
    # the model's call, executed by Claude Code, and its result accepted as the next turn's input
    calls = tool_uses(events)
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

    messages = message_posts(proxy)
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
    # every answer echoes the name Claude Code asked for (else it drops thinking blocks)
    assert all(
        f'"model":"{e.body["model"]}"' in e.response_text
        or f'"model": "{e.body["model"]}"' in e.response_text
        for e in messages
        if e.body and e.body.get("model") and e.path.split("?")[0] == "/v1/messages"
    ), context


def test_claude_code_print_mode_completes_a_tool_loop(
    claude_bin: str, proxy: LoggingProxy, sandbox: dict
) -> None:
    events, context = run_task_list(claude_bin, proxy, sandbox)
    assert_task_list_loop(events, proxy, context)


def _tool_references(exchange: Exchange) -> list[str]:
    """Tool names of the ``tool_reference`` blocks inside the request's tool results."""
    return [
        ref.get("tool_name")
        for m in (exchange.body or {}).get("messages", [])
        if isinstance(m.get("content"), list)
        for block in m["content"]
        if isinstance(block, dict)
        and block.get("type") == "tool_result"
        and isinstance(block.get("content"), list)
        for ref in block["content"]
        if isinstance(ref, dict) and ref.get("type") == "tool_reference"
    ]


def _usage(exchange: Exchange) -> dict:
    """The usage of the answer's ``message_start`` event (streamed) or of the message."""
    for line in exchange.response_text.splitlines():
        if line.startswith("data: ") and '"message_start"' in line:
            return json.loads(line[6:])["message"]["usage"]
    return json.loads(exchange.response_text).get("usage", {})


def test_claude_code_tool_search_loads_and_calls_a_deferred_tool(
    claude_bin: str, proxy: LoggingProxy, sandbox: dict
) -> None:
    events, context = run_task_list(claude_bin, proxy, sandbox, ENABLE_TOOL_SEARCH="true")
    assert_task_list_loop(events, proxy, context)
    posts = message_posts(proxy)
    first = posts[0].body or {}
    deferred = {t["name"] for t in first.get("tools", []) if t.get("defer_loading")}
    declared = {t["name"] for t in first.get("tools", [])}
    # TaskList is deferred: not among the first request's loaded tools; ToolSearch is
    assert "ToolSearch" in declared and "TaskList" not in declared - deferred, context
    calls = tool_uses(events)
    assert calls[0]["name"] == "ToolSearch" and calls[0]["input"]["query"] == "select:TaskList", context
    # the request after the search carries a tool_reference to TaskList, declared deferred: 200
    referencing = [e for e in posts if "TaskList" in _tool_references(e)]
    assert referencing and all(e.status == 200 for e in referencing), context
    tools = {t["name"]: t for t in (referencing[0].body or {}).get("tools", [])}
    assert tools["TaskList"].get("defer_loading") is True, context
    # ... and its prompt extends the previous one: nearly all of it came from the prefix cache
    before = posts[posts.index(referencing[0]) - 1]
    previous = _usage(before)
    prompt_before = previous["input_tokens"] + previous.get("cache_read_input_tokens", 0)
    assert _usage(referencing[0]).get("cache_read_input_tokens", 0) >= 0.9 * prompt_before, context
    # the model then called the loaded tool, and no request fell back to removing the references
    assert any(c["name"] == "TaskList" for c in calls[1:]), context
    assert not any("Tool references removed" in json.dumps(e.body) for e in posts), context


@pytest.fixture(scope="module")
def quick_start() -> Iterator[Server]:
    """``deepseek-frontend serve`` as the README's quick start runs it: no flags at all (no alias,
    no key, the default served name), on a free port."""
    server = start_frontend()
    yield server
    server.stop()


def test_claude_code_with_its_own_model_names_works_against_the_quick_start_server(
    claude_bin: str, quick_start: Server, sandbox: dict
) -> None:
    """What docs/clients.md tells a new user to run against ``serve`` with no flags: Claude Code
    sends its own model names (no ``ANTHROPIC_MODEL``: each release picks its default, with its
    own tool set, so the prompt needs no tool), which the simulated engine's server answers
    without ``--model-alias``; the key is any placeholder (the server checks none)."""
    proxy = LoggingProxy(quick_start.url).start()
    try:
        env = claude_env(sandbox, proxy, model=None, key="sk-local")
        proc, context = run_cli(
            "claude",
            [claude_path(claude_bin), "-p", "Reply with exactly: quick start ok", "--output-format", "json"],
            sandbox["work"],
            env,
            proxy,
            TIMEOUT_S,
        )
        assert proc.returncode == 0, context
        result = json.loads(proc.stdout)
        assert result["subtype"] == "success" and result["result"] == "quick start ok", context
        posts = message_posts(proxy)
        assert posts and all(e.status == 200 for e in posts), context
        sent = {(e.body or {}).get("model") for e in posts}
        assert all(str(name).startswith("claude-") for name in sent), context
        assert all(f'"model":"{e.body["model"]}"' in e.response_text for e in posts if e.body), context
    finally:
        proxy.stop()
