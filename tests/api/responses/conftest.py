"""A frontend over the built-in simulated engine, for the OpenAI Responses SDK tests.

Uses the process helpers of ``tests/support/servers.py``. The server requires an API key and maps
``gpt-*`` onto the served model.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.fixtures import server_fixture
from tests.support.servers import start_frontend

API_KEY = "responses-test-key"


responses_server = server_fixture(
    start_frontend,
    "--api-key",
    API_KEY,
    "--model-alias",
    "gpt-*",
    "--context-length",
    "65536",
    # stateless, as Codex-style clients use it; stored responses: tests/api/stored
    "--state-store",
    "none",
)


@pytest.fixture()
def client(responses_server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=responses_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)
