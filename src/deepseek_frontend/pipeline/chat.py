"""The protocol-neutral serving core: typed request in, parser events out.

Every HTTP protocol (OpenAI chat, Anthropic messages, OpenAI responses) maps its
JSON onto a :class:`ChatRequest` and renders the same :class:`PipelineChunk`
stream back in its own shape::

    ChatRequest --prepare()--> PreparedRequest            (render + tokenize + checks + SamplingParams)
                --stream()---> ChoiceStream                (one engine request per choice)
                   .start()    awaits the first engine chunk (errors here become an HTTP status)
                   async for   PipelineChunk per engine chunk:
                               engine ids -> IncrementalDetokenizer -> StreamParser events
                               -> stop strings over the answer text -> PipelineChunk(events, end)

A stream ends with a chunk whose ``end`` is a :class:`StreamEnd` (finish reason,
the stop string that matched, usage). Closing a :class:`ChoiceStream` early
(client disconnect, stop string) closes the engine iterator, which aborts the
request on the worker. Non-streaming answers are the same chunks folded by
:class:`ChoiceAccumulator`.

Stop strings are matched over the answer *content* only, not over reasoning or
tool-call arguments: a thinking model would otherwise be cut off mid-thought by a
stop string meant for its answer. On a match the content is truncated before the
stop string, the engine request is aborted, and the finish reason is ``"stop"``.

``reasoning_tokens`` in usage is an approximation (engines report only a total):
each engine chunk's tokens are split between reasoning and the rest in proportion
to the characters each kind of event received; a chunk that produced no text
(held back by the detokenizer or parser) counts toward the kind seen last.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from deepseek_frontend.engines.base import (
    DecodingConstraint,
    EngineChunk,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
)
from deepseek_frontend.errors import (
    ContextLengthError,
    EngineError,
    EngineStreamError,
    RequestError,
    UnsupportedFeatureError,
)
from deepseek_frontend.parsing import (
    ContentDelta,
    Finish,
    ReasoningDelta,
    StreamParser,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

from .stop import StopStringMatcher

if TYPE_CHECKING:
    from deepseek_frontend.api.config import ServerConfig
    from deepseek_frontend.api.metrics import FrontendMetrics
    from deepseek_frontend.formats.segments import PromptSegment
    from deepseek_frontend.tokenization import PromptTokenizer

log = logging.getLogger("deepseek_frontend.api")

FinishReason = Literal["stop", "length", "tool_calls"]
#: What the pipeline yields inside a chunk: the parsing events (``Finish`` is folded into ``StreamEnd``).
Event = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArgumentsDelta | ToolCallEnd

#: Largest n a request may ask for (each choice is a full engine request).
MAX_N = 16
#: Largest top_logprobs (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


class EngineBackend(Protocol):
    """What the pipeline needs from the engine side (``WorkerPool`` or a single client)."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]: ...

    def supports_constraint(self, kind: str) -> bool: ...


# --------------------------------------------------------------------------- request / result types


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A chat request in protocol-neutral form (what every API adapter builds).

    ``messages`` are OpenAI-shaped dicts as ``deepseek_frontend.formats`` takes
    them (string ``content``, assistant ``reasoning_content`` and ``tool_calls``
    with JSON-string ``arguments``, tool messages with ``tool_call_id``).
    ``tools`` is an OpenAI function-tool list; ``tool_choice`` is ``"auto"``,
    ``"none"``, ``"required"`` or ``{"type": "function", "function": {"name": N}}``.
    ``reasoning_effort`` is already normalized for the checkpoint's profile.
    ``max_tokens`` None means "up to the context length" (or the server default).
    """

    messages: Sequence[dict[str, Any]]
    request_id: str
    model: str = ""
    tools: Sequence[dict[str, Any]] | None = None
    tool_choice: Any = "auto"
    thinking: bool = True
    reasoning_effort: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: dict[str, Any] | None = None
    include_usage: bool = False
    user: str | None = None
    #: keep calls to tools the request did not declare (default: drop and count them)
    keep_undeclared_tools: bool = False


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request ready for the engine: prompt ids, sampling parameters, parser settings."""

    request: ChatRequest
    input_ids: list[int]
    sampling: SamplingParams
    #: tools the output parser accepts (None when tool_choice is "none" or no tools were sent)
    tools: Sequence[dict[str, Any]] | None
    #: False for raw /v1/completions: the output is passed through without chat parsing
    parse: bool = True
    #: unix seconds, for the response's ``created`` field
    created: int = field(default_factory=lambda: int(time.time()))
    #: perf_counter() at arrival, for TTFT / e2e metrics
    arrival: float = field(default_factory=time.perf_counter)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids)


@dataclass(slots=True)
class Usage:
    """Token accounting of one choice (or, after :meth:`combine`, of a whole response)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @staticmethod
    def combine(usages: Sequence[Usage]) -> Usage:
        """Usage of an n-choice response: the prompt once, completions summed."""
        if not usages:
            return Usage()
        return Usage(
            prompt_tokens=usages[0].prompt_tokens,
            completion_tokens=sum(u.completion_tokens for u in usages),
            reasoning_tokens=sum(u.reasoning_tokens for u in usages),
            cached_tokens=max(u.cached_tokens for u in usages),
        )

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``usage`` object."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
        }


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """How a choice ended. ``stop_sequence`` is the frontend stop string that matched, if any."""

    finish_reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None


@dataclass(slots=True)
class PipelineChunk:
    """Everything one engine chunk produced for one choice.

    ``events`` are in stream order; ``logprobs`` are the engine's for this chunk's
    tokens (when requested); ``end`` is set on the last chunk of the choice.
    """

    index: int
    events: list[Event]
    logprobs: list[TokenLogprob] | None = None
    end: StreamEnd | None = None


# --------------------------------------------------------------------------- pipeline


def prompt_tools(req: ChatRequest) -> list[dict[str, Any]] | None:
    """The tools the prompt declares: none at all when ``tool_choice`` is ``"none"``.

    (DeepSeek-V4 emits DSML whenever tools are in its prompt, so ``none`` must remove
    them rather than only ignore calls.) Raises ``RequestError`` for a ``tool_choice``
    that needs tools when there are none.
    """
    tools = list(req.tools) if req.tools and req.tool_choice != "none" else None
    if req.tool_choice not in ("auto", "none") and not tools:
        raise RequestError("tool_choice requires at least one tool in 'tools'", param="tool_choice")
    return tools


class PromptRenderer:
    """Renders a :class:`ChatRequest` with one family's chat format (no tokenizer, no engine).

    Used by the pipeline and by the offline ``render`` / ``tokenize`` commands, so
    both produce the same prompt for the same request.
    """

    def __init__(self, family: str, reasoning_effort_profile: str) -> None:
        from deepseek_frontend.formats import attach_request_tools, get_chat_format

        self.chat_format = get_chat_format(family)
        self.reasoning_effort_profile = reasoning_effort_profile
        self._attach_request_tools = attach_request_tools
        params = inspect.signature(self.chat_format.render_prompt_segments).parameters
        # V3.2's renderer has no effort arguments; decided once here rather than per request.
        self._takes_effort = "reasoning_effort" in params

    def render(self, req: ChatRequest) -> list[PromptSegment]:
        """The prompt segments of ``req``: request tools attached, thinking mode and effort applied."""
        tools = prompt_tools(req)
        messages = list(req.messages)
        if tools or req.response_format is not None:
            messages = self._attach_request_tools(messages, tools or [], req.response_format)
        thinking_mode = "thinking" if req.thinking else "chat"
        if self._takes_effort:
            return self.chat_format.render_prompt_segments(
                messages,
                thinking_mode,
                reasoning_effort=req.reasoning_effort,
                reasoning_effort_profile=self.reasoning_effort_profile,
            )
        return self.chat_format.render_prompt_segments(messages, thinking_mode)


class ChatPipeline:
    """Holds what every request shares: config, tokenizer, chat format, engine backend, metrics."""

    def __init__(
        self,
        config: ServerConfig,
        tokenizer: PromptTokenizer,
        backend: EngineBackend,
        metrics: FrontendMetrics | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.backend = backend
        self.metrics = metrics
        self.family = config.family
        self.renderer = PromptRenderer(config.family, config.reasoning_effort_profile)
        self.eos_token_id: int = tokenizer.eos_token_id

    def __repr__(self) -> str:
        return f"ChatPipeline(family={self.family!r}, model={self.config.served_model_name!r})"

    # -- prepare -----------------------------------------------------------------

    def prepare(self, req: ChatRequest) -> PreparedRequest:
        """Render, tokenize and check ``req``; build the engine's sampling parameters.

        Raises ``FormatError`` (messages the format cannot render),
        ``ContextLengthError``, ``RequestError`` (bad tool_choice / response_format)
        and ``UnsupportedFeatureError`` (a constraint the engine cannot enforce).
        """
        started = time.perf_counter()
        tools = prompt_tools(req)
        segments = self.renderer.render(req)
        input_ids = self.tokenizer.encode_segments(segments)
        if self.metrics is not None:
            self.metrics.tokenization.observe(time.perf_counter() - started)

        max_new = self._max_new_tokens(len(input_ids), req.max_tokens, param="max_tokens")
        constraint = self._constraint(req, tools)
        sampling = self._sampling(req, max_new, constraint)
        return PreparedRequest(request=req, input_ids=input_ids, sampling=sampling, tools=tools)

    def count_prompt_tokens(self, req: ChatRequest) -> int:
        """Tokens of the prompt ``prepare`` would send, without context-length or engine checks."""
        return len(self.tokenizer.encode_segments(self.renderer.render(req)))

    def prepare_raw(self, req: ChatRequest, input_ids: list[int]) -> PreparedRequest:
        """A /v1/completions request: ``input_ids`` go to the engine as they are, output is not parsed.

        ``req.messages`` is ignored; sampling fields, stop strings, n and logprobs apply.
        """
        if not input_ids:
            raise RequestError("prompt is empty", param="prompt")
        vocab = self.tokenizer.vocab_size
        for i, tid in enumerate(input_ids):
            if not 0 <= tid < vocab:
                raise RequestError(
                    f"token id {tid} is outside the vocabulary (0..{vocab - 1})", param=f"prompt[{i}]"
                )
        max_new = self._max_new_tokens(len(input_ids), req.max_tokens, param="max_tokens")
        sampling = self._sampling(req, max_new, None)
        return PreparedRequest(request=req, input_ids=input_ids, sampling=sampling, tools=None, parse=False)

    def _max_new_tokens(self, prompt_tokens: int, requested: int | None, *, param: str) -> int:
        context = self.config.context_length
        room = context - prompt_tokens
        if requested is not None:
            if prompt_tokens + requested > context:
                raise ContextLengthError(
                    f"This model's maximum context length is {context} tokens. However, you requested "
                    f"{prompt_tokens + requested} tokens ({prompt_tokens} in the messages, "
                    f"{requested} in the completion). "
                    "Please reduce the length of the messages or completion.",
                    param=param,
                )
            return requested
        if room <= 0:
            raise ContextLengthError(
                f"This model's maximum context length is {context} tokens. However, your messages resulted "
                f"in {prompt_tokens} tokens. Please reduce the length of the messages.",
                param="messages",
            )
        default = self.config.default_max_tokens
        return min(room, default) if default else room

    def _constraint(self, req: ChatRequest, tools: list[dict[str, Any]] | None) -> DecodingConstraint | None:
        from deepseek_frontend.parsing.constraints import (
            build_json_schema_constraint,
            build_tool_call_constraint,
        )

        constraint: DecodingConstraint | None = None
        what = ""
        if tools and req.tool_choice not in ("auto", "none"):
            constraint = build_tool_call_constraint(
                self.family, tools, req.tool_choice, thinking=req.thinking
            )
            what, param = "tool_choice 'required' or a named tool", "tool_choice"
        rf = req.response_format
        if rf is not None and rf.get("type") in ("json_object", "json_schema") and not req.thinking:
            # In thinking mode a JSON constraint from the first token would forbid the reasoning the
            # prompt asks for, so there the format is requested through the prompt only.
            if constraint is not None:
                raise RequestError(
                    "response_format cannot be combined with tool_choice 'required' or a named tool",
                    param="response_format",
                )
            if rf["type"] == "json_schema":
                schema = (rf.get("json_schema") or {}).get("schema") or {}
            else:
                schema = {"type": "object"}
            constraint = build_json_schema_constraint(schema)
            what, param = f"response_format {rf['type']!r}", "response_format"
        if constraint is not None and not self.backend.supports_constraint(constraint.kind):
            raise UnsupportedFeatureError(
                f"{what} needs constrained decoding ({constraint.kind}), which the {self.config.engine} "
                "engine workers of this server cannot enforce",
                param=param,
            )
        return constraint

    def _sampling(
        self, req: ChatRequest, max_new: int, constraint: DecodingConstraint | None
    ) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            repetition_penalty=req.repetition_penalty,
            seed=req.seed,
            stop_token_ids=(self.eos_token_id,),
            constraint=constraint,
            logprobs=req.logprobs,
            top_logprobs=req.top_logprobs,
        )

    # -- stream ------------------------------------------------------------------

    def stream(self, prepared: PreparedRequest, choice_index: int = 0) -> ChoiceStream:
        """The (not yet started) stream of choice ``choice_index``; call ``start()`` then iterate."""
        return ChoiceStream(self, prepared, choice_index)

    async def start(self, prepared: PreparedRequest) -> list[ChoiceStream]:
        """Start all ``n`` choices concurrently and await each one's first engine chunk.

        If any fails before its first token, the others are closed (aborted) and the
        error is raised, so the caller can still answer with an error status.
        """
        streams = [self.stream(prepared, i) for i in range(prepared.request.n)]
        if len(streams) == 1:
            await streams[0].start()
            return streams
        results = await asyncio.gather(*(s.start() for s in streams), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for s in streams:
                await s.aclose()
            raise errors[0]
        return streams


class ChoiceStream:
    """One choice's engine request, detokenizer, parser and stop matcher.

    Lifecycle: ``await start()`` (awaits the first engine chunk; raises engine and
    request errors), then ``async for chunk in stream`` (yields :class:`PipelineChunk`,
    the last with ``end`` set; raises ``EngineStreamError`` if the worker fails
    mid-stream), and ``await aclose()`` in any case (idempotent; aborts the engine
    request if it is still running).
    """

    __slots__ = (
        "_closed",
        "_detok",
        "_detok_seconds",
        "_engine",
        "_first",
        "_index",
        "_last_chunk_at",
        "_metrics",
        "_mode_reasoning",
        "_parser",
        "_pipeline",
        "_prepared",
        "_stop",
        "_strip_eos",
        "_usage",
    )

    def __init__(self, pipeline: ChatPipeline, prepared: PreparedRequest, index: int) -> None:
        req = prepared.request
        self._pipeline = pipeline
        self._prepared = prepared
        self._index = index
        self._metrics = pipeline.metrics
        sampling = prepared.sampling
        if req.seed is not None and index:
            # n > 1 with a seed: each choice gets its own (still reproducible) seed.
            sampling = _replace_seed(sampling, req.seed + index)
        rid = req.request_id if req.n == 1 else f"{req.request_id}-{index}"
        self._engine: AsyncIterator[EngineChunk] | None = pipeline.backend.generate(
            GenerateRequest(request_id=rid, input_ids=prepared.input_ids, sampling=sampling)
        )
        self._detok = pipeline.tokenizer.new_detokenizer()
        self._parser: StreamParser | None = (
            StreamParser(
                pipeline.family,
                thinking=req.thinking,
                tools=prepared.tools,
                tool_choice=req.tool_choice if prepared.tools else "none",
                keep_undeclared_tools=req.keep_undeclared_tools,
            )
            if prepared.parse
            else None
        )
        self._stop = StopStringMatcher(req.stop) if req.stop else None
        self._strip_eos = not prepared.parse
        self._usage = Usage(prompt_tokens=prepared.prompt_tokens)
        self._mode_reasoning = req.thinking and prepared.parse
        self._first: EngineChunk | None = None
        self._closed = False
        self._detok_seconds = 0.0
        self._last_chunk_at = 0.0

    @property
    def index(self) -> int:
        return self._index

    async def start(self) -> None:
        """Await the first engine chunk. Errors here happen before any byte was sent."""
        assert self._engine is not None, "start() after aclose()"
        try:
            self._first = await anext(self._engine)
        except StopAsyncIteration:
            await self.aclose()
            raise EngineStreamError("the engine ended the stream without output") from None
        except BaseException:
            await self.aclose()
            raise
        if self._first.finish_reason == "abort":
            # The engine refused the request outright: still time for an error status.
            message = self._first.message or "the engine aborted the request"
            await self.aclose()
            raise EngineError(f"the engine rejected the request: {message}")
        now = time.perf_counter()
        self._last_chunk_at = now
        if self._metrics is not None:
            self._metrics.ttft.observe(now - self._prepared.arrival)

    def __aiter__(self) -> AsyncIterator[PipelineChunk]:
        return self._run()

    async def _run(self) -> AsyncIterator[PipelineChunk]:
        chunk = self._first
        assert chunk is not None, "iterate a ChoiceStream only after start()"
        self._first = None
        engine = self._engine
        assert engine is not None
        metrics = self._metrics
        try:
            while True:
                out = self._process(chunk)
                yield out
                if out.end is not None:
                    return
                try:
                    chunk = await anext(engine)
                except StopAsyncIteration:
                    raise EngineStreamError(
                        "the engine worker closed the stream before finishing; the response is incomplete"
                    ) from None
                except EngineError as exc:
                    # Tokens were already sent: nothing is retryable any more. The detail (worker
                    # URL, transport error) goes to the log, not to the client.
                    log.warning(
                        "engine failed mid-stream: %s",
                        exc.message,
                        extra={"request_id": self._prepared.request_id, "choice": self._index},
                    )
                    raise EngineStreamError(
                        f"the engine worker failed after {self._usage.completion_tokens} tokens; "
                        "the response is incomplete"
                    ) from exc
                if metrics is not None:
                    now = time.perf_counter()
                    metrics.itl.observe(now - self._last_chunk_at)
                    self._last_chunk_at = now
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the engine iterator (aborting the request if it still runs). Idempotent."""
        if self._closed:
            return
        self._closed = True
        engine, self._engine = self._engine, None
        if engine is not None:
            aclose = getattr(engine, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        metrics = self._metrics
        if metrics is not None:
            metrics.detokenization.observe(self._detok_seconds)
            metrics.generation_tokens.inc(self._usage.completion_tokens)
            dropped = getattr(self._parser, "dropped_undeclared_calls", 0) if self._parser is not None else 0
            if isinstance(dropped, int) and dropped:
                metrics.dropped_tool_calls.inc(dropped)

    # -- the hot path: one engine chunk ---------------------------------------------

    def _process(self, chunk: EngineChunk) -> PipelineChunk:
        parser = self._parser
        if chunk.finish_reason is not None or self._stop is not None or parser is None:
            return self._process_full(chunk)
        # Fast path: a mid-stream chat chunk without stop strings (the common case).
        started = time.perf_counter()
        ids = chunk.token_ids
        n_tokens = len(ids)
        usage = self._usage
        reported = chunk.completion_tokens
        usage.completion_tokens = reported if reported is not None else usage.completion_tokens + n_tokens
        text = self._detok.push(ids) if ids else ""
        events = parser.feed(text) if text else []
        if self._mode_reasoning or (events and not self._never_reasoned(events)):
            self._count_reasoning(events, n_tokens)
        self._detok_seconds += time.perf_counter() - started
        return PipelineChunk(self._index, events, chunk.logprobs, None)

    def _process_full(self, chunk: EngineChunk) -> PipelineChunk:
        started = time.perf_counter()
        usage = self._usage
        ids = chunk.token_ids
        finish = chunk.finish_reason
        if finish == "abort":
            raise EngineStreamError(chunk.message or "the engine aborted the request")
        if self._strip_eos and finish == "stop" and ids and ids[-1] == self._pipeline.eos_token_id:
            ids = ids[:-1]  # raw completions: the EOS token is not part of the text
        n_tokens = len(chunk.token_ids)
        if chunk.completion_tokens is not None:
            usage.completion_tokens = chunk.completion_tokens
        else:
            usage.completion_tokens += n_tokens
        if chunk.prompt_tokens is not None:
            usage.prompt_tokens = chunk.prompt_tokens
        if chunk.cached_tokens is not None:
            usage.cached_tokens = chunk.cached_tokens

        text = self._detok.push(ids) if ids else ""
        if finish is not None:
            text += self._detok.flush()
        parser = self._parser
        events: list[Any]
        if parser is not None:
            events = parser.feed(text) if text else []
            if finish is not None:
                events.extend(parser.finish("length" if finish == "length" else "stop"))
        else:
            events = [ContentDelta(text)] if text else []

        end: StreamEnd | None = None
        stop = self._stop
        if stop is not None:
            events = self._match_stops(events, finish is not None)
            if stop.matched is not None:
                end = StreamEnd("stop", usage, stop.matched)
        if end is None and finish is not None:
            reason: FinishReason = "length" if finish == "length" else "stop"
            if events and isinstance(events[-1], Finish):
                reason = events[-1].reason
            end = StreamEnd(reason, usage, None)
        if events and isinstance(events[-1], Finish):
            events.pop()
        if self._mode_reasoning or (events and not self._never_reasoned(events)):
            self._count_reasoning(events, n_tokens)
        self._detok_seconds += time.perf_counter() - started
        return PipelineChunk(self._index, events, chunk.logprobs, end)

    def _match_stops(self, events: list[Any], final: bool) -> list[Any]:
        """Apply stop strings to the content events; on a match drop everything after it."""
        stop = self._stop
        assert stop is not None
        out: list[Any] = []
        for ev in events:
            if type(ev) is ContentDelta:
                text, matched = stop.feed(ev.text)
                if text:
                    out.append(ContentDelta(text))
                if matched is not None:
                    return out
            else:
                # Content cannot continue across another kind of event: settle the held text
                # first (it may itself hold a complete stop string that waited for a longer one).
                held = stop.flush()
                if held:
                    out.append(ContentDelta(held))
                if stop.matched is not None:
                    return out
                out.append(ev)
        if final:
            held = stop.flush()
            if held:
                # before a trailing Finish, if any
                if out and isinstance(out[-1], Finish):
                    out.insert(len(out) - 1, ContentDelta(held))
                else:
                    out.append(ContentDelta(held))
        return out

    @staticmethod
    def _never_reasoned(events: list[Any]) -> bool:
        # A plain loop, not all(<genexpr>): this runs once per engine chunk.
        for ev in events:  # noqa: SIM110
            if type(ev) is ReasoningDelta:
                return False
        return True

    def _count_reasoning(self, events: list[Any], n_tokens: int) -> None:
        reasoning_chars = other_chars = 0
        for ev in events:
            t = type(ev)
            if t is ReasoningDelta:
                reasoning_chars += len(ev.text)
            elif t is ContentDelta or t is ToolCallArgumentsDelta:
                other_chars += len(ev.text)
            elif t is ToolCallStart:
                other_chars += 1
        if reasoning_chars and not other_chars:
            self._usage.reasoning_tokens += n_tokens
            self._mode_reasoning = True
        elif other_chars and not reasoning_chars:
            self._mode_reasoning = False
        elif reasoning_chars and other_chars:
            self._usage.reasoning_tokens += round(
                n_tokens * reasoning_chars / (reasoning_chars + other_chars)
            )
            self._mode_reasoning = type(events[-1]) is ReasoningDelta
        elif self._mode_reasoning:
            self._usage.reasoning_tokens += n_tokens


def _replace_seed(sampling: SamplingParams, seed: int) -> SamplingParams:
    from dataclasses import replace

    return replace(sampling, seed=seed)


async def merge_choices(streams: Sequence[ChoiceStream]) -> AsyncIterator[PipelineChunk]:
    """Interleave the chunks of started choice streams as they arrive.

    One stream is iterated directly (no task, no queue: the common case stays
    cheap). Several run in tasks feeding a queue; closing this iterator early
    cancels them, which closes (aborts) every engine request.
    """
    if len(streams) == 1:
        stream = streams[0]
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()
        return

    queue: asyncio.Queue[PipelineChunk | BaseException | None] = asyncio.Queue()

    async def pump(stream: ChoiceStream) -> None:
        try:
            async for chunk in stream:
                await queue.put(chunk)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # forwarded to the consumer
            await queue.put(exc)
        finally:
            await stream.aclose()
            await queue.put(None)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --------------------------------------------------------------------------- accumulation


@dataclass(slots=True)
class AccumulatedToolCall:
    index: int
    id: str
    name: str
    arguments: str


class ChoiceAccumulator:
    """Folds one choice's chunks into the final message (the non-streaming answer)."""

    __slots__ = ("_args", "_calls", "_content", "_reasoning", "end", "index", "logprobs")

    def __init__(self, index: int) -> None:
        self.index = index
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, AccumulatedToolCall] = {}
        self._args: dict[int, list[str]] = {}
        self.logprobs: list[TokenLogprob] = []
        self.end: StreamEnd | None = None

    def add(self, chunk: PipelineChunk) -> None:
        for ev in chunk.events:
            t = type(ev)
            if t is ContentDelta:
                self._content.append(ev.text)
            elif t is ReasoningDelta:
                self._reasoning.append(ev.text)
            elif t is ToolCallStart:
                self._calls[ev.index] = AccumulatedToolCall(ev.index, ev.id, ev.name, "")
                self._args[ev.index] = []
            elif t is ToolCallArgumentsDelta:
                self._args.setdefault(ev.index, []).append(ev.text)
        if chunk.logprobs:
            self.logprobs.extend(chunk.logprobs)
        if chunk.end is not None:
            self.end = chunk.end

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def reasoning_content(self) -> str:
        return "".join(self._reasoning)

    @property
    def tool_calls(self) -> list[AccumulatedToolCall]:
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            call.arguments = "".join(self._args.get(index, ())) or "{}"
            calls.append(call)
        return calls

    @property
    def finish_reason(self) -> FinishReason:
        return self.end.finish_reason if self.end is not None else "stop"

    @property
    def usage(self) -> Usage:
        return self.end.usage if self.end is not None else Usage()


async def collect(streams: Sequence[ChoiceStream]) -> list[ChoiceAccumulator]:
    """Run started streams to the end and return one accumulator per choice, by index."""
    accs = {s.index: ChoiceAccumulator(s.index) for s in streams}
    async for chunk in merge_choices(streams):
        accs[chunk.index].add(chunk)
    return [accs[i] for i in sorted(accs)]
