"""Rendering does work proportional to the conversation, on every shape.

The reference encoder searches for the last user message once per rendered
message, which is quadratic on an agent loop with one user turn and thousands of
assistant/tool turns. These tests count operations instead of timing them
(``benchmarks/bench_render.py`` measures the time).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from deepseek_frontend.formats import dsv4, dsv32


class CountingDict(dict[str, Any]):
    """A message that counts how often the renderer reads it."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        CountingDict.reads += 1
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        CountingDict.reads += 1
        return super().__getitem__(key)


def _agent_loop(turns: int) -> list[dict[str, Any]]:
    """One user message followed by ``turns`` assistant tool calls and their results."""
    messages: list[dict[str, Any]] = [
        CountingDict(role="system", content="S"),
        CountingDict(role="user", content="go"),
    ]
    for n in range(turns):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "f", "arguments": '{"n": 1}'}}
        messages.append(CountingDict(role="assistant", content="", reasoning_content="r", tool_calls=[call]))
        messages.append(CountingDict(role="tool", tool_call_id=f"c{n}", content="ok"))
    return messages


def _work(module: ModuleType, turns: int, counted: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    calls = 0
    original = getattr(module, counted)

    def counting(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(*args)

    monkeypatch.setattr(module, counted, counting)
    CountingDict.reads = 0
    module.encode_messages(_agent_loop(turns), "thinking")
    return calls, CountingDict.reads


@pytest.fixture(params=[dsv4, dsv32], ids=["dsv4", "dsv32"])
def module(request: pytest.FixtureRequest) -> ModuleType:
    """Each family module."""
    return request.param  # type: ignore[no-any-return]


def test_the_last_user_message_is_searched_a_fixed_number_of_times(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    small, _ = _work(module, 10, "last_user_index", monkeypatch)
    large, _ = _work(module, 1000, "last_user_index", monkeypatch)
    assert 1 <= small == large <= 3


def test_message_reads_grow_linearly_with_the_conversation(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, small = _work(module, 100, "last_user_index", monkeypatch)
    _, large = _work(module, 1000, "last_user_index", monkeypatch)
    # Ten times the turns, ten times the reads (plus the fixed system/user head).
    assert large <= 10 * small
    assert large >= 9 * small


def test_v32_tool_results_find_their_assistant_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    small, _ = _work(dsv32, 10, "_tool_anchors", monkeypatch)
    large, _ = _work(dsv32, 1000, "_tool_anchors", monkeypatch)
    assert small == large == 1
