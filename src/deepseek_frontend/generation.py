"""What one generation is, as every layer sees it: the request sent to an engine worker, the
chunks that come back, a decoding constraint, and what a worker can serve.

These plain data types sit below every layer that uses them (parsing builds constraints,
routing reads requests and capabilities, engines send and receive them, the pipeline fills
them), so each of those layers imports them from here and none imports another for them.

Request ids: a request's id (``GenerateRequest.request_id``: what logs and ``x-request-id`` show,
with a leg tag per kind of leg, :func:`leg_id`) is never sent to a worker as it is. The worker gets
:func:`engine_rid`: the id, escaped, then :data:`RID_END`, a character no escaped id contains.
SGLang aborts every live request whose rid *starts with* the aborted one (``/abort_request``, and a
client closing an unfinished stream: ``managers/scheduler.py`` ``Scheduler.abort_request``,
``req.rid.startswith(recv_req.rid)``), so no two live rids on a worker may be prefixes of one
another -- ``X-1`` and ``X-10`` were. With the terminator none is: a rid ends at its only
``RID_END``, so one that starts with another's whole rid, terminator included, is that rid.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

EngineFinishReason = Literal["stop", "length", "abort"]

#: The frontend's priority scale (higher is more important), which a request's priority is on from
#: the edge to the engine clients: a request nobody said anything about has :data:`DEFAULT_PRIORITY`,
#: a client or an API key may choose any integer from :data:`MIN_PRIORITY` to :data:`MAX_PRIORITY`,
#: and work that must yield to all of it (a batch line) runs at :data:`LOWEST_PRIORITY`.
DEFAULT_PRIORITY = 0
MIN_PRIORITY = -1_000_000
MAX_PRIORITY = 1_000_000
LOWEST_PRIORITY = -(1 << 31)

#: ends every engine request id (:func:`engine_rid`); escaped inside the id
RID_END = "~"
#: joins a request id and the tag of one of its legs (:func:`leg_id`)
LEG_SEPARATOR = "."


def leg_id(request_id: str, tag: str) -> str:
    """The id of one leg of ``request_id``: a choice (``c3``), a continuation after a migration
    (``m1``), a prefill/decode pair retried (``pd1``). Legs of legs nest (``X.c3.m1.pd1``)."""
    return f"{request_id}{LEG_SEPARATOR}{tag}"


def engine_rid(request_id: str) -> str:
    """The rid a worker runs ``request_id`` under: the id with ``%`` and :data:`RID_END` escaped,
    then :data:`RID_END`. Distinct ids give distinct rids, and no rid is a prefix of another (see
    the module docstring); the bare request id is never itself a rid."""
    if "%" in request_id or RID_END in request_id:
        request_id = request_id.replace("%", "%25").replace(RID_END, "%7E")
    return request_id + RID_END


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


def id_list(ids: Sequence[int]) -> list[int]:
    """``ids`` as a list (itself when it is one): what a worker's JSON body carries."""
    return ids if isinstance(ids, list) else list(ids)


#: bytes per id of the tokenizer's id array (:func:`is_id_array`)
ID_ARRAY_ITEMSIZE = 4


def is_id_array(ids: Sequence[int]) -> TypeGuard[array[int]]:
    """Whether ``ids`` is an ``array("i")`` of 4-byte ints (the tokenizer's id array), whose
    ``tobytes()`` are the ids as machine ints, read without a conversion per id."""
    return isinstance(ids, array) and ids.typecode == "i" and ids.itemsize == ID_ARRAY_ITEMSIZE


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    #: the prompt's ids: a list, or (from the pipeline, for the in-process simulated engine) the
    #: tokenizer's ``array("i")``, whose bytes that engine reads as they are; never mutated. An
    #: engine that sends them as JSON takes :func:`id_list`.
    input_ids: Sequence[int]
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
