"""Pytest fixtures that run one server process for their scope (see ``servers.py``).

``messages_server = server_fixture(start_frontend, "--api-key", KEY)`` in a conftest or
test module is a fixture named ``messages_server`` that starts the process on first use
and stops it when its scope ends, whether the tests passed or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest

from tests.support.servers import Server


def server_fixture(
    start: Callable[..., Server], *args: str, scope: Literal["session", "module"] = "session"
) -> Any:
    """A fixture yielding ``start(*args)`` (``start_frontend``, ``start_sim_engine``) for ``scope``."""

    @pytest.fixture(scope=scope)
    def running() -> Iterator[Server]:
        with start(*args) as server:
            yield server

    return running
