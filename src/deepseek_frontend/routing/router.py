"""The router: which worker serves a request (``serve --router-mode``).

Modes:

* ``round-robin`` -- rotate over the admitted workers.
* ``least-outstanding`` -- fewest requests in flight, ties rotated (the pool's historical default).
* ``session`` -- soft affinity: a session (see :mod:`deepseek_frontend.routing.session`) sticks
  to the worker that served it, unless that worker has more than ``session_slack`` requests in
  flight above the least-loaded one; then it moves (and sticks there).
* ``kv`` -- KV-cache aware, fed by the workers' KV events
  (:mod:`deepseek_frontend.routing.subscriber`).
* ``kv-approx`` -- KV-cache aware, fed by the router's own decisions (a prompt routed to a
  worker is assumed cached there for ``approx_ttl_s``).

KV cost of sending a prompt of ``B`` blocks to worker ``w`` (lower is better)::

    cost(w) = prefill_weight * (B - overlap(w) + queued_prefill_blocks(w))
            + decode_weight  * active_blocks(w)

``overlap(w)``: leading blocks of the prompt that ``w`` caches (its best DP rank);
``queued_prefill_blocks(w)``: uncached blocks of requests routed to ``w`` that have not produced
their first token yet (prefill is the engine's serial bottleneck, so a queue there delays this
request's first token directly); ``active_blocks(w)``: blocks of every request in flight on
``w`` (decode load). This is Dynamo's ``overlap_score_weight x prefill_blocks + decode_blocks``
with the queued prefill made explicit; the defaults (``prefill_weight`` 1, ``decode_weight``
0.3) were tuned with ``benchmarks/bench_routing.py`` (see docs/routing.md). With
``temperature`` 0 the cheapest worker wins, except that a request with a session stays on
the session's previous worker while that worker costs at most ``session_tolerance x B`` more
(moving a conversation duplicates its cache); remaining ties go to the worker with fewer
requests in flight, then rotate. A positive temperature samples from
``softmax(-cost / (temperature * B))`` instead, spreading load between near-equal workers.

The pool asks :meth:`Router.choose` among the workers it would admit (healthy, untried, able to
enforce the request's constraint, below their in-flight limit) and reports each request's start
(:meth:`begin`), first token and end through the returned :class:`RouteTicket`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from deepseek_frontend.generation import GenerateRequest, WorkerCapabilities
from deepseek_frontend.routing.hashing import PrefixHashCache
from deepseek_frontend.routing.index import KvIndex, SourceKey
from deepseek_frontend.routing.session import current_session

__all__ = ["ROUTER_MODES", "RouteTicket", "Router", "RouterConfig", "RouterMode", "WorkerView"]

logger = logging.getLogger(__name__)

RouterMode = Literal["kv", "kv-approx", "session", "least-outstanding", "round-robin"]
ROUTER_MODES: tuple[str, ...] = ("kv", "kv-approx", "session", "least-outstanding", "round-robin")

#: KV page size when neither the option nor the workers say (SGLang's DeepSeek-V4 page size)
DEFAULT_PAGE_SIZE = 256
#: sessions remembered for affinity
MAX_SESSIONS = 100_000


class WorkerView(Protocol):
    """What the router reads of a pool worker."""

    url: str
    in_flight: int


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Router settings (the ``serve`` flags of the same names)."""

    mode: RouterMode = "least-outstanding"
    #: tokens per KV block; None = the workers' reported page size, else DEFAULT_PAGE_SIZE
    page_size: int | None = None
    prefill_weight: float = 1.0
    decode_weight: float = 0.3
    temperature: float = 0.0
    #: requests in flight a session's worker may have above the least-loaded one before it moves
    session_slack: int = 2
    #: kv modes: a session stays on its previous worker while that worker's cost is within this
    #: fraction of the prompt's blocks of the cheapest (moving duplicates its cache elsewhere)
    session_tolerance: float = 0.25
    #: kv-approx: seconds a routed prompt is assumed cached, and blocks remembered per worker
    approx_ttl_s: float = 300.0
    approx_max_blocks: int = 1 << 18
    #: kv: event endpoints given by option, by worker URL (``endpoint`` or ``endpoint;replay``);
    #: workers not listed are asked for their ``kv_events_config`` (SGLang ``/server_info``)
    kv_event_endpoints: Mapping[str, str] = field(default_factory=dict)


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
class RouteTicket:
    """One request's stay on one worker: the pool calls :meth:`first_token` and :meth:`end`."""

    router: Router
    url: str
    blocks: int
    prefill_blocks: int
    prompt_tokens: int
    predicted_cached_tokens: int
    _prefilling: bool = True
    _ended: bool = False

    def first_token(self, cached_tokens: int | None = None) -> None:
        """The worker produced its first token (prefill is over); ``cached_tokens``: what it reported."""
        if self._prefilling:
            self._prefilling = False
            load = self.router._loads.get(self.url)
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
        load = self.router._loads.get(self.url)
        if load is not None:
            load.in_flight -= 1
            load.active_blocks -= self.blocks


class Router:
    """Chooses workers (see module docstring). ``clock`` is injectable for tests."""

    def __init__(self, config: RouterConfig | None = None, *, clock: Callable[[], float] = time.monotonic):
        self.config = config or RouterConfig()
        self.mode = self.config.mode
        if self.mode not in ROUTER_MODES:
            raise ValueError(f"unknown router mode {self.mode!r} (expected one of {', '.join(ROUTER_MODES)})")
        self._clock = clock
        self._rr = 0
        self._rng = random.Random(0)
        self._loads: dict[str, _Load] = {}
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self.index = KvIndex(
            ttl_s=self.config.approx_ttl_s if self.mode == "kv-approx" else None,
            max_blocks=self.config.approx_max_blocks if self.mode == "kv-approx" else 1 << 22,
        )
        self._sources: dict[str, list[SourceKey]] = {}
        self._subscribers: dict[str, list[Any]] = {}
        self._pending: dict[str, WorkerCapabilities | None] = {}
        self._hasher: PrefixHashCache | None = None
        self._page_size = self.config.page_size
        self._last: tuple[str, list[int], dict[str, int]] | None = None
        #: routing decisions by reason, migrations, and the time spent choosing (for metrics)
        self.decisions: Counter[str] = Counter()
        self.migrations = 0
        self.migration_failures = 0
        self.choose_seconds = 0.0
        self.choose_count = 0

    def __repr__(self) -> str:
        return f"Router(mode={self.mode!r}, workers={sorted(self._loads)!r})"

    @property
    def kv_aware(self) -> bool:
        return self.mode in ("kv", "kv-approx")

    @property
    def page_size(self) -> int:
        return self._page_size or DEFAULT_PAGE_SIZE

    # ------------------------------------------------------------------ workers

    def worker_added(self, url: str, capabilities: WorkerCapabilities | None = None) -> None:
        """A worker joined (or told us its capabilities): start following its KV events in ``kv`` mode."""
        self._loads.setdefault(url, _Load())
        if capabilities is not None and capabilities.page_size and self.config.page_size is None:
            if self._page_size not in (None, capabilities.page_size):
                logger.warning(
                    "worker %s has KV page size %d, others %d: routing uses %d",
                    url,
                    capabilities.page_size,
                    self._page_size,
                    self._page_size,
                )
            elif self._page_size is None:
                self._page_size = capabilities.page_size
                self._hasher = None
        if self.mode == "kv" and url not in self._subscribers:
            self._subscribe(url, capabilities)

    def _subscribe(self, url: str, capabilities: WorkerCapabilities | None) -> None:
        from deepseek_frontend.routing.subscriber import KvEventSource, KvEventSubscriber, sources_from_config

        given = self.config.kv_event_endpoints.get(url)
        sources: list[KvEventSource] = []
        if given:
            endpoint, _, replay = given.partition(";")
            sources = [KvEventSource(url, 0, endpoint.strip(), replay.strip() or None)]
        elif capabilities is not None:
            config = capabilities.extra.get("kv_events_config")
            dp_size = capabilities.extra.get("dp_size", 1)
            if config:
                try:
                    sources = sources_from_config(url, config, dp_size if isinstance(dp_size, int) else 1)  # type: ignore[arg-type]
                except (ValueError, TypeError) as exc:
                    logger.warning("cannot read kv_events_config of %s: %s", url, exc)
        if not sources:
            if capabilities is not None:
                logger.warning(
                    "worker %s publishes no KV events (start it with --kv-events-config or pass "
                    "--kv-events-endpoint); kv routing sees no cache on it",
                    url,
                )
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._pending[url] = capabilities  # no event loop yet: start() subscribes
            return
        self._pending.pop(url, None)
        subs = [KvEventSubscriber(self.index, s) for s in sources]
        self._subscribers[url] = subs
        self._sources[url] = [s.key for s in sources]
        for sub in subs:
            sub.start()

    async def worker_removed(self, url: str) -> None:
        """A worker left the pool: forget its blocks and stop following its events."""
        self._loads.pop(url, None)
        self._sources.pop(url, None)
        self.index.drop_worker(url)
        for sub in self._subscribers.pop(url, []):
            await sub.aclose()

    def worker_failed(self, url: str) -> None:
        """A worker was ejected (died): its cache cannot be trusted any more."""
        for key in self._sources.get(url, [(url, 0)]):
            self.index.clear(key)

    async def start(self) -> None:
        """Subscribe to the workers added before the event loop ran."""
        pending, self._pending = self._pending, {}
        for url, capabilities in pending.items():
            if url in self._loads and url not in self._subscribers:
                self._subscribe(url, capabilities)

    def subscribers(self) -> dict[str, list[Any]]:
        return dict(self._subscribers)

    async def aclose(self) -> None:
        for subs in self._subscribers.values():
            for sub in subs:
                await sub.aclose()
        self._subscribers.clear()

    # ------------------------------------------------------------------ choosing

    def choose(self, candidates: Sequence[WorkerView], request: GenerateRequest) -> WorkerView:
        """The worker among ``candidates`` (non-empty) that should serve ``request``."""
        started = time.perf_counter()
        try:
            return self._choose(candidates, request)
        finally:
            self.choose_seconds += time.perf_counter() - started
            self.choose_count += 1

    def _choose(self, candidates: Sequence[WorkerView], request: GenerateRequest) -> WorkerView:
        self._last = None
        if len(candidates) == 1:
            # no rotation step: a leg pinned to its worker (PD pairs) must not skew the rotation
            chosen, reason = candidates[0], "single-candidate"
            if self.kv_aware:
                self._score(candidates, request)  # keeps the ticket's prediction honest
            self.decisions[reason] += 1
            return chosen
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
            if w.url == previous:
                if w.in_flight <= low + self.config.session_slack:
                    self._sessions.move_to_end(session)
                    return w, "session"
                break
        chosen = self._least_outstanding(candidates)
        self._stick(session, chosen.url)
        return chosen, "session-new" if previous is None else "session-moved"

    def _stick(self, session: str, url: str) -> None:
        self._sessions[session] = url
        self._sessions.move_to_end(session)
        if len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)

    def _score(self, candidates: Sequence[WorkerView], request: GenerateRequest) -> dict[str, int]:
        if self._hasher is None:
            self._hasher = PrefixHashCache(self.page_size)
        hashes = self._hasher.hashes(request.input_ids)
        now = self._clock()
        overlaps: dict[str, int] = {}
        for w in candidates:
            keys = self._sources.get(w.url) or [(w.url, 0)]
            overlaps[w.url] = max(self.index.overlap(k, hashes, now) for k in keys)
        self._last = (request.request_id, hashes, overlaps)
        return overlaps

    def _by_cost(self, candidates: Sequence[WorkerView], request: GenerateRequest) -> tuple[WorkerView, str]:
        overlaps = self._score(candidates, request)
        blocks = max(1, math.ceil(len(request.input_ids) / self.page_size))
        cfg = self.config
        costs = []
        for w in candidates:
            load = self._loads.get(w.url) or _Load()
            prefill = blocks - overlaps[w.url] + load.queued_prefill_blocks
            costs.append(cfg.prefill_weight * prefill + cfg.decode_weight * load.active_blocks)
        session = current_session()
        previous = self._sessions.get(session) if session is not None else None
        if cfg.temperature > 0:
            scale = cfg.temperature * blocks
            low = min(costs)
            weights = [math.exp(-(c - low) / scale) for c in costs]
            chosen = self._rng.choices(list(candidates), weights)[0]
        else:
            low = min(costs)
            margin = cfg.session_tolerance * blocks if previous is not None else 0.0
            chosen = next(
                (
                    w
                    for w, c in zip(candidates, costs, strict=True)
                    if w.url == previous and c <= low + margin
                ),
                None,
            )
            if chosen is None:
                best = [w for w, c in zip(candidates, costs, strict=True) if c <= low + 1e-9]
                chosen = self._least_outstanding(best)
        if session is not None:
            self._stick(session, chosen.url)
        return chosen, "kv-overlap" if overlaps[chosen.url] > 0 else "kv-load"

    def best_rank(self, url: str, request: GenerateRequest) -> int | None:
        """The data-parallel rank of worker ``url`` caching most of ``request``'s prompt, or None.

        None unless the worker publishes KV events per DP rank (more than one source) and some rank
        holds at least one leading block: the worker's own DP balancing then stays in charge. The
        prefill/decode orchestrator sends the rank as SGLang's ``routed_dp_rank`` hint.
        """
        keys = self._sources.get(url)
        if not keys or len(keys) < 2 or not self.kv_aware:
            return None
        if self._hasher is None:
            self._hasher = PrefixHashCache(self.page_size)
        hashes = self._hasher.hashes(request.input_ids)
        now = self._clock()
        best, rank = 0, None
        for key in keys:
            held = self.index.overlap(key, hashes, now)
            if held > best:
                best, rank = held, key[1]
        return rank

    # ------------------------------------------------------------------ request lifecycle

    def begin(self, url: str, request: GenerateRequest) -> RouteTicket:
        """``request`` starts on worker ``url`` (after :meth:`choose`, or a pool fallback)."""
        load = self._loads.setdefault(url, _Load())
        n = len(request.input_ids)
        blocks = max(1, math.ceil(n / self.page_size))
        overlap = 0
        if self.kv_aware:
            last = self._last
            if last is not None and last[0] == request.request_id:
                hashes, overlap = last[1], last[2].get(url, 0)
            else:
                overlaps = self._score([_View(url)], request)
                hashes, overlap = self._last[1] if self._last else [], overlaps[url]
            if self.mode == "kv-approx":
                self.index.record((url, 0), hashes, self._clock())
        self._last = None
        prefill = blocks - overlap
        load.in_flight += 1
        load.requests += 1
        load.queued_prefill_blocks += prefill
        load.active_blocks += blocks
        load.prompt_tokens += n
        predicted = min(n, overlap * self.page_size)
        load.predicted_cached_tokens += predicted
        return RouteTicket(self, url, blocks, prefill, n, predicted)

    # ------------------------------------------------------------------ observability

    def worker_stats(self) -> dict[str, dict[str, float]]:
        """Per worker: prompt and cached tokens (engine-reported), predicted cached tokens, load."""
        out: dict[str, dict[str, float]] = {}
        for url, load in self._loads.items():
            out[url] = {
                "requests": load.requests,
                "in_flight": load.in_flight,
                "prompt_tokens": load.prompt_tokens,
                "cached_tokens": load.cached_tokens,
                "predicted_cached_tokens": load.predicted_cached_tokens,
                "cached_token_rate": load.cached_tokens / load.prompt_tokens if load.prompt_tokens else 0.0,
                "indexed_blocks": sum(self.index.block_count(k) for k in self._sources.get(url, [(url, 0)])),
            }
        return out

    def event_stats(self) -> dict[str, dict[str, int]]:
        """Per event source (``url#rank``): batches, events, gaps, replays, restarts, clears."""
        out: dict[str, dict[str, int]] = {}
        for url, subs in self._subscribers.items():
            for sub in subs:
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
                }
        return out


@dataclass(slots=True)
class _View:
    url: str
    in_flight: int = 0
