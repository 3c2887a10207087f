"""OpenAI chat answers: pipeline chunks to ``chat.completion.chunk`` SSE events, or folded into one
``chat.completion``.

* :class:`ChunkWriter` turns pipeline chunks into ``chat.completion.chunk`` SSE events: one event
  per engine chunk (events of one chunk are merged into one delta where the OpenAI shape keeps
  their order, :func:`events_to_deltas`), built from pre-serialised byte templates so the
  per-token cost is one small ``orjson.dumps``.
* :func:`openai_event_stream` is the body around the writer (opening events, in-band error,
  usage, ``[DONE]``) that ``/v1/completions`` uses too; :func:`stream_chat` is chat's.
* :func:`build_response` is the non-streaming ``chat.completion``, folded from the same chunks.
* :func:`logprobs_content` is OpenAI's ``logprobs.content`` (the Responses API's too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from deepseek_frontend.edge.sse import DONE, FinalPart, data_event
from deepseek_frontend.edge.streaming import stream_error_body
from deepseek_frontend.parsing import ContentDelta, ReasoningDelta, ToolCallArgumentsDelta, ToolCallStart
from deepseek_frontend.pipeline.chat import (
    ChatRequest,
    ChoiceAccumulator,
    ChoiceStream,
    PipelineChunk,
    Usage,
    merge_choices,
)

if TYPE_CHECKING:
    from deepseek_frontend.edge.tracking import RequestTracker
    from deepseek_frontend.engines.base import TokenLogprob
    from deepseek_frontend.fleet.served_model import ServedModel
    from deepseek_frontend.tokenization import PromptTokenizer


def logprobs_content(
    tokenizer: PromptTokenizer, logprobs: Sequence[TokenLogprob], top_logprobs: int | None = None
) -> list[dict[str, Any]]:
    """OpenAI ``logprobs.content`` entries (token text, logprob, UTF-8 bytes, top alternatives).

    ``logprobs`` are the answer tokens only (the pipeline leaves out reasoning, markup and
    EOS); each entry lists at most ``top_logprobs`` alternatives (engines may send more:
    vLLM always returns at least one).
    """

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    out = []
    for lp in logprobs:
        item = entry(lp.token_id, lp.logprob)
        top = lp.top if top_logprobs is None else lp.top[:top_logprobs]
        item["top_logprobs"] = [entry(t, p) for t, p in top]
        out.append(item)
    return out


# --------------------------------------------------------------------------- streaming


_RANK = {ReasoningDelta: 0, ContentDelta: 1, ToolCallStart: 2, ToolCallArgumentsDelta: 2}


def events_to_deltas(events: Sequence[Any]) -> list[dict[str, Any]]:
    """Merge one engine chunk's events into as few OpenAI deltas as keep their order.

    Reasoning, content and tool calls share a delta only in that order; an event
    that would go back (content after a tool call) starts a new delta. Argument
    deltas of one call merge into a single ``tool_calls`` entry.
    """
    deltas: list[dict[str, Any]] = []
    delta: dict[str, Any] = {}
    rank = -1
    calls: list[dict[str, Any]] = []
    for ev in events:
        t = type(ev)
        r = _RANK.get(t)
        if r is None:
            continue  # ToolCallEnd: nothing to send in the OpenAI shape
        if r < rank:
            deltas.append(delta)
            delta, calls = {}, []
        rank = r
        if t is ContentDelta:
            delta["content"] = delta.get("content", "") + ev.text
        elif t is ReasoningDelta:
            delta["reasoning_content"] = delta.get("reasoning_content", "") + ev.text
        elif t is ToolCallStart:
            calls.append(
                {
                    "index": ev.index,
                    "id": ev.id,
                    "type": "function",
                    "function": {"name": ev.name, "arguments": ""},
                }
            )
            delta["tool_calls"] = calls
        else:  # ToolCallArgumentsDelta
            if calls and calls[-1]["index"] == ev.index:
                calls[-1]["function"]["arguments"] += ev.text
            else:
                calls.append({"index": ev.index, "function": {"arguments": ev.text}})
                delta["tool_calls"] = calls
    if delta:
        deltas.append(delta)
    return deltas


class ChunkWriter:
    """Serialises ``chat.completion.chunk`` events for one response.

    The envelope (id, created, model) is serialised once; each event costs one
    ``orjson.dumps`` of the delta.
    """

    __slots__ = ("_head", "_suffix", "_text_prefix", "_tokenizer", "_top_logprobs", "model", "response_id")

    def __init__(
        self,
        response_id: str,
        created: int,
        model: str,
        tokenizer: PromptTokenizer | None = None,
        top_logprobs: int | None = None,
        service_tier: str = "default",
    ) -> None:
        self.response_id = response_id
        self.model = model
        self._tokenizer = tokenizer
        self._top_logprobs = top_logprobs
        self._head = (
            b'data: {"id":'
            + orjson.dumps(response_id)
            + b',"object":"chat.completion.chunk","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
            # the tier the request ran in (edge/priority.py), as OpenAI reports it on every chunk
            + b',"service_tier":'
            + orjson.dumps(service_tier)
            + b',"system_fingerprint":null,"choices":'
        )
        self._suffix = b"}\n\n"
        # Fast path for the common event (one text delta): the bytes around the JSON string,
        # per choice index and field, built once per response.
        self._text_prefix: dict[tuple[int, type], bytes] = {}

    def _event(self, choices: bytes, usage: bytes | None = None) -> bytes:
        if usage is None:
            return self._head + choices + self._suffix
        return self._head + choices + b',"usage":' + usage + self._suffix

    def delta(
        self, index: int, delta: dict[str, Any], logprobs: Any = None, finish_reason: str | None = None
    ) -> bytes:
        choice: dict[str, Any] = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        return self._event(orjson.dumps([choice]))

    def role(self, index: int) -> bytes:
        return self.delta(index, {"role": "assistant", "content": ""})

    def usage(self, usage: Usage) -> bytes:
        return self._event(b"[]", orjson.dumps(usage.to_openai()))

    def _text_event(self, index: int, kind: type, text: str) -> bytes:
        prefix = self._text_prefix.get((index, kind))
        if prefix is None:
            field = "content" if kind is ContentDelta else "reasoning_content"
            prefix = (
                self._head + b'[{"index":' + str(index).encode() + b',"delta":{"' + field.encode() + b'":'
            )
            self._text_prefix[(index, kind)] = prefix
        return prefix + orjson.dumps(text) + b'},"logprobs":null,"finish_reason":null}]}\n\n'

    def encode(self, chunk: PipelineChunk) -> bytes:
        """The SSE bytes of one pipeline chunk: :meth:`chunk`'s events joined, the common one (a
        single text delta) built without the list."""
        events = chunk.events
        if len(events) == 1 and chunk.end is None and not chunk.logprobs:
            ev = events[0]
            kind = ev.__class__
            if kind is ContentDelta or kind is ReasoningDelta:
                return self._text_event(chunk.index, kind, ev.text)
        return b"".join(self.chunk(chunk))

    def chunk(self, chunk: PipelineChunk) -> list[bytes]:
        """The SSE events for one pipeline chunk (usually exactly one)."""
        events = chunk.events
        if len(events) == 1 and chunk.end is None and not chunk.logprobs:
            ev = events[0]
            kind = type(ev)
            if kind is ContentDelta or kind is ReasoningDelta:
                return [self._text_event(chunk.index, kind, ev.text)]
        out: list[bytes] = []
        logprobs = None
        if chunk.logprobs and self._tokenizer is not None:
            logprobs = {"content": logprobs_content(self._tokenizer, chunk.logprobs, self._top_logprobs)}
        for delta in events_to_deltas(chunk.events):
            out.append(self.delta(chunk.index, delta, logprobs))
            logprobs = None
        if logprobs is not None:
            out.append(self.delta(chunk.index, {}, logprobs))
        if chunk.end is not None:
            out.append(self.delta(chunk.index, {}, None, chunk.end.finish_reason))
        return out


async def openai_event_stream(
    model: ServedModel,
    req: ChatRequest,
    streams: Sequence[ChoiceStream],
    tracker: RequestTracker | None,
    *,
    opening: Sequence[bytes],
    encode: Callable[[PipelineChunk], bytes],
    usage_event: Callable[[Usage], bytes],
) -> AsyncIterator[bytes]:
    """The SSE body of both OpenAI endpoints (chat and completions).

    ``opening`` events, then ``encode(chunk)`` (the SSE bytes of its events, usually one) for each
    engine chunk, then -- with ``stream_options.include_usage`` -- one usage event, then
    ``[DONE]``. A failure mid-stream becomes one ``data: {"error": ...}`` event and
    the stream ends there.

    Events ready together are one body part (one socket write): the opening events go with the
    first chunk's (which the choices' start already awaited), and with one choice its last
    chunk's go with the usage event and ``[DONE]`` as the body's :class:`~.sse.FinalPart`.
    """
    usages: list[Usage] = []
    held = b"".join(opening)
    single = len(streams) == 1
    try:
        # One choice: iterate it directly (one async-generator layer less per token).
        source = streams[0] if single else merge_choices(streams)
        async for chunk in source:
            part = encode(chunk)
            if held:
                part, held = held + part, b""
            if chunk.end is not None:
                usages.append(chunk.end.usage)
                if single:  # the stream's last events: they go with what closes the body
                    held = part
                    continue
            if part:
                yield part
    except Exception as exc:
        err, body = stream_error_body(exc)
        if tracker is not None:
            tracker.stream_error = err.error_type
        yield held + data_event(body)
        return
    if req.include_usage:
        held += usage_event(Usage.combine(usages))
    model.metrics.prompt_tokens.inc(usages[0].prompt_tokens if usages else 0)
    yield FinalPart(held + DONE)


def stream_chat(
    model: ServedModel,
    req: ChatRequest,
    streams: Sequence[ChoiceStream],
    created: int,
    tracker: RequestTracker | None = None,
) -> AsyncIterator[bytes]:
    """The ``chat.completion.chunk`` SSE body: role deltas, one event per engine chunk, finish,
    optional usage, ``[DONE]`` (see :func:`openai_event_stream`)."""
    writer = ChunkWriter(
        req.request_id,
        created,
        req.response_model,
        model.tokenizer if req.logprobs else None,
        req.top_logprobs,
        req.scheduling.service_tier,
    )
    return openai_event_stream(
        model,
        req,
        streams,
        tracker,
        opening=[writer.role(s.index) for s in streams],
        encode=writer.encode,
        usage_event=writer.usage,
    )


def build_response(
    req: ChatRequest,
    accs: Sequence[ChoiceAccumulator],
    created: int,
    tokenizer: PromptTokenizer | None = None,
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object."""
    choices = []
    for acc in accs:
        message: dict[str, Any] = {"role": "assistant"}
        calls = acc.tool_calls
        content = acc.content
        message["content"] = content if content or not calls else None
        reasoning = acc.reasoning_content
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
        logprobs = None
        if req.logprobs and tokenizer is not None:
            logprobs = {"content": logprobs_content(tokenizer, acc.logprobs, req.top_logprobs)}
        choices.append(
            {"index": acc.index, "message": message, "logprobs": logprobs, "finish_reason": acc.finish_reason}
        )
    usage = Usage.combine([a.usage for a in accs])
    return {
        "id": req.request_id,
        "object": "chat.completion",
        "created": created,
        "model": req.response_model,
        "service_tier": req.scheduling.service_tier,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage.to_openai(),
    }
