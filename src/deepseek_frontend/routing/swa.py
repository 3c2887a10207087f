"""What really hits on a DeepSeek-V4 worker: the sliding-window (SWA) part of its prefix cache (pure).

SGLang 0.5.23 caches a DeepSeek-V4 prefix in a radix tree with two components per node
(``mem_cache/unified_cache``, engine-facts D): FULL (the compressed and indexer caches) and SWA
(the sliding-window cache: a window of 128 tokens, in a pool of 10% of the full pool's tokens,
``swa_full_tokens_ratio`` 0.1, ``arg_groups/model_overrides/deepseek_v4.py``). KV events report
FULL only (``BlockStored`` when a node gets FULL pages; SWA tombstoning and SWA eviction emit
nothing). A prefix match ends at a page boundary where *every* component passes, and the SWA
validator (``components/swa.py:357-377``) passes a boundary only when a window of live SWA tokens
lies right before it (or no tombstone lies on the path at all). With 256-token pages and a
128-token window: **a boundary hits when the page just before it has live SWA**. So a prefix
the events report is an upper bound of the real hit, and the router caps it here.

Where SWA is live (``mem_cache/common.py:75-125`` ``free_swa_out_of_window_slots``,
``components/swa.py:999-1028``, ``managers/scheduler_components/batch_result_processor.py:394``):

* after a prefill the prompt is checkpointed into the tree with live SWA (the pages this request
  computed; a matched prefix keeps what it had);
* a running request frees its own SWA below its last ``ceil(max(window, page))`` tokens, and its
  final insert turns that range into tombstones: after a request ends, its output is tombstoned
  except the page-aligned tail of at least 256 tokens -- the last page of prompt + output;
* SWA eviction under pressure tombstones the least recently used nodes' SWA and keeps FULL.

:class:`SwaLive` keeps, per source, the pages believed live: the pages of the prompts this router
sent there (marked at routing), the last page of every ``BlockStored`` (a prompt's end after its
prefill, or a finished sequence's live tail), in least-recently-used order within the SWA pool's
size in pages; beyond it the oldest are forgotten, as SGLang's SWA LRU would tombstone them.
:meth:`SwaLive.cap` turns a FULL overlap into the last boundary whose page is live.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deepseek_frontend.routing.index import SourceKey

__all__ = ["DEFAULT_SWA_WINDOW", "SwaLive", "SwaSettings"]

#: DeepSeek-V4's sliding window (SGLang's default when the config has none; engine-facts D2)
DEFAULT_SWA_WINDOW = 128
#: SGLang's swa_full_tokens_ratio for DeepSeek-V4 (not V4.1)
DEFAULT_SWA_RATIO = 0.1
#: pages scanned back from a FULL overlap for a live boundary (a 1M-token output is 4096 pages)
MAX_SCAN_PAGES = 8192


@dataclass(frozen=True, slots=True)
class SwaSettings:
    """One worker's SWA cache: ``window`` tokens, a pool of ``pool_pages`` pages (None: unbounded)."""

    window: int = DEFAULT_SWA_WINDOW
    pool_pages: int | None = None


def settings_from_server_info(info: dict[str, object], page_size: int) -> SwaSettings | None:
    """The SWA cache of an SGLang worker from its ``/server_info``, or None when matches are not
    gated by SWA: any model but DeepSeek-V4 (``attention_backend`` ``dsv4``, set by SGLang's V4
    override), and V4.1 with ``enable_decoder_swa_bounded_replay`` (the window is re-prefilled
    instead of required, ``fields/exec_.py:165-181``)."""
    if info.get("attention_backend") != "dsv4" or info.get("enable_decoder_swa_bounded_replay"):
        return None
    ratio = info.get("swa_full_tokens_ratio")
    total = info.get("max_total_num_tokens")
    pool = None
    if isinstance(total, int) and total > 0:
        r = ratio if isinstance(ratio, int | float) and ratio > 0 else DEFAULT_SWA_RATIO
        pool = max(1, int(total * r) // max(1, page_size))
    window = info.get("sliding_window_size")
    return SwaSettings(window if isinstance(window, int) and window > 0 else DEFAULT_SWA_WINDOW, pool)


class SwaLive:
    """Pages with live SWA per source (see module docstring); only sources given settings are gated."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._settings: dict[SourceKey, SwaSettings] = {}
        self._live: dict[SourceKey, dict[int, None]] = {}

    def configure(self, source: SourceKey, settings: SwaSettings | None) -> None:
        """Gate ``source``'s hits by SWA with ``settings`` (None: not gated, forget its pages)."""
        if settings is None:
            self._settings.pop(source, None)
            self._live.pop(source, None)
        else:
            self._settings[source] = settings
            self._live.setdefault(source, {})

    def gated(self, source: SourceKey) -> bool:
        return source in self._settings

    def window_pages(self, source: SourceKey) -> int:
        """Pages of live window a hit needs before its boundary (and a finished sequence keeps)."""
        settings = self._settings.get(source)
        return max(1, -(-settings.window // self.page_size)) if settings is not None else 1

    def pages(self, source: SourceKey) -> int:
        return len(self._live.get(source, ()))

    def mark(self, source: SourceKey, pages: Sequence[int]) -> None:
        """``pages`` (block hashes, in prompt order) now have live SWA on ``source``, most recent last."""
        live = self._live.get(source)
        if live is None or not pages:
            return
        for h in pages:
            live.pop(h, None)
        # the deepest page last: it is the one a follow-up's match ends on, so it outlives the rest
        live.update(dict.fromkeys(pages))
        pool = self._settings[source].pool_pages
        if pool is not None and len(live) > pool:
            for h in [h for _, h in zip(range(len(live) - pool), live, strict=False)]:
                del live[h]

    def cap(self, source: SourceKey, hashes: Sequence[int], overlap: int) -> int:
        """The hit of a prompt whose first ``overlap`` blocks ``source`` holds in FULL: the last
        boundary at or below ``overlap`` whose preceding window of pages has live SWA (0: none)."""
        if overlap <= 0:
            return 0
        live = self._live.get(source)
        if live is None:
            return overlap  # not gated
        need = self.window_pages(source)
        floor = max(0, overlap - MAX_SCAN_PAGES)
        j = overlap
        while j > floor:
            if all(hashes[k] in live for k in range(j - need, j) if k >= 0):
                return j
            j -= 1
        return 0

    def forget(self, source: SourceKey, pages: Sequence[int]) -> None:
        """``pages`` left ``source`` altogether (their FULL pages were evicted: the node is gone)."""
        live = self._live.get(source)
        if live is not None:
            for h in pages:
                live.pop(h, None)

    def clear(self, source: SourceKey) -> None:
        live = self._live.get(source)
        if live is not None:
            live.clear()

    def drop_worker(self, url: str) -> None:
        for key in [k for k in self._settings if k[0] == url]:
            del self._settings[key]
            self._live.pop(key, None)
