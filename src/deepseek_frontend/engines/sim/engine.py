"""The simulated engine: a deterministic, in-process :class:`Engine` (and :class:`EngineClient`).

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
constraint) on the engine's planning thread: a plan can be long (a "write 100000 words"
answer, a schema's value checked against its grammar, a new conversation's prompt decoded
whole) and a real engine's model never runs on the frontend's loop either; the model's values
are bounded too (engines/sim/model.py, "Arguments"). A plan memoised already, or cheap to write
(a short answer to a prompt whose reading decodes a few thousand ids: an agent's follow-up), is
written in the request's own step instead, where it costs less than the two thread hops.
Streaming is slicing a list: each chunk after the first yields to the event loop
(``asyncio.sleep(0)``) so concurrent streams interleave. A long prompt is read once per shared
prefix when the server hands over its :class:`~deepseek_frontend.engines.sim.prompts.SimPrompt`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import json
import random
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from deepseek_frontend.engines.base import Engine, EngineClient
from deepseek_frontend.engines.config import SimConfig
from deepseek_frontend.engines.sim.behavior import PRESETS, SIM_CONSTRAINT_KINDS, SimBehavior
from deepseek_frontend.engines.sim.clock import StepClock
from deepseek_frontend.engines.sim.kv import SimKvCache
from deepseek_frontend.engines.sim.model import (
    NO_HEAD,
    USER_TURN,
    Piece,
    PromptHead,
    PromptView,
    answer_is_short,
    answer_reads_head,
    extend_head,
    plan_for_grammar,
    plan_output,
    read_head,
    read_last_turn,
    read_prompt,
)
from deepseek_frontend.engines.sim.prompts import (
    ID_WIDTH,
    INPUT_IDS_ERROR,
    SimPrompt,
    count_id,
    last_index,
    positions_from_end,
    prompt_bytes,
)
from deepseek_frontend.engines.sim.resume import split_continuation
from deepseek_frontend.engines.sim.scheduler import SchedulerSettings, SimScheduler, Ticket
from deepseek_frontend.engines.sim.turn_memo import HeadTexts, PageChains
from deepseek_frontend.errors import (
    EngineRejectedRequestError,
    EngineStreamError,
    EngineUnavailableError,
    RequestError,
)
from deepseek_frontend.generation import (
    ConstraintKind,
    DecodingConstraint,
    EngineChunk,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
    WorkerCapabilities,
    WorkerStatus,
    engine_rid,
)

__all__ = [
    "INPUT_IDS_ERROR",
    "PrefixCache",
    "SimStats",
    "SimTokenizer",
    "SimulatedEngine",
    "load_sim_tokenizer",
    "prompt_bytes",
]

#: tokens per KV page: cached_tokens is reported in whole pages, like a paged prefix cache. SGLang
#: serves DeepSeek-V4 with 256-token pages (its ``page_size``; the page the kv_events descriptor's
#: ``block_size`` and the sim's KV model, engines/sim/kv.py, use too)
PAGE_SIZE = 256
#: pages the simulated prefix cache remembers (about a million tokens), least recently used first out
PREFIX_CACHE_PAGES = 4_096
#: the behaviour of an engine given none: refuses nothing, honours seeds
_IDEAL = PRESETS["ideal"]
#: the image placeholder id (``<｜deepseek_image｜>``), as SGLang's and vLLM's V4.1 configs name it
IMAGE_TOKEN_ID = 129264
#: planned outputs memoised per (prompt, seed, constraint)
PLAN_CACHE_SIZE = 512
#: prompt heads (the text before the last user turn) whose reading is memoised: a conversation's
#: previous head must still be here at its next request, to read only what follows it (256 agent
#: streams on one process read 256 other heads in between; a head read on from another shares its
#: tool schemas' objects)
HEAD_CACHE_SIZE = 1024
#: a plan is written in the request's own step on the event loop, not on the planning thread, when
#: reading its prompt decodes at most this many ids -- its last user turn, and its head past where
#: the conversation's previous request left off (``HeadTexts``) ...
INLINE_PLAN_DECODE_IDS = 8192
#: ... and the prompt has at most this many ids (a new head's text is still scanned whole for tools)
INLINE_PLAN_PROMPT_IDS = 65_536
#: uncached tokens per prefill chunk: SGLang's default on an H100/H200-class GPU (4096 below 60 GB,
#: 16384 from 160 GB; memory_hook.py)
DEFAULT_CHUNKED_PREFILL_SIZE = 8192


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

    def lookup_and_insert(self, ids: Sequence[int], prompt: SimPrompt | None = None) -> int:
        """Cached prefix length of ``ids`` in tokens (whole pages, < len(ids)); then remember ``ids``.

        ``prompt``: the :class:`SimPrompt` of ``ids`` when the caller has read it; its known page
        hashes are reused (only the pages after them are hashed) and it gets this prompt's own.
        """
        size = self.page_size
        if prompt is None:
            prompt = SimPrompt.of(ids)
        data, width = prompt.data, ID_WIDTH
        if data is None:
            data, width = array("q", ids).tobytes(), 8
        pages = self._pages
        step = size * width
        # the last token is always computed (an engine needs its logits), so stop one short;
        # pages hashed as bytes: a slice and a hash in C per page, not a tuple of ints
        chains: list[int] = []
        if width == ID_WIDTH:
            chains = prompt.chains[: min(prompt.chained_ids // size, (len(ids) - 1) // size)]
        chain = chains[-1] if chains else 0
        for at in range(len(chains) * step, ((len(ids) - 1) // size) * step, step):
            chain = hash((chain, data[at : at + step]))
            chains.append(chain)
        prompt.chains, prompt.chained_ids = chains, len(ids)
        # A prompt's pages go in last page first, so each page is more recently used than every
        # page after it: the LRU end only ever drops pages no cached page follows, and the
        # cached pages always form whole prefixes -- so the cached run of leading pages is found
        # by bisection (10 lookups for a 12K-token prompt, not 750).
        cached = bisect.bisect_left(chains, True, key=lambda chain: chain not in pages)
        for chain in reversed(chains[cached:]):
            pages[chain] = None
        # the cached run touched in C (a deque of length 0 drains the map without a Python loop)
        deque(map(pages.move_to_end, reversed(chains[:cached])), maxlen=0)
        while len(pages) > self.max_pages:
            pages.popitem(last=False)
        return cached * size


@dataclass(slots=True)
class SimStats:
    """Counters the sim server exposes (``GET /sim/stats``) so tests can see aborts."""

    started: int = 0
    finished: int = 0
    aborted: int = 0
    failed: int = 0
    running: int = 0
    aborted_ids: deque[str] = field(default_factory=lambda: deque(maxlen=1000))
    #: prefill chunks run (of at most ``chunked_prefill_size`` uncached tokens each)
    prefill_chunks: int = 0
    #: of those, the chunks that ran while other streams were decoding (each held their steps)
    prefill_chunks_holding_decode: int = 0
    #: total time decode steps were held by prefill chunks, in seconds
    decode_held_s: float = 0.0
    #: requests waiting for a place in the running batch (engines/sim/scheduler.py)
    waiting: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "started": self.started,
            "finished": self.finished,
            "aborted": self.aborted,
            "failed": self.failed,
            "running": self.running,
            "aborted_ids": list(self.aborted_ids),
            "prefill_chunks": self.prefill_chunks,
            "prefill_chunks_holding_decode": self.prefill_chunks_holding_decode,
            "decode_held_ms": round(self.decode_held_s * 1000, 3),
            "waiting": self.waiting,
        }


class SimulatedEngine(EngineClient, Engine):
    """A deterministic in-process engine over the real tokenizer (see module docstring).

    It serves a model by itself (an :class:`Engine`: ``serve --engine sim``) or as one worker of a
    pool or of the ``sim-engine`` server (an :class:`EngineClient`).

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
        max_tokens_per_chunk: int | None = None,
        fail_after: int | None = None,
        seed: int = 0,
        page_size: int = PAGE_SIZE,
        name: str = "sim",
        behavior: SimBehavior | None = None,
        kv: SimKvCache | None = None,
        kvs: Sequence[SimKvCache] = (),
        chunked_prefill_size: int = DEFAULT_CHUNKED_PREFILL_SIZE,
        enable_mixed_chunk: bool = False,
        scheduling: SchedulerSettings | None = None,
    ) -> None:
        if tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be >= 1")
        if max_tokens_per_chunk is not None and max_tokens_per_chunk < tokens_per_chunk:
            raise ValueError("max_tokens_per_chunk must be >= tokens_per_chunk")
        self.name = name
        self.tokenizer = tokenizer
        self.ttft_s = ttft_ms / 1000.0
        self.itl_s = itl_ms / 1000.0
        self.tokens_per_chunk = tokens_per_chunk
        #: with a maximum above ``tokens_per_chunk``, each chunk carries a number of tokens drawn
        #: from that range (as speculative decoding -- MTP, EAGLE -- accepts a varying number per
        #: step); the draws are seeded by the request id, so a request replays the same chunking
        self.max_tokens_per_chunk = max_tokens_per_chunk or tokens_per_chunk
        self.fail_after = fail_after
        self.seed = seed
        #: what a real engine would refuse (None: the kind default, see engines/sim/behavior.py)
        self.behavior = behavior
        self.stats = SimStats()
        self.prefix_cache = PrefixCache(page_size)
        #: the KV cache models, one per data-parallel rank (engines/sim/kv.py): cached_tokens, prefill
        #: time and KV events come from them when set, else from the unbounded-time ``prefix_cache``
        self.kvs: list[SimKvCache] = list(kvs) or ([kv] if kv is not None else [])
        #: rank 0's cache model (the only one without data parallelism)
        self.kv = self.kvs[0] if self.kvs else None
        self._plans: OrderedDict[tuple[object, ...], list[int]] = OrderedDict()
        #: the one thread plans are written on (one at a time: the memo tables are shared)
        self._planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-plan")
        #: memoised readings of prompt heads, by (length in ids, hash of their ids)
        self._heads: OrderedDict[tuple[int, int], PromptHead] = OrderedDict()
        #: the text of prompt heads, and the prefix cache's page hashes, by conversation (turn_memo.py)
        self._head_texts = HeadTexts()
        self._page_chains = PageChains(page_size)
        self._special_ids: dict[str, int | None] = {}
        self._filler: list[int] | None = None
        #: the decode-step clock every running stream of this engine waits on between chunks (None
        #: at zero delay: each chunk only yields to the loop)
        self._clock = StepClock(self.itl_s) if self.itl_s > 0 else None
        #: uncached prompt tokens per prefill chunk (<= 0: one chunk per prompt, SGLang's -1)
        self.chunked_prefill_size = chunked_prefill_size
        #: one decode step rides on each prefill chunk (SGLang's --enable-mixed-chunk)
        self.enable_mixed_chunk = enable_mixed_chunk
        #: streams past their prefill, writing output (what a prefill chunk holds up)
        self._decoding = 0
        #: the loop time the forward in progress (a prefill chunk) ends (:meth:`after_forward`)
        self._forward_end = 0.0
        self._capabilities: tuple[SimBehavior, WorkerCapabilities] | None = None
        #: the running batch and waiting queue (engines/sim/scheduler.py); None: every request runs
        #: at once and priorities are ignored
        self.scheduler = SimScheduler(scheduling) if scheduling is not None else None
        self._running: set[str] = set()
        self._abort_requested: set[str] = set()
        #: what a stream closed before its finish aborts, by prefix: this engine's streams
        #: (:meth:`abort_rid`); the sim server adds a PD role's legs
        self.on_close_abort: Callable[[str], object] = self.abort_rid
        self._failed: set[str] = set()

    @classmethod
    def from_config(cls, config: SimConfig, tokenizer: SimTokenizer) -> SimulatedEngine:
        """The engine ``serve --engine sim`` runs: ``config``'s timing and behaviour preset."""
        return cls(
            tokenizer,
            ttft_ms=config.ttft_ms,
            itl_ms=config.itl_ms,
            tokens_per_chunk=config.tokens_per_chunk,
            behavior=PRESETS[config.behave] if config.behave != "ideal" else None,
        )

    def __repr__(self) -> str:
        ttft, itl = self.ttft_s * 1000, self.itl_s * 1000
        return f"SimulatedEngine(name={self.name!r}, ttft_ms={ttft:g}, itl_ms={itl:g})"

    # ------------------------------------------------------------------ planning

    def plan_ids(
        self,
        input_ids: Sequence[int],
        seed: int,
        constraint: DecodingConstraint | None,
        images: tuple[tuple[int, int, str], ...] = (),
        data: bytes | None = None,
        view: PromptView | None = None,
    ) -> list[int]:
        """The full output (ending with EOS) the model writes for this prompt (and the sizes of its
        images); memoised. ``data``: the prompt's :func:`prompt_bytes`, and ``view`` its reading
        (:meth:`_read`), when the caller has them."""
        if data is None:
            data = prompt_bytes(input_ids)
        key = self._plan_key(input_ids, seed, constraint, images, data)
        cached = self._plans.get(key)
        if cached is not None:
            _touch(self._plans, key)
            return cached
        if view is None:
            view = self._read(input_ids, data, whole=constraint is not None)
        if images:
            view = dataclasses.replace(view, images=images)
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

    def _plan_key(
        self,
        input_ids: Sequence[int],
        seed: int,
        constraint: DecodingConstraint | None,
        images: tuple[tuple[int, int, str], ...],
        data: bytes | None,
    ) -> tuple[object, ...]:
        # keyed by a 64-bit hash, not the ids: 512 long prompts would otherwise pin ~100 MB
        digest = hash(data) if data is not None else hash(tuple(input_ids))
        return (len(input_ids), digest, seed, constraint, images)

    def _memoised(self, request: GenerateRequest, prompt: SimPrompt, seed: int) -> bool:
        """Whether ``request``'s plan is memoised already (then it is read on the loop: no thread
        hop, and the first chunk comes in the request's own step). A request with images or
        continuing an earlier plan is planned on the thread."""
        if request.images:
            return False
        key = self._plan_key(request.input_ids, seed, request.sampling.constraint, (), prompt.data)
        return key in self._plans

    def _cheap_plan_view(self, request: GenerateRequest, prompt: SimPrompt) -> PromptView | None:
        """The prompt's reading for its plan (:meth:`_read`) when ``request``'s plan costs little
        enough to write in its own step on the loop, else None: a plain prompt -- no images, no
        constraint, not continuing an answer already begun (engines/sim/resume.py) -- whose reading
        (done here when the rest holds) decodes few ids (:data:`INLINE_PLAN_DECODE_IDS`), answered in
        a few words (:func:`~deepseek_frontend.engines.sim.model.answer_is_short`). An agent's
        follow-up with a tool result is one (its last turn decoded: about a quarter of a
        millisecond); a new conversation's first turn, decoded whole, is not."""
        ids, data = request.input_ids, prompt.data
        if request.images or request.sampling.constraint is not None or data is None:
            return None
        if len(ids) > INLINE_PLAN_PROMPT_IDS:
            return None
        user_id, assistant_id = self._special_id(USER_TURN), self._assistant_id()
        if user_id is None or assistant_id is None or last_index(data, assistant_id) < len(ids) - 2:
            return None  # no answer opened at the end: a continuation, or a prompt of another shape
        users = positions_from_end(data, user_id)
        last = next(users, -1)
        if last < 0 or len(ids) - last > INLINE_PLAN_DECODE_IDS:
            return None
        turn = self._decode_with_specials(ids[last + 1 :])
        if USER_TURN in turn:
            return None  # read whole (_read): on the thread
        if not answer_reads_head(turn):
            view = read_last_turn(NO_HEAD, turn)
        else:
            key = (last, hash(data[: last * ID_WIDTH]))
            if key not in self._heads:
                known = self._head_texts.longest(data, users)
                if known is None or last - known > INLINE_PLAN_DECODE_IDS:
                    return None
            view = self._read_with_head(ids, data, last, turn, key)
        return view if answer_is_short(view) else None

    def _last_turn(self, input_ids: Sequence[int], data: bytes | None) -> tuple[int, str] | None:
        """``(index, text)`` of the prompt's last user turn (the text after its ``<｜User｜>``); None
        when it has none, or when the turn spells that opener as text (a prompt injection the
        frontend kept as text: the text reading finds that spelling last, and so must this one)."""
        user_id = self._special_id(USER_TURN)
        if data is None or user_id is None:
            return None
        last = last_index(data, user_id)
        if last < 0:
            return None
        turn = self._decode_with_specials(input_ids[last + 1 :])
        return None if USER_TURN in turn else (last, turn)

    def _read(self, input_ids: Sequence[int], data: bytes | None, *, whole: bool = True) -> PromptView:
        """What the model sees of the prompt: :func:`read_prompt` of its text.

        An agent resends its conversation every turn, so the text before the last user turn
        (the system prompt, the tools, the history: nearly all of a long prompt) is read once
        per distinct head and memoised; only the last turn is decoded anew (a follow-up of a
        12K-token conversation: 0.1 ms, not the 1 ms of decoding it all). A new head is decoded
        from where the conversation's previous request left off (:class:`HeadTexts`: a 28K-token
        agent follow-up's head, 0.2 ms instead of 1.35).

        ``whole=False`` (for an unconstrained plan): when the answer does not depend on that head
        (:func:`~deepseek_frontend.engines.sim.model.answer_reads_head`: an agent's follow-up that
        brings tool results), the head is not read at all and the view holds
        :data:`~deepseek_frontend.engines.sim.model.NO_HEAD` in its place, which plans the same
        answer -- the ids a conversation added since its previous request, with that request's
        tool results, are then not decoded: most of what reading a follow-up cost.
        """
        found = self._last_turn(input_ids, data)
        if found is None:
            return read_prompt(self._decode_with_specials(input_ids))
        last, turn = found
        if not whole and not answer_reads_head(turn):
            return read_last_turn(NO_HEAD, turn)
        return self._read_with_head(input_ids, data, last, turn)  # type: ignore[arg-type]

    def _read_with_head(
        self, input_ids: Sequence[int], data: bytes, last: int, turn: str, key: tuple[int, int] | None = None
    ) -> PromptView:
        """:meth:`_read` of a prompt whose last user turn is at ``last``, its text ``turn``: the head
        before it from the memos, under ``key`` (its memo key, when the caller has hashed it)."""
        if key is None:
            key = (last, hash(data[: last * ID_WIDTH]))
        heads = self._heads
        head = heads.get(key)
        if head is None:
            earlier = positions_from_end(data, self._special_id(USER_TURN))  # type: ignore[arg-type]
            next(earlier)  # ``last`` itself: the user turns before it follow, newest first
            text, extended = self._head_texts.text(input_ids, data, last, earlier, self._decode_with_specials)
            # the head it extends, read before (the conversation's previous request's; the memos
            # share their keys): only the text after it is searched for tool schemas
            previous = heads.get(extended) if extended is not None else None
            head = heads[key] = read_head(text) if previous is None else extend_head(previous, text)
            if len(heads) > HEAD_CACHE_SIZE:
                heads.popitem(last=False)
        else:
            _touch(heads, key)
        return read_last_turn(head, turn)

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
        return plan_for_grammar(view, seed, grammar)

    def _plan_or_resume(
        self,
        input_ids: Sequence[int],
        seed: int,
        constraint: DecodingConstraint | None,
        data: bytes | None = None,
        view: PromptView | None = None,
    ) -> list[int]:
        """The output still to write: the rest of the engine's own plan when ``input_ids`` continue
        it (a migrated request, see engines/sim/resume.py), else the plan for ``input_ids``
        (``view``: their reading, when the caller has it)."""
        if constraint is None:
            assistant_id = self._assistant_id()
            last = None
            if data is not None and assistant_id is not None:
                last = last_index(data, assistant_id)  # a search in C, not a reversed copy
            resumed = split_continuation(
                input_ids, assistant_id, lambda ids: self.plan_ids(ids, seed, None), last
            )
            if resumed is not None:
                written, full = resumed
                return full[written:]
        return self.plan_ids(input_ids, seed, constraint, data=data, view=view)

    def _filler_ids(self) -> list[int]:
        """The ids of the filler text an answer is padded with (:func:`_pad_past_stops`), encoded once."""
        if self._filler is None:
            self._filler = self.tokenizer.encode_text(_FILLER_TEXT)
        return self._filler

    def _assistant_id(self) -> int | None:
        return self._special_id("<｜Assistant｜>")

    def _decode_with_specials(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _cached_prefix(self, input_ids: Sequence[int], prompt: SimPrompt) -> int:
        """The prefix cache's answer for the prompt (:meth:`PrefixCache.lookup_and_insert`), the page
        hashes before its last but one user turn taken from the conversation's previous request
        (:class:`PageChains`: 0.7 ms of hashing for a 29K-token agent follow-up otherwise)."""
        user_id = self._special_id(USER_TURN)
        last = -1
        if prompt.data is not None and user_id is not None:
            users = positions_from_end(prompt.data, user_id)
            last = next(users, -1)
            self._page_chains.seed(prompt, users)
        cached = self.prefix_cache.lookup_and_insert(input_ids, prompt=prompt)
        self._page_chains.remember_head(prompt, last)
        return cached

    def _special_id(self, spelling: str) -> int | None:
        """The id of a special token's spelling (None when the vocabulary has no such single token)."""
        found = self._special_ids.get(spelling, False)
        if found is False:
            ids = self.tokenizer.encode_raw(spelling)
            found = self._special_ids[spelling] = ids[0] if len(ids) == 1 else None
        return found  # type: ignore[return-value]

    # ------------------------------------------------------------------ EngineClient

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        """Stream the planned output of ``request`` (see :class:`EngineClient`), run under
        :func:`~deepseek_frontend.generation.engine_rid` of its id as an engine client sends it."""
        return self.run(dataclasses.replace(request, request_id=engine_rid(request.request_id)))

    async def run(
        self,
        request: GenerateRequest,
        prompt: SimPrompt | None = None,
        *,
        transferred_cached: int | None = None,
        transferred_plan: Sequence[int] | None = None,
        dp_rank: int | None = None,
    ) -> AsyncIterator[EngineChunk]:
        """Stream the planned output of ``request``, whose ``request_id`` is the rid the worker runs
        it under (the ``rid`` of a ``/generate`` body: the sim server calls this).

        A rid already running is refused as SGLang's tokenizer manager refuses it ("Duplicate
        request ID detected", HTTP 400; ``managers/tokenizer_manager.py``). A stream closed before
        its finish is an abort, and SGLang's is by prefix (:meth:`abort_rid`): every other running
        rid that starts with this one is aborted too (``on_close_abort``).

        ``dp_rank``: the data-parallel rank that serves it (its cache model; rank 0 when None).

        ``prompt``: the request's ids as :class:`RecentPrompts` read them from a body (their packed
        bytes and known page hashes); read here when not given. ``transferred_cached``: the prompt's
        KV came from a prefill worker (a decode role, engines/sim/disagg.py): nothing is prefilled
        here, the first chunk is ready at once, and ``cached_tokens`` is the prefill's figure;
        ``transferred_plan``: the output the prefill worker's model state leads to
        (:meth:`plan_request` there), written instead of planning it again here.
        """
        sampling = request.sampling
        behavior = self.behavior
        request_seed = sampling.seed
        if behavior is not None:
            refusal = behavior.refusal(len(request.input_ids), sampling)
            if refusal is not None:
                # in process, the refusal SGLang streams (abort chunk / error event) is its meaning
                raise EngineRejectedRequestError(
                    f"the engine rejected the request: {refusal.message}", status_code=refusal.status_code
                )
            request_seed = behavior.effective_seed(request_seed)
        seed = request_seed if request_seed is not None else self.seed
        if prompt is None or prompt.ids is not request.input_ids:
            prompt = SimPrompt.of(request.input_ids)
        here = transferred_plan is not None or self._memoised(request, prompt, seed)
        view = None if here else self._cheap_plan_view(request, prompt)
        if here or view is not None:
            # in this step: the two thread hops would cost more than the plan (19-26 ms at 256 agent
            # streams, against about 1.4 ms of planning a follow-up here)
            planned, image_tokens = self._planned(request, prompt, seed, transferred_plan, view)
        else:
            # off the loop: /live and every other stream keep their turns while a plan is written
            loop = asyncio.get_running_loop()
            planned, image_tokens = await loop.run_in_executor(
                self._planner, self._planned, request, prompt, seed, None
            )
        min_new = sampling.max_new_tokens if sampling.ignore_eos else sampling.min_new_tokens
        if min_new:
            planned = _pad_past_stops(planned, min_new, sampling, self.tokenizer, self._filler_ids())
        ids, finish, matched = _cut(
            planned, sampling.max_new_tokens, sampling.stop_token_ids, self.tokenizer, sampling.ignore_eos
        )
        # as SGLang reports it: every image placeholder expanded to the image's tokens
        prompt_tokens = len(request.input_ids) + image_tokens
        cached = 0
        kv = self.kvs[dp_rank] if dp_rank is not None and 0 <= dp_rank < len(self.kvs) else self.kv
        if transferred_cached is not None:
            cached = transferred_cached
        elif kv is None:
            cached = self._cached_prefix(request.input_ids, prompt)
        rid = request.request_id
        if rid in self._running:  # checked and held in one step (nothing awaited in between)
            raise EngineRejectedRequestError(
                f"the engine rejected the request: Duplicate request ID detected: {rid}", status_code=400
            )
        scheduler = self.scheduler
        # a priority the worker refuses is refused before the request starts (QueueAbortError)
        ticket = scheduler.ticket(rid, request.priority) if scheduler is not None else None
        self.stats.started += 1
        self.stats.running += 1
        self._running.add(rid)
        done = False
        emitted = 0
        decoding = False
        try:
            if ticket is not None and not await self._admit(ticket):
                done = True
                self._count_abort(rid)
                yield _aborted(prompt_tokens, 0, cached)
                return
            if transferred_cached is not None:
                pass
            elif kv is not None:
                cached = await kv.prefill(request.input_ids, self.ttft_s, self._occupy)
            elif self.ttft_s:
                await asyncio.sleep(self.ttft_s)
            decoding = True
            self._decoding += 1
            if ticket is not None:
                ticket.decoding = True  # in the running batch SGLang's preemption walks
            # (no delay: the first chunk is ready in this step, not one loop iteration later, where
            # it would wait behind every request that arrived in the same iteration)
            step = self.tokens_per_chunk
            sizes = random.Random(zlib.crc32(rid.encode())) if self.max_tokens_per_chunk > step else None
            total = len(ids)
            clock = self._clock
            #: decode steps this stream's next chunk covers (more than one when its consumer fell behind)
            owed = 1
            # bound once: on every step below only its time is read (no running-loop look-up)
            time_now = clock.bind().time if clock is not None else None
            #: the clock's step count when this stream's last chunk was written
            mark = clock.steps_at(time_now()) if clock is not None and time_now is not None else 0
            while True:
                if rid in self._abort_requested:
                    done = True
                    self._count_abort(rid)
                    yield _aborted(prompt_tokens, emitted, cached)
                    return
                if ticket is not None and ticket.preempted:
                    # preempted (engines/sim/scheduler.py): no tokens until it is scheduled again,
                    # then its prompt and what it wrote so far are prefilled again
                    decoding = False
                    self._decoding -= 1
                    if not await self._admit(ticket):
                        done = True
                        self._count_abort(rid)
                        yield _aborted(prompt_tokens, emitted, cached)
                        return
                    await self._prefill_again([*request.input_ids, *ids[:emitted]])
                    decoding = True
                    self._decoding += 1
                    ticket.decoding = True
                    owed = 1
                    mark = clock.steps() if clock is not None else 0
                grow = step * owed
                if sizes is not None:
                    grow = sum(sizes.randint(step, self.max_tokens_per_chunk) for _ in range(owed))
                end = min(emitted + grow, total)
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
                    if kv is not None:
                        kv.finished([*request.input_ids, *ids], len(request.input_ids))
                    # written out: no longer held up by prefills (a prefill leg waits here for its
                    # decode worker with nothing left to write)
                    decoding = False
                    self._decoding -= 1
                yield chunk
                if last:
                    return
                if clock is not None and time_now is not None:
                    # A real engine decodes on its own clock whether or not the frontend has read the
                    # last chunk: the steps that passed while this stream's consumer was busy are
                    # ready now, as one chunk (a worker's socket would hold them as several events,
                    # which the HTTP clients merge the same way), and the next comes at the next step.
                    owed = clock.steps_at(time_now()) - mark
                    if owed < 1:
                        await clock.wait()
                        owed = max(1, clock.steps_at(time_now()) - mark)
                    mark += owed
                else:
                    await asyncio.sleep(0)
        finally:
            if decoding:
                self._decoding -= 1
            if ticket is not None:
                scheduler.release(ticket)  # type: ignore[union-attr]
            self._running.discard(rid)
            self._abort_requested.discard(rid)
            self.stats.running -= 1
            if not self.stats.running:
                for cache in self.kvs:  # an idle scheduler flushes its KV events
                    cache.flush()
            if rid in self._failed:
                self._failed.discard(rid)
            elif not done:
                # closed early (client disconnect, cancellation): the engine drops the request, and
                # SGLang's abort of it matches by prefix (tokenizer_manager.py
                # _release_req_states_on_failure -> abort_request -> Scheduler.abort_request)
                self._count_abort(rid)
                self.on_close_abort(rid)

    async def _admit(self, ticket: Ticket) -> bool:
        """Wait for the request's place in the running batch (False: ``/abort_request`` removed it
        from the queue first); the wait is counted in ``stats.waiting``."""
        assert self.scheduler is not None
        self.stats.waiting += 1
        try:
            return await self.scheduler.admit(ticket)
        finally:
            self.stats.waiting -= 1

    async def _prefill_again(self, ids: list[int]) -> None:
        """A preempted request's prefill when it runs again: its KV was released (what the prefix
        cache still holds is not computed again)."""
        if self.kv is not None:
            await self.kv.prefill(ids, self.ttft_s, self._occupy)
        elif self.ttft_s:
            await asyncio.sleep(self.ttft_s)

    async def _occupy(self, tokens: int, seconds_per_token: float) -> None:
        """Run a prefill of ``tokens`` uncached tokens, chunk by chunk, on this worker.

        Each chunk takes ``chunk x seconds_per_token``, and while streams are decoding it holds
        their decode steps (a prefill batch runs instead of a decode step). The chunks follow one
        another with no decode step between them, as SGLang schedules a waiting prefill first, so
        the whole prefill is one hold that begins once the decode step in progress is done --
        unless ``enable_mixed_chunk``, where each chunk carries one decode step.
        """
        size = self.chunked_prefill_size if self.chunked_prefill_size > 0 else max(tokens, 1)
        clock, stats = self._clock, self.stats
        loop = asyncio.get_running_loop()
        chunks = [min(size, tokens - start) * seconds_per_token for start in range(0, tokens, size)]
        stats.prefill_chunks += len(chunks)
        if clock is None or not self._decoding:
            for seconds in chunks:  # one forward each: a poll between forwards waits for its end
                self._forward_end = loop.time() + seconds
                await asyncio.sleep(seconds)
            return
        stats.prefill_chunks_holding_decode += len(chunks)
        stats.decode_held_s += sum(chunks)
        if not self.enable_mixed_chunk:
            wait = clock.hold(sum(chunks)) + sum(chunks)
            self._forward_end = loop.time() + wait
            await asyncio.sleep(wait)
            return
        for seconds in chunks:
            clock.hold(seconds, carries_step=True)
            self._forward_end = loop.time() + seconds
            await asyncio.sleep(seconds)

    async def after_forward(self) -> None:
        """Return once the forward in progress (a prefill chunk) is done, at once when none runs: when
        a scheduler that polls between forwards gets to look (SGLang's PD prefill answers a request
        whose KV was sent there, ``disaggregation/prefill.py`` ``process_disagg_prefill_inflight_queue``,
        run after each forward by ``event_loop_normal_disagg_prefill``)."""
        left = self._forward_end - asyncio.get_running_loop().time()
        if left > 0:
            await asyncio.sleep(left)

    def plan_request(self, request: GenerateRequest, prompt: SimPrompt | None = None) -> list[int]:
        """The whole output :meth:`generate` would write for ``request`` before its length limits
        and stops are applied (memoised: the stream that follows does not plan it again)."""
        seed = request.sampling.seed
        if self.behavior is not None:
            seed = self.behavior.effective_seed(seed)
        if prompt is None or prompt.ids is not request.input_ids:
            prompt = SimPrompt.of(request.input_ids)
        return self._planned(request, prompt, seed if seed is not None else self.seed)[0]

    def _planned(
        self,
        request: GenerateRequest,
        prompt: SimPrompt,
        seed: int,
        given: Sequence[int] | None = None,
        view: PromptView | None = None,
    ) -> tuple[list[int], int]:
        """``(planned output, extra prompt tokens of its images)``; ``given``: a plan received with
        the prompt's KV, used as it is; ``view``: the prompt's reading, when the caller has it."""
        data = prompt.data
        sizes, image_tokens = self._read_images(request, data)
        constraint = request.sampling.constraint
        if given is not None:
            return list(given), image_tokens
        if sizes:
            return self.plan_ids(request.input_ids, seed, constraint, sizes, data), image_tokens
        return self._plan_or_resume(request.input_ids, seed, constraint, data, view), image_tokens

    def _read_images(
        self, request: GenerateRequest, data: bytes | None
    ) -> tuple[tuple[tuple[int, int, str], ...], int]:
        """``(sizes and colours, extra prompt tokens)`` of the request's images, checked like SGLang does.

        One image per placeholder id (129264, ``<｜deepseek_image｜>``) of ``input_ids``, in order,
        each a decodable image (``data:`` URL or base64): anything else is refused like SGLang
        refuses it (HTTP 400), with a message saying what does not match.
        """
        ids = request.input_ids
        placeholders = count_id(data, IMAGE_TOKEN_ID) if data is not None else ids.count(IMAGE_TOKEN_ID)
        if not request.images and not placeholders:
            return (), 0
        if placeholders != len(request.images):
            raise EngineRejectedRequestError(
                f"the engine rejected the request: the prompt has {placeholders} image placeholder "
                f"tokens but {len(request.images)} images were sent in image_data",
                status_code=400,
            )
        from deepseek_frontend.images import decode_base64, decode_data_url, read_image_header

        sizes: list[tuple[int, int, str]] = []
        extra = 0
        for i, item in enumerate(request.images):
            where = f"image_data[{i}]"
            try:
                is_url = item[:5].lower() == "data:"
                data = decode_data_url(item, where)[1] if is_url else decode_base64(item, where)
                header = read_image_header(data, where)
            except RequestError as exc:
                raise EngineRejectedRequestError(
                    f"the engine rejected the request: {exc.message}", status_code=400
                ) from None
            sizes.append((header.width, header.height, _colour_name(data)))
            extra += header.tokens - 1
        return tuple(sizes), extra

    def _count_abort(self, rid: str) -> None:
        self.stats.aborted += 1
        self.stats.aborted_ids.append(rid)

    def supports_constraint(self, kind: ConstraintKind) -> bool:
        if self.behavior is not None:
            return kind in self.behavior.constraint_kinds()
        return kind in SIM_CONSTRAINT_KINDS

    async def discover(self) -> WorkerCapabilities | None:
        """What this engine serves (:meth:`capabilities`)."""
        return self.capabilities()

    def capabilities(self) -> WorkerCapabilities:
        """What the pipeline checks requests against (see ``WorkerPool.capabilities``): the
        behaviour's, or the kind default's (no context limit, no reservation, seeds honoured)."""
        behavior = self.behavior or _IDEAL
        cached = self._capabilities
        if cached is None or cached[0] is not behavior:  # asked several times per request
            cached = self._capabilities = (behavior, behavior.capabilities())
        return cached[1]

    def mark_failed(self, request_id: str) -> None:
        """Count a running request as failed, not aborted, when a sim-server fault closes it."""
        if request_id in self._running:
            self._failed.add(request_id)
            self.stats.failed += 1

    def is_running(self, rid: str) -> bool:
        """Whether a stream runs under ``rid`` now."""
        return rid in self._running

    def abort_rid(self, rid: str) -> int:
        """SGLang's scheduler abort (``managers/scheduler.py`` ``Scheduler.abort_request``): every
        running rid that *starts with* ``rid`` ends at its next step with finish ``abort``; how many."""
        hit = [r for r in self._running if r.startswith(rid)]
        self._abort_requested.update(hit)
        if self.scheduler is not None:
            for r in hit:
                self.scheduler.abort(r)  # still waiting: it leaves the queue at once
        return len(hit)

    def abort_all(self) -> int:
        """``AbortReq(abort_all=True)``: every running stream."""
        self._abort_requested.update(self._running)
        return len(self._running)

    async def abort(self, request_id: str) -> None:
        """``/abort_request`` for ``request_id`` as an engine client sends it: its rid
        (:func:`~deepseek_frontend.generation.engine_rid`), forwarded only while that exact rid runs
        (SGLang's tokenizer manager with one tokenizer worker), then matched by prefix."""
        rid = engine_rid(request_id)
        if rid in self._running:
            self.abort_rid(rid)

    async def check_health(self) -> bool:
        return self.fail_after != 0

    def statuses(self) -> list[WorkerStatus]:
        """Itself as the one worker: always healthy, its running requests in flight."""
        return [WorkerStatus(url=self.name, healthy=True, in_flight=self.stats.running)]

    async def start(self) -> None:
        """Nothing runs in the background."""

    async def aclose(self) -> None:
        """Nothing to release."""


def _aborted(prompt_tokens: int, emitted: int, cached: int) -> EngineChunk:
    """The finish chunk of a request aborted by ``/abort_request``."""
    return EngineChunk(
        [],
        "abort",
        prompt_tokens=prompt_tokens,
        completion_tokens=emitted,
        cached_tokens=cached,
        message="aborted by request",
    )


#: what the simulated model "keeps writing" once it is not allowed to stop (ignore_eos, min_new_tokens)
_FILLER_TEXT = " More text."


def _colour_name(data: bytes) -> str:
    """The average colour of an image as a word (red, blue, gray...): what the simulated model "sees".

    Decodes the pixels (the frontend never does; the engine does anyway), so a judgement check can ask a
    real model and this simulator the same question about a solid-colour image.
    """
    import colorsys
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img.draft("RGB", (64, 64))  # JPEG: decode at a reduced scale
        r, g, b = (c / 255 for c in img.convert("RGB").resize((1, 1)).getpixel((0, 0)))  # type: ignore[union-attr]
    hue, lightness, saturation = colorsys.rgb_to_hls(r, g, b)
    if saturation < 0.2 or lightness < 0.08 or lightness > 0.95:
        return "black" if lightness < 0.2 else "white" if lightness > 0.85 else "gray"
    names = ((15, "red"), (45, "orange"), (70, "yellow"), (160, "green"), (195, "cyan"), (255, "blue"))
    degrees = hue * 360
    for limit, name in names:
        if degrees < limit:
            return name
    return "purple" if degrees < 330 else "red"


def _touch(table: OrderedDict[object, object], key: object) -> None:
    """Mark ``key`` recently used; the planning thread and the loop (``plan_request``) share the
    memo tables, so the other may have evicted it meanwhile."""
    with contextlib.suppress(KeyError):
        table.move_to_end(key)


def _pad_past_stops(
    planned: list[int], min_new: int, sampling: SamplingParams, tokenizer: SimTokenizer, filler: list[int]
) -> list[int]:
    """The planned output as an engine that may not stop before ``min_new`` tokens writes it.

    A real engine masks EOS and the stop ids until ``min_new_tokens`` (``ignore_eos``: EOS for
    the whole request), so the model writes on: here those ids are left out of the first
    ``min_new`` tokens and filler text follows the answer up to ``min_new`` (capped at
    ``max_new_tokens``). Stops after that point still end the request as usual. ``filler``: the
    ids of :data:`_FILLER_TEXT`.
    """
    stops = set(sampling.stop_token_ids)
    stops.add(tokenizer.eos_token_id)
    out = [t for i, t in enumerate(planned) if i >= min_new or t not in stops]
    target = min(min_new, sampling.max_new_tokens)
    if len(out) < target:
        while len(out) < target:
            out.extend(filler)
        if not sampling.ignore_eos:
            out.append(tokenizer.eos_token_id)  # after the minimum the model may stop again
    return out


def _cut(
    planned: list[int],
    max_new: int,
    stop_ids: Sequence[int],
    tokenizer: SimTokenizer,
    ignore_eos: bool = False,
) -> tuple[list[int], str, int | None]:
    """Apply stop ids (EOS included unless ``ignore_eos``) and ``max_new_tokens`` to the planned output."""
    stops = set(stop_ids)
    if not ignore_eos:
        stops.add(tokenizer.eos_token_id)
    limit = min(len(planned), max(max_new, 0))
    for i in range(limit):
        if planned[i] in stops:
            return planned[: i + 1], "stop", planned[i]
    if limit < len(planned):
        return planned[:limit], "length", None
    return planned, "stop", None
