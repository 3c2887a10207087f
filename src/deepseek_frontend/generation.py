"""What one generation is, as every layer sees it: the request sent to an engine worker, the
chunks that come back, a decoding constraint, and what a worker can serve.

These plain data types sit below every layer that uses them (parsing builds constraints,
routing reads requests and capabilities, engines send and receive them, the pipeline fills
them), so each of those layers imports them from here and none imports another for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

EngineFinishReason = Literal["stop", "length", "abort"]

#: The frontend's priority scale (higher is more important), which a request's priority is on from
#: the edge to the engine clients: a request nobody said anything about has :data:`DEFAULT_PRIORITY`,
#: a client or an API key may choose any integer from :data:`MIN_PRIORITY` to :data:`MAX_PRIORITY`,
#: and work that must yield to all of it (a batch line) runs at :data:`LOWEST_PRIORITY`.
DEFAULT_PRIORITY = 0
MIN_PRIORITY = -1_000_000
MAX_PRIORITY = 1_000_000
LOWEST_PRIORITY = -(1 << 31)
ConstraintKind = Literal["ebnf", "json_schema", "regex", "structural_tag"]


@dataclass(frozen=True, slots=True)
class DecodingConstraint:
    """A constrained-decoding request, passed to SGLang as the field named ``kind``."""

    kind: ConstraintKind
    value: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    constraint: DecodingConstraint | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    #: keep generating past EOS / stop ids until max_new_tokens (SGLang and vLLM ``ignore_eos``)
    ignore_eos: bool = False
    #: EOS / stop ids are not honoured before this many new tokens (SGLang ``min_new_tokens``,
    #: vLLM ``min_tokens``)
    min_new_tokens: int = 0


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    input_ids: list[int]
    sampling: SamplingParams
    #: the prompt's images as ``data:`` URLs, one per image placeholder id of ``input_ids``, in
    #: order. The worker expands each placeholder itself (SGLang ``image_data``, vLLM
    #: ``content_parts``); the frontend never pre-expands.
    images: tuple[str, ...] = ()
    #: top-level body fields the engine client adds as they are: the prefill/decode orchestrator's
    #: (SGLang ``bootstrap_host`` / ``bootstrap_port`` / ``bootstrap_room`` and DP rank hints, vLLM
    #: ``kv_transfer_params``; disagg/pool.py). None for an ordinary request.
    extra_fields: Mapping[str, Any] | None = None
    #: W3C trace context headers (``traceparent``, ``tracestate``) the engine client sends with the
    #: request, naming the frontend's engine span (or the client's own, passed through) as the
    #: worker's parent; None: none sent
    trace_headers: Mapping[str, str] | None = None
    #: how important the request is, higher first (the frontend's scale: 0 the default tier, a
    #: batch line the lowest); each engine client turns it into its worker's own field and sign
    #: when the worker schedules by priority (engines/sglang.py, engines/vllm.py). None: not stated
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class EngineChunk:
    """New output of one engine step (never cumulative: clients diff cumulative forms)."""

    token_ids: list[int]
    finish_reason: EngineFinishReason | None = None
    #: the stop token id or string the engine matched, when it reports one
    matched_stop: int | str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    logprobs: list[TokenLogprob] | None = None
    #: engine-side message for finish_reason == "abort"
    message: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerCapabilities:
    """What one worker can serve, learned at start-up (SGLang ``/server_info``, vLLM ``/v1/models``).

    The pipeline checks a request against these *before* sending it, so a request the worker
    cannot serve gets a 400 that says why instead of an engine error. ``None`` means "not
    reported": the frontend then falls back to its own configuration.
    """

    #: constraint kinds the worker enforces; empty when it runs without a grammar backend
    constraint_kinds: frozenset[ConstraintKind] = frozenset()
    #: the grammar backend's name as the worker reports it ("xgrammar", "llguidance", ...), or None
    grammar_backend: str | None = None
    #: the worker's context length (prompt + output tokens)
    context_length: int | None = None
    #: output slots the worker reserves on top of max_new_tokens (speculative decoding draft tokens)
    reserved_output_tokens: int = 0
    #: whether ``SamplingParams.seed`` takes effect (SGLang: ``--enable-deterministic-inference``)
    honours_seed: bool = True
    #: the worker's KV page size in tokens, when it reports one (routing cuts prompts into such blocks)
    page_size: int | None = None
    #: how the worker orders its waiting requests by a request's ``priority`` field: "high_first"
    #: (SGLang's default), "low_first" (vLLM's priority policy, SGLang with
    #: ``--schedule-low-priority-values-first``), or None (it does not schedule by priority, or did
    #: not say: the engine client decides whether to send the field at all)
    priority_order: Literal["high_first", "low_first"] | None = None
    #: anything else the worker reported that operators may want to see in ``/health``
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class WorkerStatus:
    url: str
    healthy: bool
    in_flight: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
