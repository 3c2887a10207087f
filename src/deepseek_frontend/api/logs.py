"""Structured logs: one ``key=value`` line per event, carrying the request id.

``configure_logging`` installs a formatter that appends any ``extra={...}``
fields as ``key=value`` pairs, so ``log.info("request done", extra={"request_id": rid, "status": 200})``
prints ``... request done request_id=chatcmpl-... status=200``.
"""

from __future__ import annotations

import logging
import sys
import time

#: LogRecord attributes that are not user ``extra`` fields.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
    | {"message", "asctime", "color_message"}  # uvicorn's ANSI-coloured copy of the message
)


class KeyValueFormatter(logging.Formatter):
    """``2026-01-01T00:00:00Z INFO logger message k=v ...`` with extras quoted when they contain spaces."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [f"{ts}.{int(record.msecs):03d}Z", record.levelname, record.name, record.getMessage()]
        for key, value in record.__dict__.items():
            if key in _STANDARD_ATTRS or key.startswith("_"):
                continue
            text = str(value)
            if not text or any(c in text for c in ' "='):
                text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
            parts.append(f"{key}={text}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str = "info") -> None:
    """Send every log line (ours and uvicorn's) to stderr through :class:`KeyValueFormatter`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
