"""Fixtures shared by every test package: the one tokenizer fixture (tests/support/tokenizers.py), and
a state folder of the run's own for every server a test starts."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.support.tokenizers import prompt_tokenizer

__all__ = ["prompt_tokenizer"]

_STATE_HOME: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Every server a test starts without ``--state-store`` keeps its default SQLite store in a folder
    of this run's own (``$XDG_STATE_HOME``), never in the user's: a store another checkout migrated to
    a newer schema would refuse to open, and tests must not leave state behind."""
    global _STATE_HOME
    _STATE_HOME = tempfile.mkdtemp(prefix="dsfe-test-state-")
    os.environ["XDG_STATE_HOME"] = _STATE_HOME


def pytest_unconfigure(config: pytest.Config) -> None:
    if _STATE_HOME is not None:
        shutil.rmtree(_STATE_HOME, ignore_errors=True)
