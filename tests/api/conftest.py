"""Session-wide servers for the end-to-end tests: one ``sim-engine`` and a frontend over it.

The frontend requires an API key (the ``openai`` client always sends one), accepts
``gpt-*`` as an alias, and speaks SGLang's protocol to the separate sim-engine process,
so these tests cross every process boundary a deployment has.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.servers import Server, start_frontend, start_sim_engine

API_KEY = "test-key"
MAX_BODY = 1_000_000


@pytest.fixture(scope="session")
def sim_engine() -> Iterator[Server]:
    server = start_sim_engine()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def frontend(sim_engine: Server) -> Iterator[Server]:
    server = start_frontend(
        "--engine",
        "sglang",
        "--worker",
        sim_engine.url,
        "--api-key",
        API_KEY,
        "--model-alias",
        "gpt-*",
        "--context-length",
        "65536",
        "--max-body-bytes",
        str(MAX_BODY),
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def model() -> str:
    return "deepseek-v4-flash"


@pytest.fixture()
def client(frontend: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)


@pytest.fixture()
def aclient(frontend: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=frontend.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
