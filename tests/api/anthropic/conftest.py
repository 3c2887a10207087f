"""A frontend over the built-in simulated engine, for the Anthropic SDK tests.

Uses the process helpers of ``tests/support/servers.py``. The server requires an API key and maps
``claude-*`` onto the served model, as a Claude Code deployment would.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.support.fixtures import server_fixture
from tests.support.servers import start_frontend

API_KEY = "anthropic-test-key"


messages_server = server_fixture(
    start_frontend, "--api-key", API_KEY, "--model-alias", "claude-*", "--context-length", "65536"
)


@pytest.fixture()
def client(messages_server: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=messages_server.url, api_key=API_KEY, max_retries=0, timeout=30)
