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

This module holds :class:`ChatPipeline`, the facade the API layer talks to, and re-exports the
pipeline's names from the modules that own them:

- ``config``: :class:`PipelineConfig`, the settings the pipeline reads;
- ``interfaces``: the metrics protocols and what a choice's stream reads of the pipeline;
- ``request``: the request, chunk and usage records;
- ``render``: :class:`PromptRenderer` and the prompt's tools;
- ``prepare``: rendering and tokenizing, on the event loop or the offload threads;
- ``planning``: context fit, decoding constraint and sampling parameters;
- ``stream``: :class:`ChoiceStream`, one choice's engine request and output;
- ``accumulate``: merging choice streams and folding them into answers.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from deepseek_frontend.generation import WorkerCapabilities

from .accumulate import AccumulatedToolCall, ChoiceAccumulator, collect, merge_choices
from .backlog import STREAM_YIELD_MS, PromptBacklog
from .config import OFFLOAD_MIN_CHARS, OFFLOAD_PREPARE_CHARS, PipelineConfig
from .interfaces import PipelineMetrics
from .offload import OFFLOAD_THREADS, LoopTurns, OffloadPool, release_current_turn
from .planning import UNKNOWN_RESERVATION_MARGIN, EnginePlanner, _max_token_chars
from .prepare import LOOP_TURN_SLOTS, PromptPreparer, _Draft, _image_handoff
from .render import PromptRenderer, prompt_tools
from .request import (
    _KEPT_ROLES,
    MAX_N,
    MAX_TOP_LOGPROBS,
    ChatRequest,
    Event,
    FinishReason,
    PipelineChunk,
    PreparedRequest,
    Scheduling,
    StreamEnd,
    Usage,
    request_chars,
)
from .stream import ChoiceStream, _replace_seed

if TYPE_CHECKING:
    from deepseek_frontend.engines.base import Engine
    from deepseek_frontend.tokenization import PromptTokenizer

__all__ = [
    "LOOP_TURN_SLOTS",
    "MAX_N",
    "MAX_TOP_LOGPROBS",
    "OFFLOAD_MIN_CHARS",
    "OFFLOAD_PREPARE_CHARS",
    "OFFLOAD_THREADS",
    "STREAM_YIELD_MS",
    "UNKNOWN_RESERVATION_MARGIN",
    "_KEPT_ROLES",
    "AccumulatedToolCall",
    "ChatPipeline",
    "ChatRequest",
    "ChoiceAccumulator",
    "ChoiceStream",
    "EnginePlanner",
    "Event",
    "FinishReason",
    "PipelineChunk",
    "PipelineConfig",
    "PipelineMetrics",
    "PreparedRequest",
    "PromptPreparer",
    "PromptRenderer",
    "Scheduling",
    "StreamEnd",
    "Usage",
    "_Draft",
    "_image_handoff",
    "_max_token_chars",
    "_replace_seed",
    "collect",
    "merge_choices",
    "prompt_tools",
    "request_chars",
]


class ChatPipeline:
    """Holds what every request shares: config, tokenizer, chat format, engine, metrics.

    ``config`` is the pipeline's own settings record, built by whoever composes the server.
    ``engine`` is where its requests go. ``offload`` and ``turns`` are another pipeline's, when
    several models of one process share their threads and their event loop's turns; by default the
    pipeline makes its own.
    """

    def __init__(
        self,
        config: PipelineConfig,
        tokenizer: PromptTokenizer,
        engine: Engine,
        metrics: PipelineMetrics | None = None,
        *,
        offload: OffloadPool | None = None,
        turns: LoopTurns | None = None,
    ) -> None:
        self.config = settings = config
        self.tokenizer = tokenizer
        self.engine = engine
        self.metrics = metrics
        self.family = settings.family
        self.renderer = PromptRenderer(settings.family, settings.reasoning_effort_profile)
        self.eos_token_id: int = tokenizer.eos_token_id
        self._special_token_ids: frozenset[int] | None = None
        #: prompts with at least this many characters of uncached text are tokenized off the event loop
        self.offload_min_chars: int = settings.offload_min_chars
        #: requests with at least this many characters of text are also rendered off the event loop
        self.offload_prepare_chars: int = settings.offload_prepare_chars
        self.offload = offload if offload is not None else OffloadPool(settings.offload_threads)
        #: turns for the short prompts prepared on the event loop (bursts queue instead of stalling it)
        self.turns = turns if turns is not None else LoopTurns(LOOP_TURN_SLOTS)
        #: whether prompt work waits, which a running stream's next chunk waits for (backlog.py)
        self.backlog = PromptBacklog(self.turns, self.offload, settings.stream_yield_ms / 1000)
        self.planner = EnginePlanner(settings, engine, self.eos_token_id, _max_token_chars(tokenizer))
        self.preparer = PromptPreparer(
            settings, tokenizer, self.renderer, self.planner, metrics, self.offload, self.turns
        )

    def __repr__(self) -> str:
        return f"ChatPipeline(family={self.family!r}, model={self.config.served_model_name!r})"

    @property
    def takes_images(self) -> bool:
        """Whether the model's format renders image parts (DeepSeek-V4.1)."""
        return self.renderer.takes_images

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the tokenizer's added (special) tokens: never part of answer text or its logprobs."""
        if self._special_token_ids is None:
            ids: set[int] = {self.eos_token_id, *self.tokenizer.full.get_added_tokens_decoder()}
            self._special_token_ids = frozenset(ids)
        return self._special_token_ids

    @property
    def max_token_chars(self) -> int | None:
        """Most characters one token can stand for: a lower bound of tokens is chars / this."""
        return self.planner.max_token_chars

    # -- prepare -----------------------------------------------------------------

    def prepare(self, req: ChatRequest) -> PreparedRequest:
        """Render, tokenize and check ``req``; build the engine's sampling parameters.

        Raises ``FormatError`` (messages the format cannot render),
        ``ContextLengthError``, ``RequestError`` (bad tool_choice / response_format)
        and ``UnsupportedFeatureError`` (a constraint the engine cannot enforce).
        """
        return self.preparer.prepare(req)

    async def prepare_async(self, req: ChatRequest) -> PreparedRequest:
        """:meth:`prepare`, with its costly parts off the event loop; a request its text alone proves
        too long is refused before any rendering (:meth:`PromptPreparer.prepare_async`)."""
        return await self.preparer.prepare_async(req)

    def count_prompt_tokens(self, req: ChatRequest) -> int:
        """Tokens of the prompt ``prepare`` would send (image placeholders expanded), without
        context-length or engine checks."""
        return self.preparer.count_prompt_tokens(req)

    async def count_prompt_tokens_async(self, req: ChatRequest) -> int:
        """:meth:`count_prompt_tokens`, its costly parts off the event loop (as :meth:`prepare_async`)."""
        return await self.preparer.count_prompt_tokens_async(req)

    def prepare_raw(self, req: ChatRequest, input_ids: list[int]) -> PreparedRequest:
        """A /v1/completions request: ``input_ids`` go to the engine as they are, output is not parsed.

        ``req.messages`` is ignored; sampling fields, stop strings, n and logprobs apply.
        """
        return self.preparer.prepare_raw(req, input_ids)

    def check_length_lower_bound(self, req: ChatRequest) -> None:
        """Raise ``ContextLengthError`` when ``req`` is provably too long, without tokenizing it."""
        self.planner.check_length_lower_bound(req)

    def capabilities(self) -> WorkerCapabilities | None:
        """What the engine workers reported they can serve (None: nothing reported)."""
        return self.planner.capabilities()

    def context_length(self, caps: WorkerCapabilities | None = None) -> int:
        """The context a request must fit: the frontend's ``context_length``, or the workers' when smaller."""
        return self.planner.context_length(caps)

    # -- stream ------------------------------------------------------------------

    def stream(self, prepared: PreparedRequest, choice_index: int = 0) -> ChoiceStream:
        """The (not yet started) stream of choice ``choice_index``; call ``start()`` then iterate."""
        return ChoiceStream(self, prepared, choice_index)

    async def start(self, prepared: PreparedRequest) -> list[ChoiceStream]:
        """Start all ``n`` choices concurrently and await each one's first engine chunk.

        If any fails before its first token, the others are closed (aborted) and the
        error is raised, so the caller can still answer with an error status.
        """
        # waiting for the engine: the request's loop turn (if any) goes to the next request
        release_current_turn()
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
