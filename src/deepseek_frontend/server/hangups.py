"""SIGHUPs that arrive before a process's event loop listens for them.

SIGHUP's default action ends the process. ``serve`` reloads on it, but its event loop takes the
signal only once the app has started (server/app.py): a SIGHUP sent while the process still starts
-- loading its configuration and tokenizer, or a ``--workers`` child just forked -- would kill it,
and one that arrives after the configuration was read would be lost. :func:`catch` counts them
instead; the process notes :func:`count` when it reads its configuration and, once its loop
listens, reloads if the count has grown since (``create_app(hangups_seen=...)``).
"""

from __future__ import annotations

import signal
from types import FrameType

__all__ = ["catch", "count"]

_count = 0


def _note(_signum: int, _frame: FrameType | None) -> None:
    global _count
    _count += 1


def catch() -> None:
    """From now until the event loop takes SIGHUP over, count it instead of dying of it."""
    signal.signal(signal.SIGHUP, _note)


def count() -> int:
    """SIGHUPs this process counted (a forked child starts with its parent's count)."""
    return _count
