"""Waiting on a condition instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], bool], what: str, *, timeout: float = 10.0, interval: float = 0.02
) -> None:
    """Poll ``condition`` every ``interval`` seconds until it holds.

    Raises ``AssertionError("<what> (not within <timeout> s)")`` when ``timeout`` seconds
    pass first; ``what`` states the expectation ("the engine saw the abort").
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} (not within {timeout:g} s)")
        time.sleep(interval)
