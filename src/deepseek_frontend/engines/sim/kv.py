"""The simulated engine's KV cache: a bounded prefix cache, prefill cost, and SGLang KV events.

``sim-engine --kv-cache-tokens N --prefill-us-per-token U [--kv-events-config JSON]``.

:class:`SimKvCache` models what matters to a router:

* **a bounded prefix cache** of ``page_size``-token pages (SGLang's radix cache in pages): page
  ``k`` of a sequence is named by a hash chained over pages ``0..k``; a request's cached prefix
  is its run of leading pages present. Capacity is ``N`` tokens; beyond it the least recently
  used pages go first, and a page's prefix is always touched after the page itself, so leaves
  are evicted before their parents (a radix tree evicts leaves only).
* **prefill cost**: time to first token is ``ttft_ms + U x uncached prompt tokens``, and
  prefills run one at a time per worker (prefill is compute-bound: a queue of long prefills
  delays every first token behind it).
* **what SGLang caches** (0.5.23, paths under ``sglang/srt/``): the prompt's pages after its
  prefill (``checkpoint_kv_cache``, ``managers/scheduler_components/batch_result_processor.py:394``),
  the prompt plus the output when a request ends (``release_kv_cache``, ``mem_cache/common.py``).
* **when the events go out** (``managers/scheduler_components/kv_events_publisher.py``,
  ``metrics_reporter.py:899, 934, 1145``, ``scheduler.py:5315``): after each prefill batch -- so a
  prompt's ``BlockStored`` follows its prefill, not its arrival --, every ``--decode-log-interval``
  (40) decode steps while only decoding, and when idle. A finished request's events wait here for
  the next prefill or ``40 x --itl-ms``, whichever comes first.
* **DeepSeek-V4's sliding-window cache** (``--swa-full-tokens-ratio R``; engine-facts D): beside
  the full pages, a pool of ``R`` x their count holding the pages whose 128-token window is live,
  least recently used first. A prefix hits only up to the last page boundary whose page has live
  SWA (``mem_cache/unified_cache/components/swa.py:357-377``); a prefill leaves its computed pages
  live; a finished request's output is tombstoned except its last ``ceil(max(window, page))``
  tokens (``mem_cache/common.py:75-125`` ``free_swa_out_of_window_slots``,
  ``components/swa.py:999-1028``); SWA eviction tombstones without an event, a full-page eviction
  drops both. ``cached_tokens`` and the prefill time follow the hit, not the full prefix.
* **data-parallel ranks** (``sim-engine --attn-dp-size N``): one cache, prefill slot and event
  publisher per rank (the engine holds the list; engines/sim/kv_publish.py binds them).
* **prefill interference**: the engine passes an ``occupy`` hook to :meth:`SimKvCache.prefill`
  that runs the prefill chunk by chunk and holds the worker's decode steps meanwhile
  (engines/sim/clock.py).

The publishers (:mod:`deepseek_frontend.engines.sim.kv_publish`) send each change as SGLang does
with ``--kv-events-config`` (encoded by :func:`deepseek_frontend.routing.events.encode_sglang_batch`,
the same bytes the router's decoder reads from a real worker) and answer replays.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from deepseek_frontend.engines.sim.kv_publish import (
    REPLAY_BUFFER_STEPS,
    KvEventPublisher,
    RankPublishers,
    parse_kv_events_config,
)
from deepseek_frontend.routing.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

__all__ = [
    "REPLAY_BUFFER_STEPS",
    "KvEventPublisher",
    "RankPublishers",
    "SimKvCache",
    "parse_kv_events_config",
]

logger = logging.getLogger(__name__)

#: SGLang's DeepSeek-V4 page size
SIM_KV_PAGE_SIZE = 256
#: DeepSeek-V4's sliding window (engine-facts D2)
SWA_WINDOW = 128
#: decode steps between KV event flushes while only decoding (SGLang's --decode-log-interval)
DECODE_LOG_INTERVAL = 40


class SimKvCache:
    """A bounded per-rank prefix cache with LRU eviction and prefill timing (see module docstring).

    ``swa_ratio``: model DeepSeek-V4's sliding-window cache beside the full one (a pool of
    ``swa_ratio`` x the full pool's pages, ``window`` tokens): hits then follow SGLang's SWA rule
    (see module docstring); None: every cached prefix hits. ``flush_s``: how long events of a
    finished request wait for a flush while the worker only decodes (SGLang flushes after each
    prefill batch, every ``--decode-log-interval`` decode steps and when idle); 0 flushes at once.
    """

    def __init__(
        self,
        capacity_tokens: int,
        *,
        page_size: int = SIM_KV_PAGE_SIZE,
        prefill_us_per_token: float = 0.0,
        publisher: KvEventPublisher | None = None,
        swa_ratio: float | None = None,
        window: int = SWA_WINDOW,
        flush_s: float = 0.0,
    ) -> None:
        if capacity_tokens < page_size:
            raise ValueError(f"--kv-cache-tokens must hold at least one {page_size}-token page")
        if prefill_us_per_token < 0:
            raise ValueError("--prefill-us-per-token must be >= 0")
        if swa_ratio is not None and not 0 < swa_ratio <= 1:
            raise ValueError("--swa-full-tokens-ratio must be in (0, 1]")
        self.page_size = page_size
        self.capacity_pages = capacity_tokens // page_size
        self.prefill_s_per_token = prefill_us_per_token / 1e6
        self.publisher = publisher
        self._pages: OrderedDict[int, None] = OrderedDict()
        #: pages whose sliding-window KV is live (DeepSeek-V4), least recently used first
        self._swa: OrderedDict[int, None] | None = OrderedDict() if swa_ratio is not None else None
        self.swa_ratio = swa_ratio
        self.swa_pages = max(1, int(self.capacity_pages * swa_ratio)) if swa_ratio is not None else 0
        #: pages of sliding window a hit needs right before it (1 while the window fits a page)
        self._window_pages = max(1, -(-window // page_size))
        self.window = window
        self.flush_s = flush_s
        self._deferred: list[KvEvent] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._prefill_lock = asyncio.Lock()
        #: totals for /sim/stats and benchmarks
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.evicted_pages = 0
        #: prefix tokens present in the full cache that did not hit for want of live SWA
        self.swa_missed_tokens = 0

    @property
    def used_tokens(self) -> int:
        return len(self._pages) * self.page_size

    def _chain(self, ids: Sequence[int], end: int) -> list[int]:
        size, h, chain = self.page_size, 0, []
        for stop in range(size, end + 1, size):
            h = hash((h, tuple(ids[stop - size : stop])))
            chain.append(h)
        return chain

    def _hit_pages(self, chain: Sequence[int]) -> tuple[int, int]:
        """``(pages that hit, pages present in the full cache)`` of a chain, leading pages only."""
        pages = self._pages
        present = 0
        while present < len(chain) and chain[present] in pages:
            present += 1
        live = self._swa
        if live is None:
            return present, present
        need = self._window_pages
        j = present
        while j > 0 and not all(chain[k] in live for k in range(max(0, j - need), j)):
            j -= 1
        return j, present

    def lookup(self, ids: Sequence[int]) -> int:
        """Cached prefix of ``ids`` in tokens that would hit, without changing the cache (< len(ids))."""
        chain = self._chain(ids, len(ids) - 1)
        return self._hit_pages(chain)[0] * self.page_size

    def insert(self, ids: Sequence[int]) -> int:
        """Cache every full page of ``ids`` with live SWA, evict beyond capacity, publish the events now.

        Returns the tokens that hit before the call (never the last token, which an engine always
        computes).
        """
        cached, events = self._insert(ids, live_from=None)
        self._publish(events)
        return cached

    def _insert(self, ids: Sequence[int], live_from: int | None) -> tuple[int, list[KvEvent]]:
        """Insert ``ids``' full pages; SWA goes live on the pages from the hit on (``live_from`` None),
        or only on pages from ``live_from`` on (a finished request's tail). Returns ``(hit tokens,
        events)``."""
        size = self.page_size
        chain = self._chain(ids, len(ids))
        hit, present = self._hit_pages(chain)
        pages = self._pages
        new = chain[present:]
        # deepest first, so every page is more recent than its children (evicted after them)
        for page in reversed(chain):
            if page in pages:
                pages.move_to_end(page)
            else:
                pages[page] = None
        events: list[KvEvent] = []
        if new:
            parent = chain[present - 1] if present else None
            events.append(
                BlockStored(tuple(new), parent, tuple(ids[present * size : len(chain) * size]), size)
            )
        live = self._swa
        if live is not None:
            # a prefill touches the matched path and computes the rest with live SWA; a finished
            # request's output is tombstoned except its last page-aligned window (the tail)
            first = hit if live_from is None else live_from
            # the matched path is used again: its live pages become the most recently used
            deque(map(live.move_to_end, [page for page in chain[:hit] if page in live]), maxlen=0)
            for page in chain[first:]:
                live.pop(page, None)
                live[page] = None
            while len(live) > self.swa_pages:  # SGLang's SWA LRU: tombstones, no event
                live.popitem(last=False)
        evicted: list[int] = []
        while len(pages) > self.capacity_pages:
            page = pages.popitem(last=False)[0]
            evicted.append(page)
            if live is not None:
                live.pop(page, None)
        if evicted:
            self.evicted_pages += len(evicted)
            events.append(BlockRemoved(tuple(evicted)))
        self.swa_missed_tokens += (min(present, (len(ids) - 1) // size) - hit) * size if present > hit else 0
        return min(hit * size, max(0, len(ids) - 1)), events

    def _publish(self, events: Sequence[KvEvent]) -> None:
        if self.publisher is not None and events:
            self.publisher.publish(events)

    def flush(self) -> None:
        """Send the deferred events (SGLang: after a prefill batch, every 40 decode steps, when idle)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        events, self._deferred = self._deferred, []
        self._publish(events)

    def clear(self) -> None:
        """Drop everything (a restart, ``/flush_cache``): publishes ``AllBlocksCleared``."""
        self._pages.clear()
        if self._swa is not None:
            self._swa.clear()
        self.flush()
        self._publish([AllBlocksCleared()])

    async def prefill(
        self,
        ids: Sequence[int],
        base_ttft_s: float = 0.0,
        occupy: Callable[[int, float], Awaitable[None]] | None = None,
    ) -> int:
        """Admit a prompt: wait for the rank's prefill slot, cache it, take its prefill time, then
        publish its events (SGLang publishes after the prefill batch, with what was deferred).

        ``occupy(uncached_tokens, seconds_per_token)``: runs the compute part of the prefill instead
        of one sleep (the engine runs it chunk by chunk, holding its decode steps); the fixed
        ``base_ttft_s`` is waited first. Returns the cached prompt tokens (what SGLang reports as
        ``cached_tokens``).
        """
        async with self._prefill_lock:
            cached, events = self._insert(ids, live_from=None)
            self.prompt_tokens += len(ids)
            self.cached_tokens += cached
            uncached = len(ids) - cached
            try:
                if occupy is None or not self.prefill_s_per_token:
                    await asyncio.sleep(base_ttft_s + uncached * self.prefill_s_per_token)
                else:
                    if base_ttft_s:
                        await asyncio.sleep(base_ttft_s)
                    await occupy(uncached, self.prefill_s_per_token)
            finally:
                self._deferred.extend(events)
                self.flush()
        return cached

    def finished(self, ids: Sequence[int], prompt_tokens: int | None = None) -> None:
        """A request ended: its prompt and output stay cached (SGLang's final insert). With the SWA
        model, the output's SWA is tombstoned except the tail: the pages from
        ``floor_page(len - 1 - max(window, page))`` on (``free_swa_out_of_window_slots``)."""
        live_from = None
        if self._swa is not None:
            size = self.page_size
            keep = -(-max(self.window, size) // size) * size
            tail = max(0, (len(ids) - 1 - keep) // size)
            prompt_floor = (prompt_tokens if prompt_tokens is not None else 0) // size
            live_from = max(tail, prompt_floor)
        _, events = self._insert(ids, live_from=live_from)
        self._deferred.extend(events)
        if self.flush_s <= 0:
            self.flush()
        elif self._flush_handle is None and self._deferred:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
            else:
                self._flush_handle = loop.call_later(self.flush_s, self.flush)

    def stats(self) -> dict[str, int]:
        out = {
            "kv_prompt_tokens": self.prompt_tokens,
            "kv_cached_tokens": self.cached_tokens,
            "kv_used_tokens": self.used_tokens,
            "kv_capacity_tokens": self.capacity_pages * self.page_size,
            "kv_evicted_pages": self.evicted_pages,
        }
        if self._swa is not None:
            out["kv_swa_live_tokens"] = len(self._swa) * self.page_size
            out["kv_swa_missed_tokens"] = self.swa_missed_tokens
        return out

    def server_info(self) -> dict[str, Any]:
        """What SGLang's ``/server_info`` says about this cache (one rank's): ``page_size``,
        ``max_total_num_tokens`` and, with the SWA model, ``attention_backend`` ``dsv4`` and
        ``swa_full_tokens_ratio`` (SGLang's DeepSeek-V4 override)."""
        info: dict[str, Any] = {
            "page_size": self.page_size,
            "max_total_num_tokens": self.capacity_pages * self.page_size,
        }
        if self.swa_ratio is not None:
            info["attention_backend"] = "dsv4"
            info["swa_full_tokens_ratio"] = self.swa_ratio
        return info


def add_kv_arguments(parser: Any) -> None:
    """``sim-engine`` flags of the KV cache model (an ``argparse`` parser or group)."""
    group = parser.add_argument_group("KV cache model (engines/sim/kv.py)")
    group.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=None,
        metavar="N",
        help="model a prefix cache of N tokens per DP rank with LRU eviction (default: no cache model; "
        "cached_tokens then comes from an unbounded, timing-free cache)",
    )
    group.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=0.0,
        metavar="U",
        help="microseconds of prefill per uncached prompt token, added to --ttft-ms; prefills run one "
        "at a time per rank (needs --kv-cache-tokens)",
    )
    group.add_argument(
        "--kv-page-size",
        type=int,
        default=SIM_KV_PAGE_SIZE,
        help=f"tokens per KV page (default {SIM_KV_PAGE_SIZE}, SGLang's DeepSeek-V4 page size)",
    )
    group.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help="publish KV events like SGLang, one publisher per DP rank on port + rank, e.g. "
        '\'{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}\' '
        "(needs --kv-cache-tokens)",
    )
    group.add_argument(
        "--kv-events-host",
        default=None,
        metavar="HOST",
        help="address the KV event publishers bind when the endpoint's host is a wildcard "
        "(default 127.0.0.1; 0.0.0.0 for every interface, as SGLang binds tcp://*)",
    )
    group.add_argument(
        "--attn-dp-size",
        type=int,
        default=1,
        metavar="N",
        help="attention data-parallel ranks: N caches, schedulers and KV event publishers; a request "
        "goes to its routed_dp_rank, else round robin (default 1)",
    )
    group.add_argument(
        "--swa-full-tokens-ratio",
        type=float,
        default=None,
        metavar="R",
        help="model DeepSeek-V4's sliding-window cache: a pool of R x the full cache (SGLang's V4 "
        "default 0.1) whose live window a hit needs (default: no SWA model)",
    )
    group.add_argument(
        "--decode-log-interval",
        type=int,
        default=DECODE_LOG_INTERVAL,
        metavar="STEPS",
        help="decode steps (of --itl-ms) a finished request's KV events wait for a flush when no "
        f"prefill comes first (SGLang's flush cadence; default {DECODE_LOG_INTERVAL})",
    )


def kv_caches_from_args(args: argparse.Namespace) -> tuple[list[SimKvCache], RankPublishers | None]:
    """The per-rank cache models (and publishers) the ``sim-engine`` flags ask for (call inside the
    event loop); ``([], None)`` without ``--kv-cache-tokens``; raises ValueError."""
    tokens = getattr(args, "kv_cache_tokens", None)
    config_text = getattr(args, "kv_events_config", None)
    ranks = int(getattr(args, "attn_dp_size", 1) or 1)
    if ranks < 1:
        raise ValueError("--attn-dp-size must be >= 1")
    if tokens is None:
        if (
            config_text
            or getattr(args, "prefill_us_per_token", 0.0)
            or getattr(args, "swa_full_tokens_ratio", None)
        ):
            raise ValueError(
                "--kv-events-config, --prefill-us-per-token and --swa-full-tokens-ratio "
                "need --kv-cache-tokens"
            )
        return [], None
    publishers = None
    if config_text:
        config = parse_kv_events_config(config_text)
        if config.get("publisher", "null") == "zmq":
            publishers = RankPublishers(config, ranks, getattr(args, "kv_events_host", None))
            publishers.start()
    itl_s = float(getattr(args, "itl_ms", 0.0) or 0.0) / 1000
    flush_s = itl_s * int(getattr(args, "decode_log_interval", DECODE_LOG_INTERVAL) or 0)
    caches = [
        SimKvCache(
            tokens,
            page_size=args.kv_page_size,
            prefill_us_per_token=args.prefill_us_per_token,
            publisher=publishers.publishers[rank] if publishers is not None else None,
            swa_ratio=getattr(args, "swa_full_tokens_ratio", None),
            flush_s=flush_s,
        )
        for rank in range(ranks)
    ]
    return caches, publishers


def kv_cache_from_args(args: argparse.Namespace) -> SimKvCache | None:
    """Rank 0's cache model of :func:`kv_caches_from_args` (None without ``--kv-cache-tokens``)."""
    caches, _ = kv_caches_from_args(args)
    return caches[0] if caches else None
