"""A start-up that fails is one line on stderr naming what to fix, and exit status 2.

Everything ``serve`` checks before it listens (flags, files, the port) already ends that way
(``serve_command.run``). What the app does when it starts -- tracing from the ``OTEL_*``
variables, each model's engine and workers (a prefill/decode worker's role), the state store --
runs in its lifespan (``app.py``) under uvicorn, which reports a failure its own way: the
traceback as one ERROR record (our log format escapes its newlines: ``\\n`` on one line) and
``sys.exit(3)``. So:

* each start-up step runs in :func:`startup_step`, which turns its exception into a
  :class:`~deepseek_frontend.errors.StartupError` naming the step (and the flag it comes from);
* :class:`LifespanReport` is the app as uvicorn runs it: every scope passes through unchanged,
  but a failed start-up is kept for ``serve`` instead of being handed to uvicorn as a traceback
  (uvicorn only learns that the start-up failed, and stops);
* ``acceptor.FrontendServer`` returns instead of letting uvicorn's ``sys.exit(3)`` through, and
  ``serve`` prints :func:`failure_line` and exits with :data:`STARTUP_FAILED`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from deepseek_frontend.errors import StartupError

__all__ = ["STARTUP_FAILED", "LifespanReport", "failure_line", "startup_step"]

#: ``serve``'s exit status when it cannot start as configured (as argparse's for a bad flag)
STARTUP_FAILED = 2
#: uvicorn's own record of a failed start-up, redundant beside ``serve``'s line
_UVICORN_FAILED = "Application startup failed. Exiting."


@contextlib.contextmanager
def startup_step(what: str) -> Iterator[None]:
    """Run one start-up step; its exception becomes a :class:`StartupError` ``"<what>: <cause>"``
    (a ``StartupError`` raised inside already names its step and passes unchanged)."""
    try:
        yield
    except StartupError:
        raise
    except Exception as exc:
        raise StartupError.because(what, exc) from exc


def failure_line(exc: BaseException) -> str:
    """The one line ``serve`` prints for a start-up that raised ``exc``."""
    if not isinstance(exc, StartupError):
        exc = StartupError.because("start-up failed", exc)
    return "deepseek-frontend serve: " + " ".join(str(exc).split())


class _DropUvicornFailure(logging.Filter):
    """Drops uvicorn's "Application startup failed" record once ``serve`` reports the failure."""

    def __init__(self, report: LifespanReport) -> None:
        super().__init__()
        self.report = report

    def filter(self, record: logging.LogRecord) -> bool:
        return self.report.failure is None or record.getMessage() != _UVICORN_FAILED


class LifespanReport:
    """``app`` as uvicorn runs it, keeping a failed start-up in :attr:`failure` (module docstring).

    HTTP and websocket scopes go straight to ``app``. For the lifespan scope, the
    ``lifespan.startup.failed`` message reaches uvicorn without its text (Starlette puts the
    traceback there, which uvicorn would log) and the exception that follows is kept, not raised.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        #: the exception the app's start-up raised (None: it started, or has not yet)
        self.failure: BaseException | None = None
        logging.getLogger("uvicorn.error").addFilter(_DropUvicornFailure(self))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        started = False

        async def report(message: Any) -> None:
            nonlocal started
            if message["type"] == "lifespan.startup.complete":
                started = True
            elif message["type"] == "lifespan.startup.failed":
                message = {"type": "lifespan.startup.failed", "message": ""}
            await send(message)

        try:
            await self.app(scope, receive, report)
        except Exception as exc:
            if started:
                raise  # a failure at shutdown: uvicorn logs it as usual
            self.failure = exc
