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

from deepseek_frontend import _tracing
from deepseek_frontend.engines.base import (
    DecodingConstraint,
    EngineChunk,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
    WorkerCapabilities,
)
from deepseek_frontend.errors import (
    ContextLengthError,
    EngineError,
    EngineStreamError,
    EngineTimeoutError,
    FrontendError,
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

from .offload import CURRENT_TURN, OFFLOAD_THREADS, LoopTurns, OffloadPool, release_current_turn
from .stop import StopStringMatcher

if TYPE_CHECKING:
    from deepseek_frontend.api.config import ServerConfig
    from deepseek_frontend.api.metrics import FrontendMetrics
    from deepseek_frontend.formats.segments import PromptSegment
    from deepseek_frontend.tokenization import PendingEncoding, PromptTokenizer

log = logging.getLogger("deepseek_frontend.api")

FinishReason = Literal["stop", "length", "tool_calls"]
#: What the pipeline yields inside a chunk: the parsing events (``Finish`` is folded into ``StreamEnd``).
Event = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArgumentsDelta | ToolCallEnd

#: Largest n a request may ask for (each choice is a full engine request).
MAX_N = 16
#: Largest top_logprobs (OpenAI's limit).
MAX_TOP_LOGPROBS = 20
#: Output slots kept free when a request has no max_tokens and the workers did not report their
#: reservation: SGLang's EAGLE reserves max(topk * steps, draft tokens) slots -- 4 in the recipe --
#: and refuses a request that fills the context without leaving them.
UNKNOWN_RESERVATION_MARGIN = 16


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
    reasoning_effort: str | int | None = None
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
    #: the ``model`` the client sent (an alias, say), echoed in every response; None: ``model``
    requested_model: str | None = None
    #: generate until max_tokens whatever EOS says (benchmark clients); passed to the engine
    ignore_eos: bool = False
    #: no EOS / stop before this many completion tokens (vLLM ``min_tokens``)
    min_tokens: int = 0

    @property
    def response_model(self) -> str:
        """The model name every response and stream event carries: what the client asked for.

        Claude Code, for one, drops the ``thinking`` blocks of turns whose model differs from
        the one it requested, so an alias (``claude-*``) must come back as sent.
        """
        return self.requested_model or self.model


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
    #: the prompt ends inside the last (assistant) message: the output continues its content
    #: (after ``</think>``), so it is parsed from content mode, not reasoning
    continues_assistant: bool = False
    #: DSML text the prompt already opened for the output (DeepSeek's grammar-less ``tool_choice``
    #: fallback: the calls block is pre-opened); the parser starts after it
    opened_block: str = ""
    #: the engine hand-off of the prompt's images, in placeholder order (``data:`` URLs)
    images: tuple[str, ...] = ()
    #: tokens the engine adds when it expands the image placeholders (``sum(tokens - 1)``)
    image_extra_tokens: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens as the model reads them: ``input_ids`` with every image placeholder expanded."""
        return len(self.input_ids) + self.image_extra_tokens


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
        from deepseek_frontend.formats import attach_request_tools, get_chat_format, place_instructions
        from deepseek_frontend.formats.request import TOOL_REFERENCE_TEMPLATE, normalize_tools

        self.chat_format = get_chat_format(family)
        self.reasoning_effort_profile = reasoning_effort_profile
        self._attach_request_tools = attach_request_tools
        self._place_instructions = place_instructions
        # The 0731 ("official") checkpoints saw tools as DeepSeek's API renders them (normalised);
        # the preview's reference encoder renders them as sent (formats.request.normalize_tools).
        self._normalize_tools = normalize_tools if reasoning_effort_profile == "official" else None
        # A family with a system token usable anywhere (V4.1's <｜System｜>) renders mid-conversation
        # instructions itself; V4 and V3.2 get them as tagged user text (formats.request).
        self._native_system_role = bool(getattr(self.chat_format, "NATIVE_SYSTEM_ROLE", False))
        # How a tool result lists the deferred tools it loads (Anthropic tool_reference blocks).
        self._tool_reference_template: str = getattr(
            self.chat_format, "TOOL_REFERENCE_TEMPLATE", TOOL_REFERENCE_TEMPLATE
        )
        params = inspect.signature(self.chat_format.render_prompt_segments).parameters
        # V3.2's renderer has no effort arguments; decided once here rather than per request.
        self._takes_effort = "reasoning_effort" in params
        #: the family reads images (its renderer reports the image records it wrote: V4.1)
        self.takes_images = "images" in params

    def render(self, req: ChatRequest, images: list[Any] | None = None) -> list[PromptSegment]:
        """The prompt segments of ``req``: request tools attached, thinking mode and effort applied.

        ``images``, when a list, receives the image records (resolved ``ImagePart`` s) in prompt
        order, one per image placeholder segment (families that read images only).
        """
        tools = prompt_tools(req)
        messages = self._place_instructions(list(req.messages), native_system_role=self._native_system_role)
        if tools and self._normalize_tools is not None:
            tools = self._normalize_tools(tools)
        # Always: besides tools and the response format, this writes out (or, without tools,
        # drops) the tool references of tool results.
        messages = self._attach_request_tools(
            messages, tools or [], req.response_format, tool_reference_template=self._tool_reference_template
        )
        thinking_mode = "thinking" if req.thinking else "chat"
        if self.takes_images:
            return self.chat_format.render_prompt_segments(
                messages,
                thinking_mode,
                reasoning_effort=req.reasoning_effort,
                reasoning_effort_profile=self.reasoning_effort_profile,
                images=images,
            )
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
        self._special_token_ids: frozenset[int] | None = None
        #: whether the "workers ignore seeds" warning was logged (once per pipeline)
        self._seed_warned = False
        limits = getattr(config, "limits", None)
        #: prompts with at least this many characters of uncached text are tokenized off the event loop
        self.offload_min_chars: int = getattr(limits, "offload_min_chars", OFFLOAD_MIN_CHARS)
        #: requests with at least this many characters of text are also rendered off the event loop
        self.offload_prepare_chars: int = getattr(limits, "offload_prepare_chars", OFFLOAD_PREPARE_CHARS)
        self.offload = OffloadPool(getattr(limits, "offload_threads", OFFLOAD_THREADS))
        #: turns for the short prompts prepared on the event loop (bursts queue instead of stalling it)
        self.turns = LoopTurns(LOOP_TURN_SLOTS)
        #: tokenizer self-checks running on the offload threads (held so they are not collected)
        self._self_checks: set[asyncio.Task[None]] = set()
        #: most characters one token can stand for: a lower bound of tokens is chars / this
        self.max_token_chars: int | None = _max_token_chars(tokenizer)

    def __repr__(self) -> str:
        return f"ChatPipeline(family={self.family!r}, model={self.config.served_model_name!r})"

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the tokenizer's added (special) tokens: never part of answer text or its logprobs."""
        if self._special_token_ids is None:
            ids: set[int] = {self.eos_token_id}
            full = getattr(self.tokenizer, "full", None)
            if full is not None:
                ids.update(full.get_added_tokens_decoder())
            self._special_token_ids = frozenset(ids)
        return self._special_token_ids

    # -- prepare -----------------------------------------------------------------

    def prepare(self, req: ChatRequest) -> PreparedRequest:
        """Render, tokenize and check ``req``; build the engine's sampling parameters.

        Raises ``FormatError`` (messages the format cannot render),
        ``ContextLengthError``, ``RequestError`` (bad tool_choice / response_format)
        and ``UnsupportedFeatureError`` (a constraint the engine cannot enforce).
        """
        draft = self._draft(req)
        draft.encode()
        return self._complete(draft)

    def count_prompt_tokens(self, req: ChatRequest) -> int:
        """Tokens of the prompt ``prepare`` would send (image placeholders expanded), without
        context-length or engine checks."""
        draft = self._draft(req, for_count=True)
        draft.encode()
        return self._count(draft)

    def _count(self, draft: _Draft) -> int:
        """Prompt tokens of an encoded draft, each image counted at its expanded size."""
        return len(self._finish(draft)) + _image_handoff(draft.images)[1]

    def _finish(self, draft: _Draft) -> list[int]:
        """The draft's prompt ids (``finish_encoding``). On the event loop, the tokenizer's sampled
        self-check -- a whole-prompt encode, 36 ms for 12K tokens and 0.2-0.3 s for 48K, once in
        512 prompts -- goes to the offload threads instead of stalling every stream."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # on an offload thread (a prompt prepared whole there) or a sync caller
            loop = None
        encoding = draft.encoding
        ids = self.tokenizer.finish_encoding(encoding, defer_self_check=loop is not None)
        if loop is not None and encoding.self_check_due:
            check = self.offload.run(self.tokenizer.self_check, encoding.segments, list(ids))
            task = loop.create_task(check)
            self._self_checks.add(task)
            task.add_done_callback(self._self_check_done)
        return ids

    def _self_check_done(self, task: asyncio.Task[None]) -> None:
        self._self_checks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("the tokenizer self-check failed: %r", task.exception())

    def _draft(self, req: ChatRequest, *, for_count: bool = False) -> _Draft:
        """Render ``req`` and resolve what the prompt caches know of its ids (no tokenizing)."""
        from deepseek_frontend.formats import continues_assistant

        started = time.perf_counter()
        tools = prompt_tools(req)
        preopened = None if for_count else self._preopened_block(req, tools)
        images: list[Any] = []
        with _tracing.phase("render"):
            if preopened is None:
                segments = self.renderer.render(req, images)
            else:
                render_req, opening = preopened
                segments = [*self.renderer.render(render_req, images), *opening]
        # a prompt over the context is refused later: it must not fill the caches on its way
        encoding = self.tokenizer.start_encoding(
            segments, cache_limit=None if for_count else self.context_length()
        )
        draft = _Draft(req, tools, continues_assistant(list(req.messages)), preopened, images, encoding)
        draft.seconds = time.perf_counter() - started
        return draft

    def _complete(self, draft: _Draft) -> PreparedRequest:
        """The :class:`PreparedRequest` of an encoded draft: ids, length checks, sampling."""
        req, tools, preopened, images = draft.request, draft.tools, draft.preopened, draft.images
        started = time.perf_counter()
        input_ids = self._finish(draft)
        if self.metrics is not None:
            self.metrics.tokenization.observe(draft.seconds + time.perf_counter() - started)

        handoff, extra = _image_handoff(images)
        if handoff:
            self._check_image_support(images)
        max_new = self._max_new_tokens(len(input_ids) + extra, req.max_tokens, param="max_tokens")
        constraint = self._constraint(req, tools, preopened=preopened is not None)
        sampling = self._sampling(req, max_new, constraint)
        return PreparedRequest(
            request=req,
            input_ids=input_ids,
            sampling=sampling,
            tools=tools,
            continues_assistant=draft.continues,
            opened_block="".join(seg[0] for seg in preopened[1]).lstrip("\n") if preopened else "",
            images=handoff,
            image_extra_tokens=extra,
        )

    # -- isolation: long prompts off the event loop ---------------------------------

    async def prepare_async(self, req: ChatRequest) -> PreparedRequest:
        """:meth:`prepare`, with its costly parts off the event loop.

        A request whose text alone proves it longer than the context is refused first, before
        any rendering or tokenization (:meth:`check_length_lower_bound`). A request of
        ``offload_prepare_chars`` or more is prepared wholly on the offload threads. Any other is
        rendered and looked up in the prompt caches on the loop, in its turn (for a follow-up of
        a cached conversation that is all the work there is, so it never waits behind the cold
        prompts of others); only when ``offload_min_chars`` or more of its text are not cached
        does the tokenizing of that text go to the threads.
        """
        self.check_length_lower_bound(req)
        draft = await self._draft_async(req, for_count=False)
        if isinstance(draft, _Draft):
            return self._complete(draft)
        assert isinstance(draft, PreparedRequest)  # prepared whole on a thread
        return draft

    async def count_prompt_tokens_async(self, req: ChatRequest) -> int:
        """:meth:`count_prompt_tokens`, its costly parts off the event loop (as :meth:`prepare_async`)."""
        draft = await self._draft_async(req, for_count=True)
        if isinstance(draft, _Draft):
            return self._count(draft)
        assert isinstance(draft, int)  # counted whole on a thread
        return draft

    async def _draft_async(self, req: ChatRequest, *, for_count: bool) -> _Draft | PreparedRequest | int:
        """An encoded draft of ``req``, or, for a request too long to render on the loop, the whole
        result of :meth:`prepare` / :meth:`count_prompt_tokens` computed on a thread."""
        if request_chars(req) >= self.offload_prepare_chars:
            release_current_turn()  # the loop is free for others while a thread does the work
            with _tracing.phase("render", {"deepseek.offloaded": True, "deepseek.with_tokenize": True}):
                return await self.offload.run(self.count_prompt_tokens if for_count else self.prepare, req)
        token = None
        if CURRENT_TURN.get() is None:  # callers outside the API layer: take a turn here
            token = CURRENT_TURN.set(await self.turns.take())
        try:
            draft = self._draft(req, for_count=for_count)
            uncached = draft.encoding.uncached_chars
            with _tracing.phase("tokenize", {"deepseek.uncached_chars": uncached}):
                if uncached >= self.offload_min_chars:
                    release_current_turn()
                    await self.offload.run(draft.encode)
                else:
                    draft.encode()
            return draft
        finally:
            if token is not None:
                release_current_turn()
                CURRENT_TURN.reset(token)

    def check_length_lower_bound(self, req: ChatRequest) -> None:
        """Raise ``ContextLengthError`` when ``req`` is provably too long, without tokenizing it.

        Every token of the (byte-level BPE) vocabulary stands for at most :attr:`max_token_chars`
        characters, and the prompt contains at least the text of the system and user messages, so
        it has at least ``chars / max_token_chars`` tokens. Only what that bound already puts over
        the context is refused here; everything else is counted exactly by :meth:`prepare`.
        """
        per_token = self.max_token_chars
        if not per_token:
            return
        chars = request_chars(req, kept_only=True)
        at_least = -(-chars // per_token)
        context = self.context_length()
        if req.max_tokens is not None and at_least + req.max_tokens > context:
            # the same field the exact check would blame (prepare's _max_new_tokens)
            raise ContextLengthError(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"at least {at_least + req.max_tokens} tokens (at least {at_least} in the messages: "
                f"{chars} characters of text; {req.max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
                param="max_tokens",
            )
        if at_least >= context:
            raise ContextLengthError(
                f"This model's maximum context length is {context} tokens. However, your messages "
                f"hold {chars} characters of text, which is at least {at_least} tokens. "
                "Please reduce the length of the messages.",
                param="messages",
            )

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

    def _check_image_support(self, images: Sequence[Any]) -> None:
        """Refuse images up front when the workers said they cannot read them.

        SGLang expands an image placeholder with its multimodal processor, which it loads with the
        tokenizer: a worker launched with ``--skip-tokenizer-init`` (``/server_info``) would refuse the
        request (or worse, run it without the images). The 400 names the first image part.
        """
        caps = self.capabilities()
        if caps is None or caps.extra.get("skip_tokenizer_init") is not True:
            return
        where = getattr(images[0], "extra", {}).get("where") or "messages"
        raise UnsupportedFeatureError(
            f"{where}: the {self.config.engine} engine workers of this server run without their tokenizer "
            "(--skip-tokenizer-init), so they have no image processor and cannot read images",
            param=where,
        )

    def capabilities(self) -> WorkerCapabilities | None:
        """What the engine workers reported they can serve (None: nothing reported)."""
        fn = getattr(self.backend, "capabilities", None)
        if not callable(fn):
            return None
        caps = fn()
        return caps if isinstance(caps, WorkerCapabilities) else None

    def context_length(self, caps: WorkerCapabilities | None = None) -> int:
        """The context a request must fit: the frontend's ``context_length``, or the workers' when smaller."""
        caps = caps if caps is not None else self.capabilities()
        if caps is not None and caps.context_length:
            return min(self.config.context_length, caps.context_length)
        return self.config.context_length

    def _max_new_tokens(self, prompt_tokens: int, requested: int | None, *, param: str) -> int:
        """The engine's ``max_new_tokens`` for a prompt of ``prompt_tokens``; raises ContextLengthError.

        The context is the smaller of the frontend's ``context_length`` and the workers' reported one.
        Workers may reserve output slots on top of ``max_new_tokens`` (SGLang's EAGLE keeps draft
        tokens there) and refuse ``prompt + reserved + max_new_tokens > context``, so: an explicit
        ``max_tokens`` that does not fit with the reservation is a 400 naming ``max_tokens``; without
        one the default is the room left after the reservation -- or after
        :data:`UNKNOWN_RESERVATION_MARGIN` tokens when the workers did not say what they reserve --
        capped by ``default_max_tokens``, so a request without ``max_tokens`` never fails for length.
        """
        caps = self.capabilities()
        context = self.context_length(caps)
        reserved = caps.reserved_output_tokens if caps is not None else 0
        room = context - prompt_tokens - reserved
        if requested is not None:
            if room <= 0 or requested > room:
                held = f", {reserved} reserved by the engine's speculative decoding" if reserved else ""
                raise ContextLengthError(
                    f"This model's maximum context length is {context} tokens. However, you requested "
                    f"{prompt_tokens + requested + reserved} tokens ({prompt_tokens} in the messages, "
                    f"{requested} in the completion{held}). "
                    "Please reduce the length of the messages or completion"
                    + (f" (max_tokens can be at most {room} here)." if room > 0 else "."),
                    param=param,
                )
            return requested
        margin = reserved if caps is not None else UNKNOWN_RESERVATION_MARGIN
        room = context - prompt_tokens - margin
        if room <= 0:
            held = f" and {margin} output slots the engine reserves" if margin else ""
            raise ContextLengthError(
                f"This model's maximum context length is {context} tokens. However, your messages resulted "
                f"in {prompt_tokens} tokens{held}. Please reduce the length of the messages.",
                param="messages",
            )
        default = self.config.default_max_tokens
        return min(room, default) if default else room

    def _preopened_block(
        self, req: ChatRequest, tools: list[dict[str, Any]] | None
    ) -> tuple[ChatRequest, list[PromptSegment]] | None:
        """DeepSeek's grammar-less ``tool_choice`` fallback, or None when it does not apply.

        ``deepseek-recipe`` renders ``tool_choice`` required without constrained decoding by
        ending the prompt with an opened calls block (``</think>``, a blank line,
        ``<｜DSML｜tool_calls>``, a newline) and parsing the output from inside it; a named tool
        becomes "required" with only that tool in the prompt. It does so in chat mode only
        (thinking mode refuses the choice), and so does this. Used when the workers cannot
        enforce an ``ebnf`` grammar. Returns the request to render (tools narrowed) and the
        segments to append.
        """
        from deepseek_frontend.formats import continues_assistant
        from deepseek_frontend.formats.segments import PromptSegment
        from deepseek_frontend.parsing.constraints import BLOCK_NAMES, resolve_tool_choice

        if not tools or req.tool_choice in ("auto", "none") or self.backend.supports_constraint("ebnf"):
            return None
        if req.thinking or self.family not in BLOCK_NAMES or continues_assistant(list(req.messages)):
            # _constraint explains why this cannot be served (a prefill cannot also open a block)
            return None
        names = [t["function"]["name"] for t in tools]
        allowed = resolve_tool_choice(req.tool_choice, names)
        if len(allowed) < len(names):
            from dataclasses import replace

            kept = [t for t in tools if t["function"]["name"] in allowed]
            req = replace(req, tools=kept)
        opening = [
            PromptSegment("\n\n<"),
            PromptSegment("｜DSML｜", True),
            PromptSegment(f"{BLOCK_NAMES[self.family]}>\n"),
        ]
        return req, opening

    def _constraint(
        self, req: ChatRequest, tools: list[dict[str, Any]] | None, *, preopened: bool = False
    ) -> DecodingConstraint | None:
        """The decoding constraint of ``req`` (None: unconstrained), checked against the workers.

        ``tool_choice`` required / named -> a DSML tool-call grammar (unless ``preopened``: the
        prompt opened the calls block instead). ``response_format`` json_schema / json_object
        -> the JSON answer enforced in every mode (thinking: reasoning free up to ``</think>``).
        Raises ``UnsupportedFeatureError`` (400) when the workers cannot enforce it, rather than
        returning prose the client cannot parse.
        """
        from deepseek_frontend.formats import continues_assistant
        from deepseek_frontend.parsing.constraints import (
            build_structured_output_constraint,
            build_tool_call_constraint,
        )

        # a continued assistant message is already past </think>: its output has no reasoning
        thinking = req.thinking and not continues_assistant(list(req.messages))
        constraint: DecodingConstraint | None = None
        what, param = "", ""
        if tools and req.tool_choice not in ("auto", "none") and not preopened:
            constraint = build_tool_call_constraint(self.family, tools, req.tool_choice, thinking=thinking)
            what, param = "tool_choice 'required' or a named tool", "tool_choice"
            if thinking and not self.backend.supports_constraint("ebnf"):
                raise UnsupportedFeatureError(
                    f"{what} in thinking mode needs constrained decoding (ebnf), which the "
                    f"{self.config.engine} engine workers of this server cannot enforce; disable thinking "
                    "to use DeepSeek's grammar-less fallback (the prompt opens the tool-call block)",
                    param=param,
                )
        rf = req.response_format
        if rf is not None and rf.get("type") in ("json_object", "json_schema"):
            if constraint is not None or preopened:
                raise RequestError(
                    "response_format cannot be combined with tool_choice 'required' or a named tool",
                    param="response_format",
                )
            schema = (rf.get("json_schema") or {}).get("schema") if rf["type"] == "json_schema" else None
            if rf["type"] == "json_schema" and not schema:
                schema = {}
            constraint = build_structured_output_constraint(
                schema, thinking=thinking, family=self.family, tools=tools
            )
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
        if req.seed is not None and not self._seed_warned:
            caps = self.capabilities()
            if caps is not None and not caps.honours_seed:
                # The seed is still sent (a worker restarted with deterministic inference honours
                # it); the operator learns once why equal seeds give different answers.
                self._seed_warned = True
                log.warning(
                    "requests carry `seed`, but the engine workers ignore it (SGLang: launch them "
                    "with --enable-deterministic-inference for reproducible sampling)"
                )
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
            # With ignore_eos EOS must not be a stop id either: vLLM stops on stop_token_ids
            # whatever ignore_eos says.
            stop_token_ids=() if req.ignore_eos else (self.eos_token_id,),
            constraint=constraint,
            logprobs=req.logprobs,
            top_logprobs=req.top_logprobs,
            ignore_eos=req.ignore_eos,
            min_new_tokens=min(req.min_tokens, max_new),
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
        "_stop",
        "_strip_eos",
        "_trace",
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
        #: the engine span (tracing on) and the trace context the worker gets
        self._trace, trace_headers = _tracing.engine_call(rid, index)
        self._engine: AsyncIterator[EngineChunk] | None = pipeline.backend.generate(
            GenerateRequest(
                request_id=rid,
                input_ids=prepared.input_ids,
                sampling=sampling,
                images=prepared.images,
                trace_headers=trace_headers,
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
        try:
            self._first = await anext(self._engine)
        except StopAsyncIteration:
            await self.aclose()
            raise EngineStreamError("the engine ended the stream without output") from None
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
        if chunk.finish_reason is not None or self._stop is not None or parser is None or self._drop_eos:
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


#: requests preparing on the event loop at once (see ``LoopTurns``): each step is short (long
#: prompts go to the offload threads), so a loop iteration runs at most a few milliseconds of
#: them, while a burst advances this many requests per iteration instead of one. Measured
#: (benchmarks/bench_serving.py, 1,024 streams starting at once, two processes): 24 starts them
#: twice as fast as 8 (first chunk p99 1.1-1.5 s against 2.4-2.5 s), and a 5,000-request burst
#: still leaves /live under its 100 ms p95 (tests/reliability/test_burst.py); 48 was a little
#: faster again (0.9-1.0 s) but failed that /live bound once in two runs
LOOP_TURN_SLOTS = 24
#: prompts with at least this many characters of text the prompt caches do not hold are tokenized
#: on the offload threads (cold tokenization runs at roughly 1-3 MB/s: 2 K characters cost about
#: 1 ms, which a thread hop is worth)
OFFLOAD_MIN_CHARS = 2048
#: requests with at least this many characters of text are rendered and looked up in the caches
#: on the offload threads as well (a warm 256 K-character prompt costs about 2 ms on the loop)
OFFLOAD_PREPARE_CHARS = 262_144


class _Draft:
    """A request rendered, its cached ids resolved, the rest of its tokenizing maybe still to do
    (:meth:`ChatPipeline._draft`); ``encode`` may run on an offload thread."""

    __slots__ = ("continues", "encoding", "images", "preopened", "request", "seconds", "tools")

    def __init__(
        self,
        request: ChatRequest,
        tools: list[dict[str, Any]] | None,
        continues: bool,
        preopened: Any,
        images: list[Any],
        encoding: PendingEncoding,
    ) -> None:
        self.request = request
        self.tools = tools
        self.continues = continues
        self.preopened = preopened
        self.images = images
        self.encoding = encoding
        #: seconds spent rendering, looking up and tokenizing (not waiting for a thread)
        self.seconds = 0.0

    def encode(self) -> None:
        started = time.perf_counter()
        self.encoding.encode()
        self.seconds += time.perf_counter() - started


#: message roles whose text every chat format renders in full (history reasoning may be dropped,
#: so assistant messages do not count toward the lower bound)
_KEPT_ROLES = frozenset({"system", "user", "developer"})


def _image_handoff(images: Sequence[Any]) -> tuple[tuple[str, ...], int]:
    """``(data URLs, extra tokens)`` of the image records a render reported, in prompt order.

    The prompt holds one placeholder id per image and the engine expands it (SGLang, vLLM): the
    extra tokens are ``tokens - 1`` per image, from the count the API layer's image resolver put
    on each record (``extra["tokens"]``, see ``images.py``). A record the resolver did not
    see is a bug in an adapter, not the client's fault: an internal error.
    """
    if not images:
        return (), 0
    urls: list[str] = []
    extra = 0
    for image in images:
        url = getattr(image, "url", None)
        tokens = getattr(image, "extra", {}).get("tokens")
        if not isinstance(url, str) or not isinstance(tokens, int):
            raise FrontendError("an image part reached the renderer without being resolved")
        urls.append(url)
        extra += tokens - 1
    return tuple(urls), extra


def request_chars(req: ChatRequest, *, kept_only: bool = False) -> int:
    """Characters of text in ``req``'s messages (and tool definitions), a cheap size measure.

    ``kept_only``: only the text the prompt certainly contains (system / user / developer
    ``content`` strings), for :meth:`ChatPipeline.check_length_lower_bound`.
    """
    total = 0
    for message in req.messages:
        if kept_only and message.get("role") not in _KEPT_ROLES:
            continue
        for key in ("content",) if kept_only else ("content", "reasoning_content"):
            value = message.get(key)
            if isinstance(value, str):
                total += len(value)
        if not kept_only:
            for call in message.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                arguments = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(arguments, str):
                    total += len(arguments)
    if not kept_only and req.tools:
        # a tool list is rarely large; its repr length is a good enough size at C speed
        total += len(repr(req.tools))
    return total


def _max_token_chars(tokenizer: Any) -> int | None:
    """Longest vocabulary entry in characters (byte-level entries: one character per byte), or None.

    Added tokens are left out: request text is tokenized with them unrecognised.
    """
    text = getattr(tokenizer, "text", None)
    get_vocab = getattr(text, "get_vocab", None)
    if get_vocab is None:
        return None
    try:
        vocab = get_vocab(with_added_tokens=False)
    except TypeError:
        return None
    return max(map(len, vocab), default=0) or None


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
