"""The JSON lines a batch's results are made of, in each API's shape.

OpenAI (output and error files)::

    {"id": "batch_req_...", "custom_id": "...",
     "response": {"status_code": 200, "request_id": "...", "body": {...}}, "error": null}

A request the endpoint refused keeps the endpoint's answer in ``response`` (its status and error
body) and sums it up in ``error`` (``code``, ``message``, ``param``, ``line``); a line that was never
a request (bad JSON, a missing ``custom_id``, another endpoint) has ``response: null`` and
``error`` naming its line and field; a line the batch did not get to has ``error.code``
``batch_cancelled`` or ``batch_expired``.

Anthropic (``/v1/messages/batches/{id}/results``)::

    {"custom_id": "...", "result": {"type": "succeeded", "message": {...}}}
    {"custom_id": "...", "result": {"type": "errored", "error": {"type": "error", "error": {...}}}}
    {"custom_id": "...", "result": {"type": "canceled"}}          (or "expired")

An endpoint's body is spliced in as the endpoint wrote it (compact JSON: one line), never
re-encoded, so a line's ``body`` is byte for byte what the endpoint answers for that request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from deepseek_frontend.state import LineResult, new_id

__all__ = [
    "LineFault",
    "anthropic_fault_line",
    "anthropic_unrun_line",
    "endpoint_result",
    "openai_fault_line",
    "openai_unrun_line",
    "usage_of",
]


@dataclass(frozen=True, slots=True)
class LineFault:
    """Why a line was never run: an OpenAI ``BatchError`` (``code``, ``message``, ``param``, ``line``)."""

    code: str
    message: str
    line: int
    param: str | None = None

    def as_error(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


def _request_line_id() -> str:
    return new_id("batch_req")


def openai_fault_line(custom_id: str | None, fault: LineFault) -> str:
    """The error-file line of a line that was never a request."""
    return orjson.dumps(
        {"id": _request_line_id(), "custom_id": custom_id, "response": None, "error": fault.as_error()}
    ).decode()


def openai_unrun_line(line: int, custom_id: str | None, outcome: str) -> str:
    """The error-file line of a line a cancelled or expired batch did not run."""
    code, why = (
        ("batch_cancelled", "the batch was cancelled")
        if outcome == "canceled"
        else ("batch_expired", "the batch's completion window ended")
    )
    fault = LineFault(code, f"line {line} was not run: {why}", line)
    return openai_fault_line(custom_id, fault)


def anthropic_fault_line(custom_id: str | None, message: str) -> str:
    """The result line of a request that could not be run (Anthropic's ``errored`` with an
    ``invalid_request_error``)."""
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return orjson.dumps({"custom_id": custom_id, "result": {"type": "errored", "error": error}}).decode()


def anthropic_unrun_line(_line: int, custom_id: str | None, outcome: str) -> str:
    """The result line of a request a canceled or expired batch did not run."""
    return orjson.dumps({"custom_id": custom_id, "result": {"type": outcome}}).decode()


def _number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage_of(body: Any) -> tuple[int, int, int, int]:
    """``(input, cached, output, reasoning)`` tokens of an endpoint's answer, whichever API's
    usage shape it has (Chat Completions, Completions, Responses, Messages)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0, 0, 0
    inputs = _number(usage.get("prompt_tokens", usage.get("input_tokens")))
    outputs = _number(usage.get("completion_tokens", usage.get("output_tokens")))
    in_details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    out_details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    cached = _number(in_details.get("cached_tokens")) if isinstance(in_details, dict) else 0
    cached = cached or _number(usage.get("cache_read_input_tokens"))
    reasoning = _number(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else 0
    return inputs, cached, outputs, reasoning


def endpoint_result(
    api: str, line: int, custom_id: str | None, status: int, request_id: str, body: bytes
) -> LineResult:
    """A line's result from its endpoint's answer (``status``, ``body``; ``request_id`` its
    ``x-request-id``): ``succeeded`` for a 2xx, else ``errored`` with the endpoint's error."""
    try:
        parsed: Any = orjson.loads(body)
        raw = body.decode()
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        # not JSON (no route of this server answers so): kept as the text it was, in an error
        error = {"message": body.decode("utf-8", "replace"), "type": "api_error"}
        parsed = {"type": "error", "error": error} if api == "anthropic" else {"error": error}
        raw = orjson.dumps(parsed).decode()
    ok = 200 <= status < 300
    if api == "anthropic":
        key, kind = ("message", "succeeded") if ok else ("error", "errored")
        text = '{"custom_id":' + orjson.dumps(custom_id).decode() + ',"result":{"type":"' + kind + '","'
        text += key + '":' + raw + "}}"
    else:
        error: Any = None
        if not ok:
            inner = parsed.get("error") if isinstance(parsed, dict) else None
            inner = inner if isinstance(inner, dict) else {}
            error = {
                "code": inner.get("code") or inner.get("type") or f"http_{status}",
                "message": inner.get("message") or f"the endpoint answered {status}",
                "param": inner.get("param"),
                "line": line,
            }
        head = {"id": _request_line_id(), "custom_id": custom_id}
        response = '{"status_code":' + str(status) + ',"request_id":' + orjson.dumps(request_id).decode()
        response += ',"body":' + raw + "}"
        text = orjson.dumps(head).decode()[:-1] + ',"response":' + response
        text += ',"error":' + orjson.dumps(error).decode() + "}"
    inputs, cached, outputs, reasoning = usage_of(parsed) if ok else (0, 0, 0, 0)
    return LineResult("succeeded" if ok else "errored", text, inputs, cached, outputs, reasoning)
