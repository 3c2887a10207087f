"""``serve`` sizes the Rust tokenizer's thread pool one below the cores it may run on (one is the
event loop's), unless the operator set the size."""

from __future__ import annotations

import os

import pytest

from deepseek_frontend.server import serve_command


def test_the_tokenizer_pool_leaves_a_core_to_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serve_command.TOKENIZER_THREADS_VARIABLE, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    serve_command._leave_a_core_to_the_loop()
    assert os.environ[serve_command.TOKENIZER_THREADS_VARIABLE] == "3"


def test_one_core_still_gets_one_tokenizer_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serve_command.TOKENIZER_THREADS_VARIABLE, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    serve_command._leave_a_core_to_the_loop()
    assert os.environ[serve_command.TOKENIZER_THREADS_VARIABLE] == "1"


def test_an_operators_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(serve_command.TOKENIZER_THREADS_VARIABLE, "7")
    serve_command._leave_a_core_to_the_loop()
    assert os.environ[serve_command.TOKENIZER_THREADS_VARIABLE] == "7"
