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
* **what SGLang caches**: the prompt's pages at prefill, the prompt plus the output at the end of
  a request (``cache_finished_req``).
* **prefill interference**: the engine passes an ``occupy`` hook to :meth:`SimKvCache.prefill`
  that runs the prefill chunk by chunk and holds the worker's decode steps meanwhile
  (engines/sim/clock.py).

:class:`KvEventPublisher` publishes each change as SGLang does with ``--kv-events-config``: a
ZMQ PUB socket sending ``[topic, 8-byte big-endian sequence, msgpack [ts, events,
attn_dp_rank]]`` with ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` maps (encoded by
:func:`deepseek_frontend.routing.events.encode_sglang_batch`, the same bytes the router's
decoder reads from a real worker), and, with a ``replay_endpoint``, a ROUTER socket that
resends buffered batches from a requested sequence followed by an end marker (sequence -1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import zmq
import zmq.asyncio

from deepseek_frontend._tasks import cancel_and_wait
from deepseek_frontend.routing.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    encode_sequence,
    encode_sglang_batch,
)

__all__ = ["KvEventPublisher", "SimKvCache", "parse_kv_events_config"]

logger = logging.getLogger(__name__)

#: SGLang's DeepSeek-V4 page size
SIM_KV_PAGE_SIZE = 256
#: batches kept for replay (SGLang's ``buffer_steps`` default)
REPLAY_BUFFER_STEPS = 10_000


def parse_kv_events_config(text: str | Mapping[str, Any]) -> dict[str, Any]:
    """SGLang's ``--kv-events-config`` JSON -> dict; raises ``ValueError`` naming what is wrong."""
    try:
        data = json.loads(text) if isinstance(text, str) else dict(text)
    except ValueError as exc:
        raise ValueError(f"--kv-events-config is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("--kv-events-config must be a JSON object")
    publisher = data.get("publisher", "null")
    if publisher not in ("null", "zmq"):
        raise ValueError(f"--kv-events-config publisher must be 'null' or 'zmq', got {publisher!r}")
    for key in ("endpoint", "replay_endpoint", "topic"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(f"--kv-events-config {key} must be a string")
    return data


class KvEventPublisher:
    """SGLang's ZMQ KV event publisher for one DP rank (see module docstring).

    ``endpoint`` / ``replay_endpoint`` are bound (``tcp://*:P`` binds every interface,
    ``tcp://127.0.0.1:0`` a free loopback port); :attr:`endpoint` then holds the bound address.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        dp_rank: int = 0,
        buffer_steps: int = REPLAY_BUFFER_STEPS,
    ) -> None:
        self._ctx = zmq.asyncio.Context.instance()
        self._topic = topic.encode()
        self.dp_rank = dp_rank
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        # a plain (blocking-API) socket: PUB never blocks, and the asyncio wrapper's per-send
        # bookkeeping costs more than the send itself
        self._pub = zmq.Context.instance().socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._pub.bind(endpoint)
        self.endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._task: asyncio.Task[None] | None = None
        #: test hook: sequences to skip on the live socket (still buffered for replay)
        self.drop_live: set[int] = set()

    @property
    def next_sequence(self) -> int:
        return self._seq

    def start(self) -> None:
        """Serve replay requests (needs a running event loop)."""
        if self._replay is not None and self._task is None:
            self._task = asyncio.create_task(self._serve_replay(), name="sim kv replay")

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Send one batch now (PUB never blocks: past the high-water mark ZMQ drops, like SGLang)."""
        if not events:
            return
        seq = self._seq
        self._seq += 1
        payload = encode_sglang_batch(time.time(), events, self.dp_rank)
        self._buffer.append((seq, payload))
        if seq in self.drop_live:
            return
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart(
                [self._topic, encode_sequence(seq), payload], flags=zmq.NOBLOCK, copy=False
            )

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                continue
            client, empty, start_frame = frames
            start = int.from_bytes(start_frame, "big", signed=True)
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await self._replay.send_multipart(
                        [client, empty, self._topic, encode_sequence(seq), payload]
                    )
            await self._replay.send_multipart([client, empty, b"", encode_sequence(-1), b""])

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


class SimKvCache:
    """A bounded per-worker prefix cache with LRU eviction and prefill timing (see module docstring)."""

    def __init__(
        self,
        capacity_tokens: int,
        *,
        page_size: int = SIM_KV_PAGE_SIZE,
        prefill_us_per_token: float = 0.0,
        publisher: KvEventPublisher | None = None,
    ) -> None:
        if capacity_tokens < page_size:
            raise ValueError(f"--kv-cache-tokens must hold at least one {page_size}-token page")
        if prefill_us_per_token < 0:
            raise ValueError("--prefill-us-per-token must be >= 0")
        self.page_size = page_size
        self.capacity_pages = capacity_tokens // page_size
        self.prefill_s_per_token = prefill_us_per_token / 1e6
        self.publisher = publisher
        self._pages: OrderedDict[int, None] = OrderedDict()
        self._prefill_lock = asyncio.Lock()
        #: totals for /sim/stats and benchmarks
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.evicted_pages = 0

    @property
    def used_tokens(self) -> int:
        return len(self._pages) * self.page_size

    def lookup(self, ids: Sequence[int]) -> int:
        """Cached prefix of ``ids`` in tokens, without changing the cache (always < len(ids))."""
        size, h, cached = self.page_size, 0, 0
        for end in range(size, len(ids), size):
            h = hash((h, tuple(ids[end - size : end])))
            if h not in self._pages:
                break
            cached = end
        return cached

    def insert(self, ids: Sequence[int]) -> int:
        """Cache every full page of ``ids``, touch its prefix, evict beyond capacity; publish events.

        Returns the tokens that were already cached (leading pages present before the call, and
        never the last token, which an engine always computes).
        """
        size = self.page_size
        chain: list[int] = []
        h = 0
        for end in range(size, len(ids) + 1, size):
            h = hash((h, tuple(ids[end - size : end])))
            chain.append(h)
        pages = self._pages
        present = 0
        while present < len(chain) and chain[present] in pages:
            present += 1
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
        evicted: list[int] = []
        while len(pages) > self.capacity_pages:
            evicted.append(pages.popitem(last=False)[0])
        if evicted:
            self.evicted_pages += len(evicted)
            events.append(BlockRemoved(tuple(evicted)))
        if self.publisher is not None:
            self.publisher.publish(events)
        return min(present * size, max(0, len(ids) - 1))

    def clear(self) -> None:
        """Drop everything (a restart, ``/flush_cache``): publishes ``AllBlocksCleared``."""
        self._pages.clear()
        if self.publisher is not None:
            self.publisher.publish([AllBlocksCleared()])

    async def prefill(
        self,
        ids: Sequence[int],
        base_ttft_s: float = 0.0,
        occupy: Callable[[int, float], Awaitable[None]] | None = None,
    ) -> int:
        """Admit a prompt: wait for the worker's prefill slot, cache it, sleep its prefill time.

        ``occupy(uncached_tokens, seconds_per_token)``: runs the compute part of the prefill instead
        of one sleep (the engine runs it chunk by chunk, holding its decode steps); the fixed
        ``base_ttft_s`` is waited first. Returns the cached prompt tokens (what SGLang reports as
        ``cached_tokens``).
        """
        async with self._prefill_lock:
            cached = self.insert(ids)
            self.prompt_tokens += len(ids)
            self.cached_tokens += cached
            uncached = len(ids) - cached
            if occupy is None or not self.prefill_s_per_token:
                await asyncio.sleep(base_ttft_s + uncached * self.prefill_s_per_token)
            else:
                if base_ttft_s:
                    await asyncio.sleep(base_ttft_s)
                await occupy(uncached, self.prefill_s_per_token)
        return cached

    def finished(self, ids: Sequence[int]) -> None:
        """A request ended: its prompt and output stay cached (SGLang's ``cache_finished_req``)."""
        self.insert(ids)

    def stats(self) -> dict[str, int]:
        return {
            "kv_prompt_tokens": self.prompt_tokens,
            "kv_cached_tokens": self.cached_tokens,
            "kv_used_tokens": self.used_tokens,
            "kv_capacity_tokens": self.capacity_pages * self.page_size,
            "kv_evicted_pages": self.evicted_pages,
        }

    def server_info(self) -> dict[str, Any]:
        """What SGLang's ``/server_info`` says about this cache: ``page_size`` and ``kv_events_config``."""
        info: dict[str, Any] = {
            "page_size": self.page_size,
            "max_total_num_tokens": self.capacity_pages * self.page_size,
        }
        if self.publisher is not None:
            config = {"publisher": "zmq", "endpoint": self.publisher.endpoint, "topic": ""}
            if self.publisher.replay_endpoint:
                config["replay_endpoint"] = self.publisher.replay_endpoint
            info["kv_events_config"] = json.dumps(config)
            info["dp_size"] = 1
        return info


def add_kv_arguments(parser: Any) -> None:
    """``sim-engine`` flags of the KV cache model (an ``argparse`` parser or group)."""
    group = parser.add_argument_group("KV cache model (engines/sim/kv.py)")
    group.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=None,
        metavar="N",
        help="model a prefix cache of N tokens with LRU eviction (default: no cache model; "
        "cached_tokens then comes from an unbounded, timing-free cache)",
    )
    group.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=0.0,
        metavar="U",
        help="microseconds of prefill per uncached prompt token, added to --ttft-ms; prefills run one "
        "at a time (needs --kv-cache-tokens)",
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
        help='publish KV events like SGLang, e.g. \'{"publisher": "zmq", "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558"}\' (needs --kv-cache-tokens)',
    )


def kv_cache_from_args(args: argparse.Namespace) -> SimKvCache | None:
    """The cache model the ``sim-engine`` flags ask for (call inside the event loop); raises ValueError."""
    tokens = getattr(args, "kv_cache_tokens", None)
    config_text = getattr(args, "kv_events_config", None)
    if tokens is None:
        if config_text or getattr(args, "prefill_us_per_token", 0.0):
            raise ValueError("--kv-events-config and --prefill-us-per-token need --kv-cache-tokens")
        return None
    publisher = None
    if config_text:
        config = parse_kv_events_config(config_text)
        if config.get("publisher", "null") == "zmq":
            publisher = KvEventPublisher(
                str(config.get("endpoint") or "tcp://*:5557"),
                config.get("replay_endpoint"),
                topic=str(config.get("topic") or ""),
                buffer_steps=int(config.get("buffer_steps") or REPLAY_BUFFER_STEPS),
            )
            publisher.start()
    return SimKvCache(
        tokens,
        page_size=args.kv_page_size,
        prefill_us_per_token=args.prefill_us_per_token,
        publisher=publisher,
    )
