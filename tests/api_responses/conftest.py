"""A frontend over the built-in simulated engine, for the OpenAI Responses SDK tests.

Uses the process helpers of ``tests/api/servers.py`` (loaded by path: the test
directories are not one package). The server requires an API key and maps
``gpt-*`` onto the served model.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import openai
import pytest

API_KEY = "responses-test-key"


def load_servers() -> ModuleType:
    name = "dsfe_test_servers"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parents[1] / "api" / "servers.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def responses_server() -> Iterator[Any]:
    servers = load_servers()
    server = servers.start_frontend(
        "--api-key", API_KEY, "--model-alias", "gpt-*", "--context-length", "65536"
    )
    yield server
    server.stop()


@pytest.fixture()
def client(responses_server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=responses_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)
