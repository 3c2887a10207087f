"""Parser events -> OpenAI Responses stream events, and their accumulation.

:class:`ResponsesStreamEncoder` turns the parser's events into the typed
Responses events. Every run of same-kind output is one output item, closed
before the next one opens::

    response.created, response.in_progress
    output_item.added(reasoning)  content_part.added(reasoning_text)
        reasoning_text.delta*  reasoning_text.done  content_part.done  output_item.done
    output_item.added(message)    content_part.added(output_text)
        output_text.delta*     output_text.done     content_part.done  output_item.done
    output_item.added(function_call)
        function_call_arguments.delta*  function_call_arguments.done   output_item.done
    response.completed  (or response.incomplete when max_output_tokens cut the answer)

``sequence_number`` counts every event from 0; ``output_index`` is the item's
position in ``response.output``. The final response object carried by
``response.completed`` is built from the same events, and is also the
non-streaming answer.
"""

from __future__ import annotations

import string
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from deepseek_frontend._random_ids import random_text
from deepseek_frontend.api.event_stream import EventEncoder, Section, SSEEvent
from deepseek_frontend.errors import FrontendError

from .convert import encode_reasoning

if TYPE_CHECKING:
    from deepseek_frontend.engines.base import TokenLogprob
    from deepseek_frontend.pipeline.chat import PipelineChunk, StreamEnd

#: The answer tokens' logprobs -> OpenAI ``logprobs`` entries (token, logprob, bytes, top_logprobs).
LogprobsRenderer = Callable[[Sequence["TokenLogprob"]], list[dict[str, Any]]]

__all__ = [
    "ResponsesStreamEncoder",
    "new_response_id",
]

_ID_ALPHABET = string.ascii_lowercase + string.digits


def _new_id(prefix: str) -> str:
    return prefix + random_text(_ID_ALPHABET, 32)


def new_response_id() -> str:
    """A fresh ``resp_...`` id."""
    return _new_id("resp_")


class ResponsesStreamEncoder(EventEncoder):
    """Turns parser events into Responses stream events for one response.

    Lifecycle (see :class:`~deepseek_frontend.api.event_stream.EventEncoder`):
    :meth:`start` once, :meth:`feed` (or the per-kind methods) any number of
    times, :meth:`finish` (or :meth:`end_stream`) once; :attr:`response` is then the final
    response object. ``echo`` holds the request settings a response reports
    (instructions, tools, tool_choice, temperature, ...).
    """

    def __init__(
        self,
        *,
        model: str,
        input_tokens: int,
        cached_tokens: int = 0,
        echo: dict[str, Any] | None = None,
        response_id: str | None = None,
        tool_namespaces: Mapping[str, tuple[str, str]] | None = None,
        logprobs: LogprobsRenderer | None = None,
        created_at: int | None = None,
    ) -> None:
        super().__init__()
        #: the answer tokens' logprobs -> ``logprobs`` entries (``None``: not asked for, ``[]`` sent)
        self._logprobs_of = logprobs
        #: entries of answer tokens not yet sent with a text delta
        self._pending_logprobs: list[dict[str, Any]] = []
        #: entries of the open message item's text (its ``output_text`` part's ``logprobs``)
        self._part_logprobs: list[dict[str, Any]] = []
        #: flat tool name -> (namespace, declared name): calls go back under the declared name
        self._namespaces = tool_namespaces or {}
        self.response_id = response_id or new_response_id()
        self.model = model
        self.input_tokens = input_tokens
        self.cached_tokens = cached_tokens
        self._echo = echo or {}
        self._created_at = int(time.time()) if created_at is None else created_at
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        #: text of the open item so far (reasoning, answer text or argument JSON)
        self._text: list[str] = []
        #: the final response object, set by :meth:`finish`
        self.response: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return (
            f"ResponsesStreamEncoder(id={self.response_id!r}, open={self._open!r}, items={len(self._output)})"
        )

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> list[SSEEvent]:
        """``response.created`` and ``response.in_progress``."""
        snapshot = self._response_object("in_progress", output=[])
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def finish(self, *, finish_reason: str, output_tokens: int, reasoning_tokens: int = 0) -> list[SSEEvent]:
        """Close the open item, then ``response.completed`` -- or ``response.incomplete``
        (``incomplete_details.reason = "max_output_tokens"``) when ``finish_reason`` is ``length``."""
        self._check_open()
        incomplete = finish_reason == "length"
        out = self._close(status="incomplete" if incomplete else "completed")
        self._finished = True
        usage = {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": self.input_tokens + output_tokens,
        }
        response = self._response_object(
            "incomplete" if incomplete else "completed",
            output=self._output,
            usage=usage,
            incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
        )
        self.response = response
        out.append(
            self._event("response.incomplete" if incomplete else "response.completed", response=response)
        )
        return out

    def snapshot(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object as it stands, with ``status`` (a stored background response's
        ``queued``, ``in_progress``, ``failed`` or ``cancelled``) and ``error``."""
        return self._response_object(status, output=self._output, error=error)

    def encode(self, chunk: PipelineChunk) -> list[SSEEvent]:
        """As :meth:`EventEncoder.encode`; the chunk's answer-token logprobs (when asked for) ride
        on its ``output_text.delta`` (the pipeline sends logprobs with the text they cover)."""
        if self._logprobs_of is not None and chunk.logprobs:
            self._pending_logprobs += self._logprobs_of(chunk.logprobs)
        return super().encode(chunk)

    def end_stream(self, end: StreamEnd) -> list[SSEEvent]:
        """:meth:`finish` with the pipeline's finish reason and usage (cache hits are known only now)."""
        usage = end.usage
        self.cached_tokens = usage.cached_tokens
        self.input_tokens = usage.prompt_tokens
        return self.finish(
            finish_reason=end.finish_reason,
            output_tokens=usage.completion_tokens,
            reasoning_tokens=usage.reasoning_tokens,
        )

    def error(self, err: FrontendError) -> list[SSEEvent]:
        """An ``error`` event for a failure after the stream started; the encoder is then finished."""
        self._finished = True
        return [
            self._event(
                "error",
                code=err.code or err.error_type,
                message=err.message,
                param=err.param,
            )
        ]

    # -- sections: output items -------------------------------------------------------------

    def _start_section(self, kind: Literal["reasoning", "text"]) -> list[SSEEvent]:
        """A reasoning or message item with its one (empty) content part."""
        if kind == "reasoning":
            item = {
                "type": "reasoning",
                "id": _new_id("rs_"),
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            item = {
                "type": "message",
                "id": _new_id("msg_"),
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [self._add_item(item), self._part_event("response.content_part.added", part)]

    def _start_tool_section(self, index: int, name: str, call_id: str | None) -> list[SSEEvent]:
        """A ``function_call`` item with empty arguments (the parser's id kept when it is a ``call_`` id)."""
        item = {
            "type": "function_call",
            "id": _new_id("fc_"),
            "call_id": call_id if call_id and call_id.startswith("call_") else _new_id("call_"),
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        if name in self._namespaces:
            item["namespace"], item["name"] = self._namespaces[name]
        return [self._add_item(item)]

    def _section_text(self, kind: Section, text: str) -> list[SSEEvent]:
        self._text.append(text)
        if kind == "reasoning":
            return [self._item_event("response.reasoning_text.delta", content_index=0, delta=text)]
        if kind == "text":
            logprobs, self._pending_logprobs = self._pending_logprobs, []
            self._part_logprobs += logprobs
            return [
                self._item_event("response.output_text.delta", content_index=0, delta=text, logprobs=logprobs)
            ]
        return [self._item_event("response.function_call_arguments.delta", delta=text)]

    def _end_section(self, kind: Section, status: str) -> list[SSEEvent]:
        item = self._output[-1]
        text = "".join(self._text)
        self._text = []
        out: list[SSEEvent] = []
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            out.append(self._item_event("response.reasoning_text.done", content_index=0, text=text))
            out.append(self._part_event("response.content_part.done", part))
            item["content"] = [part]
            item["encrypted_content"] = encode_reasoning(text)
        elif kind == "text":
            logprobs = self._part_logprobs + self._pending_logprobs
            self._part_logprobs, self._pending_logprobs = [], []
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
            out.append(
                self._item_event("response.output_text.done", content_index=0, text=text, logprobs=logprobs)
            )
            out.append(self._part_event("response.content_part.done", part))
            item["content"] = [part]
        else:
            item["arguments"] = text or "{}"
            out.append(
                self._item_event(
                    "response.function_call_arguments.done", name=item["name"], arguments=text or "{}"
                )
            )
        item["status"] = status
        out.append(
            self._event("response.output_item.done", output_index=len(self._output) - 1, item=dict(item))
        )
        return out

    # -- internals --------------------------------------------------------------------------

    def _response_object(
        self,
        status: str,
        *,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        incomplete_details: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        echo = self._echo
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self._created_at,
            "status": status,
            "error": error,
            "incomplete_details": incomplete_details,
            "instructions": echo.get("instructions"),
            "max_output_tokens": echo.get("max_output_tokens"),
            "model": self.model,
            "output": [dict(item) for item in output],
            "parallel_tool_calls": echo.get("parallel_tool_calls", True),
            "previous_response_id": echo.get("previous_response_id"),
            "reasoning": echo.get("reasoning", {"effort": None, "summary": None}),
            # the tier the request ran in (edge/priority.py), set by the route
            "service_tier": echo.get("service_tier", "default"),
            # the state fields (api/responses/stateful.py): stateless requests report store false
            "store": echo.get("store", False),
            "background": echo.get("background", False),
            **({"conversation": echo["conversation"]} if echo.get("conversation") else {}),
            "temperature": echo.get("temperature", 1.0),
            "text": echo.get("text", {"format": {"type": "text"}}),
            "tool_choice": echo.get("tool_choice", "auto"),
            "tools": echo.get("tools", []),
            "top_p": echo.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": usage,
            "user": echo.get("user"),
            "metadata": echo.get("metadata", {}),
            **({"warnings": echo["warnings"]} if echo.get("warnings") else {}),
        }

    def _event(self, kind: str, **fields: Any) -> SSEEvent:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return (kind, payload)

    def _item_event(self, kind: str, **fields: Any) -> SSEEvent:
        item = self._output[-1]
        return self._event(kind, item_id=item["id"], output_index=len(self._output) - 1, **fields)

    def _part_event(self, kind: str, part: dict[str, Any]) -> SSEEvent:
        return self._item_event(kind, content_index=0, part=part)

    def _add_item(self, item: dict[str, Any]) -> SSEEvent:
        self._output.append(item)
        self._text = []
        return self._event("response.output_item.added", output_index=len(self._output) - 1, item=dict(item))
