"""Structured logs: one ``key=value`` line per event, carrying the request id.

``configure_logging`` installs a formatter that appends any ``extra={...}``
fields as ``key=value`` pairs, so ``log.info("request done", extra={"request_id": rid, "status": 200})``
prints ``... request done request_id=chatcmpl-... status=200``.

One event is always one line: the message, every field and a traceback have their control
characters escaped (``\\n``, ``\\x1b``, ...), because they carry text from clients and workers (an
engine error message, a model name) that could otherwise forge log lines or terminal escapes.

One event is also a bounded line: whatever a client controls can reach a log line (a model
name, an error message that quotes the request, a path, a header value, a tool name), so the
message is cut at :data:`MAX_LOG_MESSAGE_CHARS` characters, every field value at
:data:`MAX_LOG_FIELD_CHARS` and a traceback at :data:`MAX_LOG_TRACEBACK_CHARS`, each cut marked
``...[N more characters]`` (:func:`clip`). A 5 MB model name gives a line of a few KB, not 5 MB.

``configure_logging(fmt="json")`` writes every record as one JSON object per line instead
(:class:`JsonFormatter`): ``ts``, ``level``, ``logger``, ``message`` and the extra fields under
their own names, cut at the same bounds. JSON escapes control characters itself, so a line stays
one line.
"""

from __future__ import annotations

import logging
import re
import sys
import time

import orjson

#: characters a log line must not carry raw: C0 controls, DEL, C1 controls, line/paragraph separators
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: longest message of a log line, in characters (then cut, see :func:`clip`)
MAX_LOG_MESSAGE_CHARS = 2048
#: longest value of one field of a log line
MAX_LOG_FIELD_CHARS = 512
#: longest traceback of a log line (the messages in it may quote a request)
MAX_LOG_TRACEBACK_CHARS = 16384


def clip(text: str, limit: int) -> str:
    """``text`` cut at ``limit`` characters, the cut marked with how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text) - limit} more characters]"


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with control characters escaped, so it cannot break or forge a log line."""
    return _UNSAFE.sub(_escape_char, text) if _UNSAFE.search(text) else text


#: LogRecord attributes that are not user ``extra`` fields.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
    | {"message", "asctime", "color_message"}  # uvicorn's ANSI-coloured copy of the message
)


class KeyValueFormatter(logging.Formatter):
    """``2026-01-01T00:00:00Z INFO logger message k=v ...`` with extras quoted when they contain spaces."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        message = escape(clip(record.getMessage(), MAX_LOG_MESSAGE_CHARS))
        parts = [f"{ts}.{int(record.msecs):03d}Z", record.levelname, record.name, message]
        for key, value in record.__dict__.items():
            if key in _STANDARD_ATTRS or key.startswith("_"):
                continue
            text = clip(str(value), MAX_LOG_FIELD_CHARS)
            if not text or any(c in text for c in ' "='):
                text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
            parts.append(f"{key}={escape(text)}")
        line = " ".join(parts)
        if record.exc_info:
            # still one line: the traceback's newlines are escaped like any other
            line += " exc=" + escape(clip(self.formatException(record.exc_info), MAX_LOG_TRACEBACK_CHARS))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``{"ts", "level", "logger", "message", <extras>..., "exc"}``.

    Extra fields keep their types (numbers stay numbers); a value JSON cannot hold is written as
    its ``str``. A field named like one of the four fixed keys is written as ``extra_<name>``.
    """

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, object] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": clip(record.getMessage(), MAX_LOG_MESSAGE_CHARS),
        }
        for key, value in record.__dict__.items():
            if key in _STANDARD_ATTRS or key.startswith("_"):
                continue
            if isinstance(value, str):
                value = clip(value, MAX_LOG_FIELD_CHARS)
            out[f"extra_{key}" if key in out else key] = value
        if record.exc_info:
            out["exc"] = clip(self.formatException(record.exc_info), MAX_LOG_TRACEBACK_CHARS)
        return orjson.dumps(out, default=str).decode()


LOG_FORMATS = ("text", "json")


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Send every log line (ours and uvicorn's) to stderr, as ``key=value`` text or JSON (``fmt``)."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # httpx logs every request (health probes every few seconds per worker) at INFO
    quiet = logging.DEBUG if level.lower() == "debug" else logging.WARNING
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(quiet)
