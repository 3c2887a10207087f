"""One choice's run: its engine request, detokenizer, output parser and stop strings.

:class:`ChoiceStream` sends one engine request and turns each engine chunk into a
:class:`PipelineChunk`: engine ids -> ``IncrementalDetokenizer`` -> ``StreamParser`` events ->
stop strings over the answer text. It splits usage into reasoning and other tokens, keeps only
the logprobs of answer tokens, records the choice's metrics, and on close (end, stop string,
client gone) closes the engine iterator, which aborts the request on the worker.

The request's :class:`~.request.Scheduling` goes with it: its priority into the engine request,
and its deadline onto every wait for the engine (the first chunk and each one after it). When the
deadline passes the wait is cancelled -- which closes the engine stream and so aborts the engine
request -- and :class:`~deepseek_frontend.errors.DeadlineExceededError` (408) is raised: an error
response before the first chunk, the API's error event once a stream has begun. Only a request
with a deadline pays for the timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from deepseek_frontend import _tracing
from deepseek_frontend.errors import (
    DeadlineExceededError,
    EngineError,
    EngineStreamError,
    EngineTimeoutError,
    EngineUnavailableError,
    WorkersStartingError,
)
from deepseek_frontend.generation import EngineChunk, GenerateRequest, SamplingParams, TokenLogprob, leg_id
from deepseek_frontend.parsing import (
    ContentDelta,
    Finish,
    ReasoningDelta,
    StreamParser,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

from .interfaces import StreamSource
from .request import Event, FinishReason, PipelineChunk, PreparedRequest, Scheduling, StreamEnd, Usage
from .stop import StopStringMatcher

log = logging.getLogger("deepseek_frontend.api")


def for_client(exc: EngineError, request_id: str, choice: int = 0) -> EngineError:
    """What a client is told of a worker's failure before the first token: the same class (so the
    same status and error type), a stable message that names no worker and carries ``request_id``
    -- the engine's messages hold worker URLs and transport reprs (aiohttp's ``ConnectionKey(...)``)
    -- while the detail goes to the log under that id (and to ``/health``'s ``last_error``).

    A deadline's message is the frontend's own (which deadline passed) and is kept; so is the
    "workers are still being discovered" answer with its ``Retry-After``.
    """
    where = f"(request id {request_id})"
    if isinstance(exc, WorkersStartingError):
        return WorkersStartingError(f"{exc.message} {where}", retry_after_s=exc.retry_after_s)
    if isinstance(exc, EngineTimeoutError):
        return EngineTimeoutError(f"{exc.message} {where}")
    log.warning(
        "engine failed before the first token: %s",
        exc.message,
        extra={"request_id": request_id, "choice": choice},
    )
    if isinstance(exc, EngineUnavailableError):
        return EngineUnavailableError(f"worker unavailable: no engine worker could serve the request {where}")
    return EngineError(f"worker error: the engine worker failed to answer the request {where}")


def _replace_seed(sampling: SamplingParams, seed: int) -> SamplingParams:
    from dataclasses import replace

    return replace(sampling, seed=seed)


def deadline_error(scheduling: Scheduling, what: str) -> DeadlineExceededError:
    """The 408 of a request whose time budget ran out ``what`` ("before its first token", ...)."""
    return DeadlineExceededError(
        f"the request's time budget (x-request-timeout-ms: {scheduling.budget_ms}) ran out {what}; "
        "the request was stopped"
    )


async def _next_by(engine: AsyncIterator[EngineChunk], scheduling: Scheduling, what: str) -> EngineChunk:
    """The engine's next chunk, unless the request's deadline passes first: then the wait is
    cancelled (the engine stream is closed, its request aborted) and :func:`deadline_error` raised."""
    deadline = scheduling.deadline
    assert deadline is not None
    try:
        async with asyncio.timeout_at(deadline):
            return await anext(engine)
    except TimeoutError:
        raise deadline_error(scheduling, what) from None


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
        "_drop_eos",
        "_engine",
        "_first",
        "_index",
        "_last_chunk_at",
        "_lp_pending",
        "_metrics",
        "_mode_reasoning",
        "_parser",
        "_pipeline",
        "_prepared",
        "_scheduling",
        "_stop",
        "_strip_eos",
        "_trace",
        "_usage",
    )

    def __init__(self, pipeline: StreamSource, prepared: PreparedRequest, index: int) -> None:
        req = prepared.request
        self._pipeline = pipeline
        self._prepared = prepared
        self._index = index
        self._metrics = pipeline.metrics
        sampling = prepared.sampling
        if req.seed is not None and index:
            # n > 1 with a seed: each choice gets its own (still reproducible) seed.
            sampling = _replace_seed(sampling, req.seed + index)
        # each choice its own leg (generation.py: no engine rid is a prefix of another's)
        rid = req.request_id if req.n == 1 else leg_id(req.request_id, f"c{index}")
        #: the engine span (tracing on) and the trace context the worker gets
        self._trace, trace_headers = _tracing.engine_call(rid, index)
        self._scheduling = req.scheduling
        self._engine: AsyncIterator[EngineChunk] | None = pipeline.engine.generate(
            GenerateRequest(
                request_id=rid,
                input_ids=prepared.input_ids,
                sampling=sampling,
                images=prepared.images,
                trace_headers=trace_headers,
                priority=req.scheduling.priority,
            )
        )
        self._detok = pipeline.tokenizer.new_detokenizer()
        self._parser: StreamParser | None = (
            StreamParser(
                pipeline.family,
                thinking=req.thinking and not prepared.continues_assistant,
                tools=prepared.tools,
                tool_choice=req.tool_choice if prepared.tools else "none",
                keep_undeclared_tools=req.keep_undeclared_tools,
            )
            if prepared.parse
            else None
        )
        if self._parser is not None and prepared.opened_block:
            # the prompt opened the calls block; opening markup produces no events
            self._parser.feed(prepared.opened_block)
        self._stop = StopStringMatcher(req.stop) if req.stop else None
        self._strip_eos = not prepared.parse
        # ignore_eos: an EOS the model writes anyway is not the end of the answer (the engine goes
        # on to max_tokens), so the parser must not see it; usage still counts it.
        self._drop_eos = req.ignore_eos and prepared.parse
        self._usage = Usage(prompt_tokens=prepared.prompt_tokens)
        self._mode_reasoning = req.thinking and prepared.parse and not prepared.continues_assistant
        self._first: EngineChunk | None = None
        self._closed = False
        self._detok_seconds = 0.0
        self._last_chunk_at = 0.0
        #: logprobs of tokens whose text the parser holds back (not yet known to be content)
        self._lp_pending: list[TokenLogprob] = []

    @property
    def index(self) -> int:
        return self._index

    @property
    def first_cached_tokens(self) -> int:
        """Prompt tokens the engine's first chunk reported as cache hits (0 when it did not say);
        valid between ``start()`` and the first iteration."""
        first = self._first
        return (first.cached_tokens or 0) if first is not None else 0

    async def start(self) -> None:
        """Await the first engine chunk. Errors here happen before any byte was sent."""
        assert self._engine is not None, "start() after aclose()"
        scheduling = self._scheduling
        try:
            if scheduling.deadline is None:
                self._first = await anext(self._engine)
            elif asyncio.get_running_loop().time() >= scheduling.deadline:
                # spent before the engine was asked (queueing, preparing): it never gets the request
                raise deadline_error(scheduling, "before the request reached the model")
            else:
                self._first = await _next_by(self._engine, scheduling, "before its first token")
        except StopAsyncIteration:
            await self.aclose()
            raise EngineStreamError("the engine ended the stream without output") from None
        except EngineError as exc:
            if self._trace is not None:
                self._trace.fail(exc)
            await self.aclose()
            raise for_client(exc, self._prepared.request_id, self._index) from exc
        except BaseException as exc:
            if self._trace is not None:
                self._trace.fail(exc)
            await self.aclose()
            raise
        if self._first.finish_reason == "abort":
            # The engine refused the request outright: still time for an error status.
            message = self._first.message or "the engine aborted the request"
            await self.aclose()
            raise EngineError(f"the engine rejected the request: {message}")
        now = time.perf_counter()
        self._last_chunk_at = now
        if self._trace is not None:
            self._trace.first_token(self._first.cached_tokens or 0)
        if self._metrics is not None:
            self._metrics.ttft.observe(now - self._prepared.arrival)
            self._metrics.ledger.first_token(self._prepared.request_id, now - self._prepared.arrival)

    def __aiter__(self) -> AsyncIterator[PipelineChunk]:
        return self._run()

    async def _run(self) -> AsyncIterator[PipelineChunk]:
        chunk = self._first
        assert chunk is not None, "iterate a ChoiceStream only after start()"
        self._first = None
        engine = self._engine
        assert engine is not None
        metrics = self._metrics
        scheduling = self._scheduling
        timed = scheduling.deadline is not None
        backlog = self._pipeline.backlog
        try:
            while True:
                out = self._process(chunk)
                yield out
                if out.end is not None:
                    return
                try:
                    if timed:
                        chunk = await _next_by(engine, scheduling, "part-way through its answer")
                    else:
                        if backlog.waiting():
                            # prompts first (pipeline/backlog.py): what the engine writes meanwhile
                            # comes in the next chunk
                            await backlog.cleared()
                        chunk = await anext(engine)
                except StopAsyncIteration:
                    raise EngineStreamError(
                        "the engine worker closed the stream before finishing; the response is incomplete"
                    ) from None
                except EngineTimeoutError:
                    raise  # already says what happened (and the pool logged and charged the worker)
                except EngineError as exc:
                    if self._trace is not None:
                        self._trace.fail(exc)
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
        trace, self._trace = self._trace, None
        if trace is not None:
            trace.end(self._usage.prompt_tokens, self._usage.completion_tokens)
        metrics = self._metrics
        if metrics is not None:
            metrics.detokenization.observe(self._detok_seconds)
            metrics.generation_tokens.inc(self._usage.completion_tokens)
            usage = self._usage
            metrics.ledger.usage(
                self._prepared.request_id,
                self._prepared.request.response_model,
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
            )
            dropped = getattr(self._parser, "dropped_undeclared_calls", 0) if self._parser is not None else 0
            if isinstance(dropped, int) and dropped:
                metrics.dropped_tool_calls.inc(dropped)

    # -- the hot path: one engine chunk ---------------------------------------------

    def _process(self, chunk: EngineChunk) -> PipelineChunk:
        parser = self._parser
        if chunk.logprobs and parser is not None:
            return self._process_with_logprobs(chunk)
        if (
            chunk.finish_reason is not None
            or self._stop is not None
            or parser is None
            or (self._drop_eos and self._pipeline.eos_token_id in chunk.token_ids)
        ):
            return self._process_full(chunk)
        # Fast path: a mid-stream chat chunk without stop strings (the common case; with
        # ``ignore_eos`` too, as long as the chunk holds no EOS to leave out).
        started = time.perf_counter()
        ids = chunk.token_ids
        n_tokens = len(ids)
        usage = self._usage
        reported = chunk.completion_tokens
        usage.completion_tokens = reported if reported is not None else usage.completion_tokens + n_tokens
        text = self._detok.push(ids) if ids else ""
        events = parser.feed(text) if text else []
        # (one content delta, the usual chunk of an answer, needs no look at each event)
        if self._mode_reasoning or (
            events
            and (len(events) != 1 or events[0].__class__ is not ContentDelta)
            and not self._never_reasoned(events)
        ):
            self._count_reasoning(events, n_tokens)
        self._detok_seconds += time.perf_counter() - started
        return PipelineChunk(self._index, events, chunk.logprobs, None)

    def _process_with_logprobs(self, chunk: EngineChunk) -> PipelineChunk:
        """A chunk with logprobs, token by token, keeping the logprobs of answer tokens only.

        ``logprobs.content`` must carry exactly the tokens of ``content``: a token is kept
        when the text it completes comes out as answer content; reasoning tokens, ``</think>``,
        DSML markup, tool-call arguments and EOS (any special token) are left out. A token
        whose text the parser holds back (it may start markup) waits in ``_lp_pending`` until
        its text is settled. Reasoning logprobs are not returned anywhere (see docs/clients.md).
        Only requests asking for logprobs pay for the per-token feeding.
        """
        ids = chunk.token_ids
        lps = chunk.logprobs or []
        n = len(ids)
        if n != len(lps) or n <= 1:
            parts = [(chunk, lps)]
        else:
            reported = chunk.completion_tokens
            parts = [
                (
                    EngineChunk(
                        [ids[i]],
                        chunk.finish_reason if i == n - 1 else None,
                        chunk.matched_stop if i == n - 1 else None,
                        chunk.prompt_tokens,
                        None if reported is None else reported - (n - 1 - i),
                        chunk.cached_tokens,
                    ),
                    [lps[i]],
                )
                for i in range(n)
            ]
        special = self._pipeline.special_token_ids
        events: list[Event] = []
        kept: list[TokenLogprob] = []
        end: StreamEnd | None = None
        for part, part_lps in parts:
            out = self._process_full(part)
            events.extend(out.events)
            has_content = has_other = False
            for ev in out.events:
                if type(ev) is ContentDelta:
                    has_content = True
                else:
                    has_other = True
            current = [lp for lp in part_lps if lp.token_id not in special]
            if not out.events:
                self._lp_pending.extend(current)  # held back: settled by a later token
            elif has_content:
                kept.extend(self._lp_pending)
                # a token that also opened markup (content, then a tool call) is markup
                if not has_other or type(out.events[-1]) is ContentDelta:
                    kept.extend(current)
                self._lp_pending = []
            else:
                self._lp_pending = []
            if out.end is not None:
                end = out.end
                break
        return PipelineChunk(self._index, events, kept, end)

    def _process_full(self, chunk: EngineChunk) -> PipelineChunk:
        started = time.perf_counter()
        usage = self._usage
        ids = chunk.token_ids
        finish = chunk.finish_reason
        if finish == "abort":
            raise EngineStreamError(chunk.message or "the engine aborted the request")
        if self._strip_eos and finish == "stop" and ids and ids[-1] == self._pipeline.eos_token_id:
            ids = ids[:-1]  # raw completions: the EOS token is not part of the text
        if self._drop_eos and self._pipeline.eos_token_id in ids:
            eos = self._pipeline.eos_token_id
            ids = [t for t in ids if t != eos]
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
