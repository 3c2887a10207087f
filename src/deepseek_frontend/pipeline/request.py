"""The pipeline's request and result records: what an API adapter builds and what it renders back.

:class:`ChatRequest` is a request in protocol-neutral form, :class:`PreparedRequest` the same
request ready for the engine, and each choice streams :class:`PipelineChunk` s (parser events,
logprobs) ending in a :class:`StreamEnd` with the choice's :class:`Usage`. Also here: the limits
every adapter checks (:data:`MAX_N`, :data:`MAX_TOP_LOGPROBS`) and :func:`request_chars`, the
cheap size measure the pipeline's offload and length decisions use.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from deepseek_frontend.generation import SamplingParams, TokenLogprob
from deepseek_frontend.parsing import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

FinishReason = Literal["stop", "length", "tool_calls"]
#: What the pipeline yields inside a chunk: the parsing events (``Finish`` is folded into ``StreamEnd``).
Event = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArgumentsDelta | ToolCallEnd

#: Largest n a request may ask for (each choice is a full engine request).
MAX_N = 16
#: Largest top_logprobs (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class Scheduling:
    """When a request runs, resolved once at the edge (``edge/priority.py``) and carried to its engine
    requests: its priority (higher first), the service tier its answer reports, and its deadline."""

    #: how important the request is, higher first (0: the default tier)
    priority: int = 0
    #: the OpenAI ``service_tier`` its answer reports: the tier its priority falls in
    service_tier: str = "default"
    #: the event loop's clock (``loop.time()``) at which its time budget runs out; None: no budget
    deadline: float | None = None
    #: that budget as the client gave it (``x-request-timeout-ms``), for the messages that name it
    budget_ms: int | None = None


#: a request nobody said anything about: the default priority, no deadline
DEFAULT_SCHEDULING = Scheduling()


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
    #: its priority, service tier and deadline (the edge's; the default for a request made in code)
    scheduling: Scheduling = DEFAULT_SCHEDULING

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
    #: a list, or for the in-process simulated engine the tokenizer's ``array("i")`` (never mutated)
    input_ids: Sequence[int]
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


#: message roles whose text every chat format renders in full (history reasoning may be dropped,
#: so assistant messages do not count toward the lower bound)
_KEPT_ROLES = frozenset({"system", "user", "developer"})


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
