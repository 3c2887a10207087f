"""The router: which worker -- and which data-parallel rank of it -- serves a request
(``serve --router-mode``).

Modes:

* ``round-robin`` -- rotate over the admitted workers.
* ``least-outstanding`` -- fewest requests in flight, ties rotated (the pool's historical default).
* ``session`` -- soft affinity: a session (see :mod:`deepseek_frontend.routing.session`) sticks
  to the worker that served it, unless that worker has more than ``session_slack`` requests in
  flight above the least-loaded one; then it moves (and sticks there).
* ``kv`` -- KV-cache aware, fed by the workers' KV events
  (:mod:`deepseek_frontend.routing.subscriber`) *and* by the router's own decisions until events
  confirm or remove them, so it never knows less than ``kv-approx``.
* ``kv-approx`` -- KV-cache aware, fed by the router's own decisions (a prompt routed to a
  worker is assumed cached there for ``approx_ttl_s``).

**Targets.** A worker with several data-parallel ranks (SGLang ``--attn-dp-size N``, or ``--dp-size
N`` replicas; :mod:`deepseek_frontend.routing.discovery`) keeps one radix cache and one scheduler
per rank, so the kv modes score every ``(worker, rank)``: the index, the SWA model and the load
are per rank, and the chosen rank goes out as SGLang's ``routed_dp_rank``
(:attr:`RouteTicket.rank`; the prefill/decode orchestrator reads it with :meth:`Router.rank_for`).
The other modes leave the rank to SGLang's own DP balancing.

KV cost of sending a prompt of ``B`` blocks to target ``t`` (lower is better)::

    cost(t) = prefill_weight * (B - overlap(t) + queued_prefill_blocks(t))
            + decode_weight  * active_blocks(t)

``overlap(t)``: leading blocks of the prompt that ``t`` caches -- stored (events) or predicted
(own decisions) -- capped where a DeepSeek-V4 worker's sliding-window cache is not live
(:mod:`deepseek_frontend.routing.swa`); 0 on a worker that keeps no cache (a PD decode worker);
``queued_prefill_blocks(t)``: uncached blocks of requests routed to ``t`` that have not produced
their first token yet (prefill is the engine's serial bottleneck); ``active_blocks(t)``: blocks
of every request in flight on ``t`` (decode load). Where the worker publishes its per-rank load
(:mod:`deepseek_frontend.routing.load`), the larger of the router's own count and the engine's
(``num_waiting_uncached_tokens``, ``num_tokens``; the engine's includes other frontends'
requests) is used. With ``temperature`` 0 the cheapest target wins, except that a request with a
session stays on the session's previous target while it costs at most ``session_tolerance x B``
more; remaining ties go to the worker with fewer requests in flight, then the rank with fewer,
then rotate. A positive temperature samples from ``softmax(-cost / (temperature * B))``.

The pool asks :meth:`Router.choose` among the workers it would admit and reports each request's
start (:meth:`begin`), first token and end through the returned :class:`RouteTicket`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from deepseek_frontend.generation import GenerateRequest, WorkerCapabilities
from deepseek_frontend.routing.discovery import EventSource, WorkerPlan, plan_worker
from deepseek_frontend.routing.hashing import PrefixHashCache
from deepseek_frontend.routing.index import STORED_BLOCK_BYTES, KvIndex, SourceKey
from deepseek_frontend.routing.session import current_session
from deepseek_frontend.routing.swa import SwaLive

__all__ = ["ROUTER_MODES", "RouteTicket", "Router", "RouterConfig", "RouterMode", "WorkerView"]

logger = logging.getLogger(__name__)

RouterMode = Literal["kv", "kv-approx", "session", "least-outstanding", "round-robin"]
ROUTER_MODES: tuple[str, ...] = ("kv", "kv-approx", "session", "least-outstanding", "round-robin")

#: KV page size when neither the option nor the workers say (SGLang's DeepSeek-V4 page size)
DEFAULT_PAGE_SIZE = 256
#: sessions remembered for affinity
MAX_SESSIONS = 100_000
#: decisions kept between choose() and begin() (a prefill/decode pair begins its legs later)
MAX_PENDING_DECISIONS = 4096
#: memory the KV-event index may use per worker, all its ranks together
DEFAULT_INDEX_BYTES_PER_WORKER = 256 << 20


class WorkerView(Protocol):
    """What the router reads of a pool worker."""

    url: str
    in_flight: int


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Router settings (the ``serve`` flags of the same names)."""

    mode: RouterMode = "least-outstanding"
    #: tokens per KV block; None = the workers' reported block/page size, else DEFAULT_PAGE_SIZE
    page_size: int | None = None
    prefill_weight: float = 1.0
    decode_weight: float = 0.3
    temperature: float = 0.0
    #: requests in flight a session's worker may have above the least-loaded one before it moves
    session_slack: int = 2
    #: kv modes: a session stays on its previous target while that target's cost is within this
    #: fraction of the prompt's blocks of the cheapest (moving duplicates its cache elsewhere)
    session_tolerance: float = 0.25
    #: kv modes: seconds a routed prompt is assumed cached without events, and blocks remembered
    approx_ttl_s: float = 300.0
    approx_max_blocks: int = 1 << 18
    #: kv: event endpoints given by option, by ``worker URL[#first rank]`` (``endpoint`` or
    #: ``endpoint;replay``); other workers are read from their ``/server_info``
    kv_event_endpoints: Mapping[str, str] = field(default_factory=dict)
    #: kv: bytes the KV-event index may hold per worker (its ranks share it)
    index_bytes_per_worker: int = DEFAULT_INDEX_BYTES_PER_WORKER


@dataclass(slots=True)
class _Load:
    in_flight: int = 0
    queued_prefill_blocks: int = 0
    active_blocks: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    predicted_cached_tokens: int = 0
    requests: int = 0


@dataclass(slots=True)
class _Worker:
    plan: WorkerPlan
    loads: list[_Load]
    subscribers: list[Any] = field(default_factory=list)
    load_subscribers: list[Any] = field(default_factory=list)
    endpoints: tuple[str, ...] = ()
    warned: bool = False


@dataclass(slots=True)
class _Decision:
    url: str
    rank: int
    hashes: list[int]
    overlap: int


@dataclass(slots=True)
class RouteTicket:
    """One request's stay on one worker rank: the pool calls :meth:`first_token` and :meth:`end`.

    ``rank``: the data-parallel rank to send as ``routed_dp_rank`` (None: let the worker place it).
    """

    router: Router
    url: str
    blocks: int
    prefill_blocks: int
    prompt_tokens: int
    predicted_cached_tokens: int
    rank: int | None = None
    load: _Load | None = None
    _prefilling: bool = True
    _ended: bool = False

    def first_token(self, cached_tokens: int | None = None) -> None:
        """The worker produced its first token (prefill is over); ``cached_tokens``: what it reported."""
        if self._prefilling:
            self._prefilling = False
            load = self.load
            if load is not None:
                load.queued_prefill_blocks -= self.prefill_blocks
                if cached_tokens is not None:
                    load.cached_tokens += min(cached_tokens, self.prompt_tokens)

    def end(self) -> None:
        """The request left the worker (finished, failed or cancelled)."""
        if self._ended:
            return
        self.first_token()
        self._ended = True
        load = self.load
        if load is not None:
            load.in_flight -= 1
            load.active_blocks -= self.blocks


class _Sink:
    """What the KV event subscribers apply events to: the index, and the SWA pages they reveal live."""

    def __init__(self, index: KvIndex, swa: SwaLive) -> None:
        self.index, self.swa = index, swa

    def stored(
        self,
        source: SourceKey,
        engine_hashes: Sequence[Hashable],
        parent_engine_hash: Hashable | None,
        token_ids: Sequence[int],
        block_size: int,
    ) -> None:
        ours = self.index.stored(source, engine_hashes, parent_engine_hash, token_ids, block_size)
        if ours and self.swa.gated(source):
            # a stored run ends at a prompt's end after its prefill or a finished sequence's live tail
            self.swa.mark(source, ours[-self.swa.window_pages(source) :])

    def removed(self, source: SourceKey, engine_hashes: Iterable[Hashable]) -> None:
        self.swa.forget(source, self.index.removed(source, engine_hashes))

    def clear(self, source: SourceKey) -> None:
        self.index.clear(source)
        self.swa.clear(source)


class Router:
    """Chooses workers and ranks (see module docstring). ``clock`` is injectable for tests."""

    def __init__(self, config: RouterConfig | None = None, *, clock: Callable[[], float] = time.monotonic):
        self.config = config or RouterConfig()
        self.mode = self.config.mode
        if self.mode not in ROUTER_MODES:
            raise ValueError(f"unknown router mode {self.mode!r} (expected one of {', '.join(ROUTER_MODES)})")
        self._clock = clock
        self._rr = 0
        self._target_rr = 0
        self._rng = random.Random(0)
        self._workers: dict[str, _Worker] = {}
        self._sessions: OrderedDict[str, tuple[str, int | None]] = OrderedDict()
        self.index = KvIndex(ttl_s=self.config.approx_ttl_s, max_blocks=self.config.approx_max_blocks)
        self._page_size = self.config.page_size
        self.swa = SwaLive(self.page_size)
        self._sink = _Sink(self.index, self.swa)
        self._pending: dict[str, WorkerCapabilities | None] = {}
        self._hasher: PrefixHashCache | None = None
        self._decided: OrderedDict[str, _Decision] = OrderedDict()
        #: subscribers of a worker that restarted with other endpoints, being closed
        self._closing: set[asyncio.Task[None]] = set()
        #: routing decisions by reason, migrations, and the time spent choosing (for metrics)
        self.decisions: Counter[str] = Counter()
        self.migrations = 0
        self.migration_failures = 0
        self.choose_seconds = 0.0
        self.choose_count = 0

    def __repr__(self) -> str:
        return f"Router(mode={self.mode!r}, workers={sorted(self._workers)!r})"

    @property
    def kv_aware(self) -> bool:
        return self.mode in ("kv", "kv-approx")

    @property
    def page_size(self) -> int:
        return self._page_size or DEFAULT_PAGE_SIZE

    def ranks(self, url: str) -> int:
        """Data-parallel ranks of worker ``url`` as last discovered (1 when unknown)."""
        worker = self._workers.get(url)
        return worker.plan.ranks if worker is not None else 1

    # ------------------------------------------------------------------ workers

    def _worker(self, url: str) -> _Worker:
        worker = self._workers.get(url)
        if worker is None:
            worker = self._workers[url] = _Worker(WorkerPlan(), [_Load()])
        return worker

    def worker_added(self, url: str, capabilities: WorkerCapabilities | None = None) -> None:
        """A worker joined, or told us what it is: its ranks, caches and (``kv``) event endpoints."""
        worker = self._worker(url)
        try:
            plan = plan_worker(url, capabilities, self.config.kv_event_endpoints)
        except (ValueError, TypeError) as exc:
            logger.warning("cannot read the KV event settings of %s: %s", url, exc)
            plan = WorkerPlan(ranks=worker.plan.ranks)
        worker.plan = plan
        worker.loads.extend(_Load() for _ in range(plan.ranks - len(worker.loads)))
        page = plan.block_size or (capabilities.page_size if capabilities is not None else None)
        if page and self.config.page_size is None:
            if self._page_size is None:
                self._page_size = page
                self._hasher = None
                self.swa.page_size = page
            elif self._page_size != page:
                logger.warning(
                    "worker %s has KV block size %d, others %d: routing uses %d",
                    url,
                    page,
                    self._page_size,
                    self._page_size,
                )
        per_rank = max(1, self.config.index_bytes_per_worker // STORED_BLOCK_BYTES // plan.ranks)
        for rank in range(plan.ranks):
            self.index.set_max_stored((url, rank), per_rank)
            self.swa.configure((url, rank), plan.swa if self.kv_aware and plan.caches else None)
        if self.kv_aware:
            self._subscribe(url, worker, capabilities)

    def _subscribe(self, url: str, worker: _Worker, capabilities: WorkerCapabilities | None) -> None:
        plan = worker.plan
        sources: list[EventSource] = list(plan.kv_sources) if self.mode == "kv" else []
        loads = list(plan.load_sources)
        endpoints = tuple(s.endpoint for s in (*sources, *loads))
        if (
            self.mode == "kv"
            and not sources
            and capabilities is not None
            and plan.caches
            and not worker.warned
        ):
            worker.warned = True
            logger.warning(
                "worker %s publishes no KV events (start it with --kv-events-config or pass "
                "--kv-events-endpoint); kv routing sees only its own decisions there",
                url,
            )
        if endpoints == worker.endpoints:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._pending[url] = capabilities  # no event loop yet: start() subscribes
            return
        self._pending.pop(url, None)
        old = [*worker.subscribers, *worker.load_subscribers]
        if old:  # the worker restarted with other endpoints
            task = loop.create_task(_close_all(old))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        from deepseek_frontend.routing.load import LoadSubscriber
        from deepseek_frontend.routing.subscriber import KvEventSubscriber

        worker.subscribers = [KvEventSubscriber(self._sink, s) for s in sources]
        worker.load_subscribers = [LoadSubscriber(s) for s in loads]
        worker.endpoints = endpoints
        for sub in (*worker.subscribers, *worker.load_subscribers):
            sub.start()

    async def worker_removed(self, url: str) -> None:
        """A worker left the pool: forget its blocks and stop following its events."""
        worker = self._workers.pop(url, None)
        self.index.drop_worker(url)
        self.swa.drop_worker(url)
        if worker is not None:
            await _close_all([*worker.subscribers, *worker.load_subscribers])

    def worker_failed(self, url: str) -> None:
        """A worker was ejected (died): its cache cannot be trusted any more."""
        for rank in range(self.ranks(url)):
            self._sink.clear((url, rank))

    async def start(self) -> None:
        """Subscribe to the workers added before the event loop ran."""
        pending, self._pending = self._pending, {}
        for url, capabilities in pending.items():
            worker = self._workers.get(url)
            if worker is not None:
                self._subscribe(url, worker, capabilities)

    def subscribers(self) -> dict[str, list[Any]]:
        """KV event subscribers by worker URL (one per rank)."""
        return {url: list(w.subscribers) for url, w in self._workers.items() if w.subscribers}

    async def aclose(self) -> None:
        for worker in self._workers.values():
            await _close_all([*worker.subscribers, *worker.load_subscribers])
            worker.subscribers, worker.load_subscribers, worker.endpoints = [], [], ()

    # ------------------------------------------------------------------ choosing

    def choose(self, candidates: Sequence[WorkerView], request: GenerateRequest) -> WorkerView:
        """The worker among ``candidates`` (non-empty) that should serve ``request`` (its rank, in
        kv modes, is remembered for :meth:`begin` and :meth:`rank_for`)."""
        started = time.perf_counter()
        try:
            return self._choose(candidates, request)
        finally:
            self.choose_seconds += time.perf_counter() - started
            self.choose_count += 1

    def _choose(self, candidates: Sequence[WorkerView], request: GenerateRequest) -> WorkerView:
        if len(candidates) == 1:
            # no rotation step: a leg pinned to its worker (PD pairs) must not skew the rotation
            chosen, reason = candidates[0], "single-candidate"
            if self.kv_aware:
                self._by_cost(candidates, request)  # the rank, and the ticket's prediction
        else:
            self._rr += 1
            if self.mode == "round-robin":
                chosen, reason = candidates[self._rr % len(candidates)], "round-robin"
            elif self.mode == "least-outstanding":
                chosen, reason = self._least_outstanding(candidates), "least-outstanding"
            elif self.mode == "session":
                chosen, reason = self._by_session(candidates)
            else:
                chosen, reason = self._by_cost(candidates, request)
        self.decisions[reason] += 1
        return chosen

    def _least_outstanding(self, candidates: Sequence[WorkerView]) -> WorkerView:
        low = min(w.in_flight for w in candidates)
        best = [w for w in candidates if w.in_flight == low]
        return best[self._rr % len(best)]

    def _by_session(self, candidates: Sequence[WorkerView]) -> tuple[WorkerView, str]:
        session = current_session()
        if session is None:
            return self._least_outstanding(candidates), "least-outstanding"
        previous = self._sessions.get(session)
        low = min(w.in_flight for w in candidates)
        for w in candidates:
            if previous is not None and w.url == previous[0]:
                if w.in_flight <= low + self.config.session_slack:
                    self._sessions.move_to_end(session)
                    return w, "session"
                break
        chosen = self._least_outstanding(candidates)
        self._stick(session, (chosen.url, None))
        return chosen, "session-new" if previous is None else "session-moved"

    def _stick(self, session: str, target: tuple[str, int | None]) -> None:
        self._sessions[session] = target
        self._sessions.move_to_end(session)
        if len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)

    def _hashes(self, request: GenerateRequest) -> list[int]:
        if self._hasher is None:
            self._hasher = PrefixHashCache(self.page_size)
        return self._hasher.hashes(request.input_ids)

    def _overlap(self, key: SourceKey, hashes: list[int], now: float) -> int:
        """Blocks of the prompt that really hit on ``key``: stored or predicted, capped by SWA."""
        full = self.index.overlap(key, hashes, now)
        return self.swa.cap(key, hashes, full) if full else 0

    def _load(self, url: str, rank: int) -> tuple[float, float, int]:
        """``(queued prefill blocks, active blocks, requests in flight)`` of a target."""
        worker = self._workers.get(url)
        if worker is None or rank >= len(worker.loads):
            return 0.0, 0.0, 0
        load = worker.loads[rank]
        queued, active, in_flight = (
            float(load.queued_prefill_blocks),
            float(load.active_blocks),
            load.in_flight,
        )
        if worker.load_subscribers and rank < len(worker.load_subscribers):
            stat = worker.load_subscribers[rank].current()
            if stat is not None:
                page = self.page_size
                queued = max(queued, stat.waiting_uncached_tokens / page)
                active = max(active, stat.tokens / page)
                in_flight = max(in_flight, stat.running + stat.waiting)
        return queued, active, in_flight

    def _by_cost(self, candidates: Sequence[WorkerView], request: GenerateRequest) -> tuple[WorkerView, str]:
        hashes = self._hashes(request)
        now = self._clock()
        blocks = max(1, math.ceil(len(request.input_ids) / self.page_size))
        cfg = self.config
        targets: list[
            tuple[WorkerView, int, float, int, int]
        ] = []  # (worker, rank, cost, overlap, in flight)
        for w in candidates:
            worker = self._workers.get(w.url)
            caches = worker is None or worker.plan.caches
            for rank in range(worker.plan.ranks if worker is not None else 1):
                overlap = self._overlap((w.url, rank), hashes, now) if caches else 0
                queued, active, in_flight = self._load(w.url, rank)
                cost = cfg.prefill_weight * (blocks - overlap + queued) + cfg.decode_weight * active
                targets.append((w, rank, cost, overlap, in_flight))
        session = current_session()
        previous = self._sessions.get(session) if session is not None else None
        low = min(t[2] for t in targets)
        if cfg.temperature > 0:
            scale = cfg.temperature * blocks
            weights = [math.exp(-(t[2] - low) / scale) for t in targets]
            chosen = self._rng.choices(targets, weights)[0]
        else:
            margin = cfg.session_tolerance * blocks if previous is not None else 0.0
            sticky = [t for t in targets if previous is not None and (t[0].url, t[1]) == previous]
            if sticky and sticky[0][2] <= low + margin:
                chosen = sticky[0]
            else:
                best = [t for t in targets if t[2] <= low + 1e-9]
                least = min(t[0].in_flight for t in best)
                best = [t for t in best if t[0].in_flight == least]
                fewest = min(t[4] for t in best)
                best = [t for t in best if t[4] == fewest]
                # its own rotation: a leg pinned to one worker still spreads new prompts over its ranks
                self._target_rr += 1
                chosen = best[self._target_rr % len(best)]
        w, rank, _, overlap, _ = chosen
        if session is not None:
            self._stick(session, (w.url, rank))
        self._decided[request.request_id] = _Decision(w.url, rank, hashes, overlap)
        self._decided.move_to_end(request.request_id)
        if len(self._decided) > MAX_PENDING_DECISIONS:
            self._decided.popitem(last=False)
        return w, "kv-overlap" if overlap > 0 else "kv-load"

    def rank_for(self, url: str, request: GenerateRequest) -> int | None:
        """The data-parallel rank of worker ``url`` that ``request`` should go to, or None (one rank,
        or a mode that leaves ranks to the worker). The prefill/decode orchestrator sends it as
        SGLang's ``routed_dp_rank``; :meth:`begin` then uses the same rank."""
        if not self.kv_aware or self.ranks(url) < 2:
            return None
        decided = self._decided.get(request.request_id)
        if decided is None or decided.url != url:
            self._by_cost([_View(url)], request)
            decided = self._decided[request.request_id]
        return decided.rank

    best_rank = rank_for

    # ------------------------------------------------------------------ request lifecycle

    def begin(self, url: str, request: GenerateRequest) -> RouteTicket:
        """``request`` starts on worker ``url`` (after :meth:`choose`, or a pool fallback)."""
        worker = self._worker(url)
        n = len(request.input_ids)
        blocks = max(1, math.ceil(n / self.page_size))
        ranks = worker.plan.ranks
        hint = _requested_rank(request, ranks)
        overlap, rank, hashes = 0, hint if hint is not None else 0, None
        if self.kv_aware:
            decided = self._decided.pop(request.request_id, None)
            if decided is None or decided.url != url or (hint is not None and decided.rank != hint):
                if hint is not None:
                    hashes = self._hashes(request)
                    decided = _Decision(url, hint, hashes, self._overlap((url, hint), hashes, self._clock()))
                else:
                    self._by_cost([_View(url)], request)
                    decided = self._decided.pop(request.request_id)
            rank, hashes, overlap = decided.rank, decided.hashes, decided.overlap
            if worker.plan.caches and hashes:
                key = (url, rank)
                self.index.record(key, hashes, self._clock())
                if overlap:
                    self.index.touch(key, hashes[overlap - 1])
                # the pages this prefill computes get live SWA; the page before its hit is touched
                self.swa.mark(key, hashes[max(0, overlap - 1) :])
            else:
                overlap = 0
        load = worker.loads[rank] if rank < len(worker.loads) else worker.loads[0]
        prefill = blocks - overlap
        load.in_flight += 1
        load.requests += 1
        load.queued_prefill_blocks += prefill
        load.active_blocks += blocks
        load.prompt_tokens += n
        predicted = min(n, overlap * self.page_size)
        load.predicted_cached_tokens += predicted
        send = rank if ranks > 1 and (self.kv_aware or hint is not None) else None
        return RouteTicket(self, url, blocks, prefill, n, predicted, send, load)

    # ------------------------------------------------------------------ observability

    def worker_stats(self) -> dict[str, dict[str, float]]:
        """Per worker (all ranks together): prompt and cached tokens, predicted cached tokens, load."""
        out: dict[str, dict[str, float]] = {}
        for url, worker in self._workers.items():
            loads = worker.loads
            prompt = sum(x.prompt_tokens for x in loads)
            cached = sum(x.cached_tokens for x in loads)
            out[url] = {
                "requests": sum(x.requests for x in loads),
                "in_flight": sum(x.in_flight for x in loads),
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "predicted_cached_tokens": sum(x.predicted_cached_tokens for x in loads),
                "cached_token_rate": cached / prompt if prompt else 0.0,
                "indexed_blocks": sum(self.index.block_count((url, r)) for r in range(worker.plan.ranks)),
            }
        return out

    def rank_stats(self, url: str) -> list[dict[str, int]]:
        """Per rank of worker ``url``: requests, in flight, prompt and cached tokens."""
        worker = self._workers.get(url)
        if worker is None:
            return []
        return [
            {"requests": x.requests, "in_flight": x.in_flight, "prompt_tokens": x.prompt_tokens,
             "cached_tokens": x.cached_tokens}
            for x in worker.loads
        ]  # fmt: skip

    def event_stats(self) -> dict[str, dict[str, int]]:
        """Per event source (``url#rank``): batches, events, gaps, replays, restarts, clears."""
        out: dict[str, dict[str, int]] = {}
        for url, worker in self._workers.items():
            for sub in worker.subscribers:
                s = sub.stats
                out[f"{url}#{sub.source.dp_rank}"] = {
                    "batches": s.batches,
                    "events": s.events,
                    "gaps": s.gaps,
                    "replays": s.replays,
                    "replay_failures": s.replay_failures,
                    "restarts": s.restarts,
                    "clears": s.clears,
                    "decode_errors": s.decode_errors,
                    "max_turn_blocks": s.max_turn_blocks,
                }
        return out


def _requested_rank(request: GenerateRequest, ranks: int) -> int | None:
    """The ``routed_dp_rank`` a request already carries (a prefill/decode leg), when valid here."""
    extra = request.extra_fields
    rank = extra.get("routed_dp_rank") if extra else None
    if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < ranks:
        return rank
    return None


async def _close_all(subscribers: Sequence[Any]) -> None:
    for sub in subscribers:
        await sub.aclose()


@dataclass(slots=True)
class _View:
    url: str
    in_flight: int = 0
