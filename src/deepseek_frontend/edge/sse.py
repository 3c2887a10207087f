"""Server-Sent Events framing, in one place for every protocol.

Framing follows the WHATWG event-stream format
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):
an event is ``field: value`` lines ended by a blank line. Our payloads are
compact JSON from orjson, which never contains a raw newline (newlines inside
strings are escaped), so one ``data:`` line per event is always enough.

OpenAI streams: ``data: {json}\\n\\n`` per chunk, then ``data: [DONE]\\n\\n``.
Anthropic / Responses streams: ``event: name\\ndata: {json}\\n\\n``.
"""

from __future__ import annotations

from typing import Any

import orjson

MEDIA_TYPE = "text/event-stream"
#: Headers every SSE response sends: no caching, and no proxy buffering (nginx honours X-Accel-Buffering).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

DONE = b"data: [DONE]\n\n"


class FinalPart(bytes):
    """The last part of an event stream's body, yielded as such by a body generator: the response
    sends it together with the end of the body (one write for the last events and the end of the
    chunked body, not two). A part that follows it anyway is still sent, after it."""

    __slots__ = ()


def data_event(payload: Any) -> bytes:
    """``data: <json>\\n\\n`` (OpenAI chunk framing)."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def data_event_raw(json_bytes: bytes) -> bytes:
    """Frame already-serialised JSON (the hot path pre-serialises)."""
    return b"data: " + json_bytes + b"\n\n"


def named_event(name: str, payload: Any) -> bytes:
    """``event: <name>\\ndata: <json>\\n\\n`` (Anthropic / Responses framing)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
