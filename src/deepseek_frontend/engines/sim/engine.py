"""The simulated engine: a deterministic, in-process :class:`EngineClient`.

A development and load-testing tool in the spirit of Dynamo's mocker -- not a model. It
decodes the prompt ids with the real tokenizer, writes a DeepSeek-V4-format answer by the
rules in :mod:`deepseek_frontend.engines.sim.model`, encodes it with the real tokenizer
(so ``</think>``, ``｜DSML｜`` and EOS are their real special ids) and streams the ids.

It honours what a real engine honours and nothing more: it reads only the prompt ids and
the sampling params -- ``max_new_tokens`` (finish ``length``), ``stop_token_ids`` and EOS
(finish ``stop`` with the matched id, which is included in the output like SGLang does),
``seed`` (rotates wording; the same seed reproduces), ``constraint`` (a ``json_schema``
makes the answer a JSON document valid against it -- after the reasoning in thinking mode,
as SGLang applies grammars with a reasoning parser; an ``ebnf`` tool-call grammar from
:mod:`deepseek_frontend.parsing.constraints` makes the output a sentence of it) and
:meth:`abort`. Timing (``ttft_ms``, ``itl_ms``, ``tokens_per_chunk``) and faults
(``fail_after`` output tokens) are configurable.

Cost per request: the output ids are planned once (and memoised per prompt, seed and
constraint); streaming is slicing a list. With zero delays each chunk still yields to the
event loop (``asyncio.sleep(0)``) so concurrent streams interleave.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# a module reference, not names: parsing.constraints imports engines.base, so either package may load first
import deepseek_frontend.parsing.constraints as _constraints
from deepseek_frontend.engines.base import (
    ConstraintKind,
    DecodingConstraint,
    EngineChunk,
    EngineClient,
    GenerateRequest,
    TokenLogprob,
)
from deepseek_frontend.engines.sim.model import (
    Piece,
    PromptView,
    dsml_block,
    plan_output,
    plan_tool_calls,
    read_prompt,
)
from deepseek_frontend.errors import EngineStreamError, EngineUnavailableError, RequestError

__all__ = ["PrefixCache", "SimStats", "SimTokenizer", "SimulatedEngine", "load_sim_tokenizer"]

#: tokens per KV page: cached_tokens is reported in whole pages, like a paged prefix cache
PAGE_SIZE = 16
#: prompts remembered by the simulated prefix cache (each costs one hash per page)
PREFIX_CACHE_PAGES = 65_536
#: planned outputs memoised per (prompt, seed, constraint)
PLAN_CACHE_SIZE = 512


class SimTokenizer(Protocol):
    """What the simulated engine needs of :class:`deepseek_frontend.tokenization.PromptTokenizer`."""

    eos_token_id: int

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...
    def encode_text(self, text: str) -> list[int]: ...
    def encode_raw(self, text: str) -> list[int]: ...


def load_sim_tokenizer(path: str | None = None) -> SimTokenizer:
    """The tokenizer a simulated engine uses: ``PromptTokenizer.load(path)`` (None = bundled DeepSeek-V4)."""
    from deepseek_frontend.tokenization import PromptTokenizer

    return PromptTokenizer.load(path)


class PrefixCache:
    """A bounded LRU of prompt page hashes; answers "how many leading tokens were seen before".

    Each prompt is cut into pages of ``page_size`` ids; page ``k`` is keyed by a hash chained
    over pages ``0..k``, so a lookup costs one hash per page and the longest cached prefix is
    the run of leading pages found. Hash collisions can only over-report a simulated figure.
    """

    def __init__(self, page_size: int = PAGE_SIZE, max_pages: int = PREFIX_CACHE_PAGES) -> None:
        self.page_size = page_size
        self.max_pages = max_pages
        self._pages: OrderedDict[int, None] = OrderedDict()

    def lookup_and_insert(self, ids: Sequence[int]) -> int:
        """Cached prefix length of ``ids`` in tokens (whole pages, < len(ids)); then remember ``ids``."""
        size = self.page_size
        chain = 0
        cached = 0
        missed = False
        # the last token is always computed (an engine needs its logits), so stop one short
        for end in range(size, len(ids), size):
            chain = hash((chain, tuple(ids[end - size : end])))
            if not missed and chain in self._pages:
                cached = end
                self._pages.move_to_end(chain)
            else:
                missed = True
                self._pages[chain] = None
        while len(self._pages) > self.max_pages:
            self._pages.popitem(last=False)
        return cached


@dataclass(slots=True)
class SimStats:
    """Counters the sim server exposes (``GET /sim/stats``) so tests can see aborts."""

    started: int = 0
    finished: int = 0
    aborted: int = 0
    failed: int = 0
    running: int = 0
    aborted_ids: deque[str] = field(default_factory=lambda: deque(maxlen=1000))

    def as_dict(self) -> dict[str, object]:
        return {
            "started": self.started,
            "finished": self.finished,
            "aborted": self.aborted,
            "failed": self.failed,
            "running": self.running,
            "aborted_ids": list(self.aborted_ids),
        }


class SimulatedEngine(EngineClient):
    """A deterministic in-process engine over the real tokenizer (see module docstring).

    ``fail_after``: every request fails after this many output tokens (0 = before the first
    token, which raises :class:`EngineUnavailableError`; later failures raise
    :class:`EngineStreamError`). ``seed`` is used when a request carries none.
    """

    def __init__(
        self,
        tokenizer: SimTokenizer,
        *,
        ttft_ms: float = 0.0,
        itl_ms: float = 0.0,
        tokens_per_chunk: int = 1,
        fail_after: int | None = None,
        seed: int = 0,
        page_size: int = PAGE_SIZE,
        name: str = "sim",
    ) -> None:
        if tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be >= 1")
        self.name = name
        self.tokenizer = tokenizer
        self.ttft_s = ttft_ms / 1000.0
        self.itl_s = itl_ms / 1000.0
        self.tokens_per_chunk = tokens_per_chunk
        self.fail_after = fail_after
        self.seed = seed
        self.stats = SimStats()
        self.prefix_cache = PrefixCache(page_size)
        self._plans: OrderedDict[tuple[object, ...], list[int]] = OrderedDict()
        self._running: set[str] = set()
        self._abort_requested: set[str] = set()
        self._failed: set[str] = set()

    def __repr__(self) -> str:
        ttft, itl = self.ttft_s * 1000, self.itl_s * 1000
        return f"SimulatedEngine(name={self.name!r}, ttft_ms={ttft:g}, itl_ms={itl:g})"

    # ------------------------------------------------------------------ planning

    def plan_ids(
        self, input_ids: Sequence[int], seed: int, constraint: DecodingConstraint | None
    ) -> list[int]:
        """The full output (ending with EOS) the model writes for this prompt; memoised."""
        # keyed by a 64-bit hash, not the ids: 512 long prompts would otherwise pin ~100 MB
        key = (len(input_ids), hash(tuple(input_ids)), seed, constraint)
        cached = self._plans.get(key)
        if cached is not None:
            self._plans.move_to_end(key)
            return cached
        view = read_prompt(self.tokenizer.decode(list(input_ids), skip_special_tokens=False))
        pieces = self._plan_pieces(view, seed, constraint)
        ids: list[int] = []
        for piece in pieces:
            ids.extend(
                self.tokenizer.encode_raw(piece.text)
                if piece.markup
                else self.tokenizer.encode_text(piece.text)
            )
        ids.append(self.tokenizer.eos_token_id)
        self._plans[key] = ids
        if len(self._plans) > PLAN_CACHE_SIZE:
            self._plans.popitem(last=False)
        return ids

    def _plan_pieces(self, view: PromptView, seed: int, constraint: DecodingConstraint | None) -> list[Piece]:
        if constraint is None:
            return plan_output(view, seed=seed)
        if constraint.kind == "json_schema":
            try:
                schema = json.loads(constraint.value)
            except ValueError as exc:
                raise RequestError(f"json_schema is not valid JSON: {exc}", param="json_schema") from exc
            return plan_output(view, seed=seed, json_schema=schema if isinstance(schema, dict) else {})
        if constraint.kind == "ebnf":
            return self._plan_for_grammar(view, seed, constraint.value)
        raise RequestError(
            f"the simulated engine cannot enforce a {constraint.kind} constraint", param=constraint.kind
        )

    def _plan_for_grammar(self, view: PromptView, seed: int, grammar: str) -> list[Piece]:
        """An output the grammar accepts: the natural plan, a call to each declared tool, or a derived one.

        Like constrained decoding, the grammar only filters; the "model" still prefers what it
        would have written, then the first tool the grammar allows.
        """
        candidates = [plan_output(view, seed=seed)]
        prefix = []
        if view.thinking:
            prefix = [
                Piece(f"The user wrote something that needs a tool. {_CALL_NOTE}"),
                Piece("</think>", True),
            ]
        for name, _ in view.tools:
            block = dsml_block(view.block_name, plan_tool_calls(view, [name], seed))
            candidates.append([*prefix, Piece(block, markup=True)])
        for pieces in candidates:
            if _constraints.ebnf_accepts(grammar, "".join(p.text for p in pieces)):
                return pieces
        return [Piece(_constraints.ebnf_example(grammar), markup=True)]

    # ------------------------------------------------------------------ EngineClient

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        sampling = request.sampling
        seed = sampling.seed if sampling.seed is not None else self.seed
        planned = self.plan_ids(request.input_ids, seed, sampling.constraint)
        ids, finish, matched = _cut(planned, sampling.max_new_tokens, sampling.stop_token_ids, self.tokenizer)
        prompt_tokens = len(request.input_ids)
        cached = self.prefix_cache.lookup_and_insert(request.input_ids)
        rid = request.request_id
        self.stats.started += 1
        self.stats.running += 1
        self._running.add(rid)
        done = False
        emitted = 0
        try:
            await asyncio.sleep(self.ttft_s)
            step = self.tokens_per_chunk
            total = len(ids)
            while True:
                if rid in self._abort_requested:
                    done = True
                    self._count_abort(rid)
                    yield EngineChunk(
                        [],
                        "abort",
                        prompt_tokens=prompt_tokens,
                        completion_tokens=emitted,
                        cached_tokens=cached,
                        message="aborted by request",
                    )
                    return
                end = min(emitted + step, total)
                if self.fail_after is not None and end > self.fail_after:
                    end = self.fail_after
                    if end <= emitted:
                        self.stats.failed += 1
                        done = True
                        if emitted == 0:
                            raise EngineUnavailableError(f"simulated failure before the first token ({rid})")
                        raise EngineStreamError(f"simulated failure after {emitted} tokens ({rid})")
                last = end >= total
                chunk = EngineChunk(
                    ids[emitted:end],
                    finish if last else None,
                    matched if last else None,
                    prompt_tokens,
                    end,
                    cached,
                )
                if sampling.logprobs:
                    chunk.logprobs = [
                        TokenLogprob(t, -0.5, ((t, -0.5),) * min(sampling.top_logprobs, 1))
                        for t in chunk.token_ids
                    ]
                emitted = end
                if last:
                    done = True
                    self.stats.finished += 1
                yield chunk
                if last:
                    return
                await asyncio.sleep(self.itl_s)
        finally:
            self._running.discard(rid)
            self._abort_requested.discard(rid)
            self.stats.running -= 1
            if rid in self._failed:
                self._failed.discard(rid)
            elif not done:
                # closed early (client disconnect, cancellation): the engine drops the request
                self._count_abort(rid)

    def _count_abort(self, rid: str) -> None:
        self.stats.aborted += 1
        self.stats.aborted_ids.append(rid)

    def supports_constraint(self, kind: ConstraintKind) -> bool:
        return kind in ("ebnf", "json_schema")

    def mark_failed(self, request_id: str) -> None:
        """Count a running request as failed, not aborted, when a sim-server fault closes it."""
        if request_id in self._running:
            self._failed.add(request_id)
            self.stats.failed += 1

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._abort_requested.add(request_id)

    async def check_health(self) -> bool:
        return self.fail_after != 0


_CALL_NOTE = "I should call a tool."


def _cut(
    planned: list[int], max_new: int, stop_ids: Sequence[int], tokenizer: SimTokenizer
) -> tuple[list[int], str, int | None]:
    """Apply stop ids (EOS included) and ``max_new_tokens`` to the planned output."""
    stops = set(stop_ids)
    stops.add(tokenizer.eos_token_id)
    limit = min(len(planned), max(max_new, 0))
    for i in range(limit):
        if planned[i] in stops:
            return planned[: i + 1], "stop", planned[i]
    if limit < len(planned):
        return planned[:limit], "length", None
    return planned, "stop", None
