"""Codex declares a hosted ``web_search`` tool in every request: the server's log says so once.

With ``--hosted-tools drop`` (the default) each response still carries the ``warnings`` entry;
the frontend's log has one WARNING per client (its agent session header, else its address and
``User-Agent``) and sends the repeats to DEBUG. Checked in the real server's log.
"""

from __future__ import annotations

import uuid
from typing import Any

import openai

from deepseek_frontend.edge.log_once import FirstSeen

HOSTED: Any = [{"type": "web_search"}]


def _ask(client: openai.OpenAI, session: str) -> Any:
    return client.responses.create(
        model="gpt-codex-test",
        input="Reply with exactly: ok",
        tools=HOSTED,
        reasoning={"effort": "none"},
        extra_headers={"session_id": session},
    )


def _warning_lines(log: str, session: str) -> list[str]:
    return [
        line for line in log.splitlines() if " WARNING " in line and session in line and "web_search" in line
    ]


def test_a_hosted_tool_is_logged_once_per_client_session(
    responses_server: Any, client: openai.OpenAI
) -> None:
    first, second = f"codex-{uuid.uuid4()}", f"codex-{uuid.uuid4()}"
    for _ in range(3):
        answer = _ask(client, first)
        assert "web_search" in " ".join(answer.model_extra.get("warnings") or [])  # each response says it
    _ask(client, second)
    log = responses_server.log()
    assert len(_warning_lines(log, first)) == 1
    assert len(_warning_lines(log, second)) == 1


def test_first_seen_is_bounded_and_forgets_the_least_recent_key() -> None:
    seen = FirstSeen(max_keys=2)
    assert seen.first("a") and seen.first("b")
    assert not seen.first("a")  # a is now the most recent
    assert seen.first("c") and len(seen) == 2  # b goes
    assert seen.first("b") and not seen.first("c")
