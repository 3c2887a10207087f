"""Subscribing to a worker's KV events over ZMQ (I/O), feeding a :class:`KvIndex` (or another sink).

One :class:`KvEventSubscriber` per source (worker URL + data-parallel rank): a SUB socket on
the publisher's endpoint and, when the worker has one, a DEALER socket on its replay endpoint.
Where each rank publishes comes from :mod:`deepseek_frontend.routing.discovery`.

Ordering and recovery:

* At start the subscriber asks the replay socket for everything from sequence 0, so a router
  that starts after the workers still learns what they cache (up to the publisher's buffer).
  An empty answer means the publisher has sent nothing yet: its first live batch must then be
  sequence 0, and a later one is a gap (the batches sent while the SUB socket was joining).
* A live batch whose sequence is the next expected one is applied. One ahead of a gap asks
  for a replay of the missing range; if the replay cannot fill it (no replay socket, a
  timeout, or the publisher's buffer no longer reaches back that far) the source's blocks are
  dropped -- an index that misses removals would send requests to caches that are gone --
  and the subscriber continues from the live batch.
* A batch numbered below what was already applied, outside a replay's overlap, means the
  publisher restarted (its counter starts again at 0): a restarted worker has an empty cache,
  so the source's blocks are dropped before the batch is applied.

Bounded work per loop turn: events are applied on the frontend's event loop, so a flood (a
worker storing 100K blocks a second, a replay of 10,000 batches) must not hold the loop. The
subscriber applies at most :data:`BLOCKS_PER_TURN` blocks (stored or removed; a long
``BlockStored`` is cut into slices of that many) and then yields to the loop before the next
slice, so requests and probes (``/live``) are served between slices; ``stats.max_turn_blocks``
records the most it applied in one turn. Past what the subscriber keeps up with, ZMQ's receive
queue (``RECEIVE_HWM`` batches) drops batches, and the gap is handled as above.

Only device blocks are indexed: a ``BlockStored`` or ``BlockRemoved`` whose ``medium`` names a host
tier (SGLang HiCache's ``CPU_PINNED``, ``DISK``, ``EXTERNAL``) is counted and skipped, because such a
block serves a prefix only after a load-back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import zmq
import zmq.asyncio

from deepseek_frontend._tasks import cancel_and_wait
from deepseek_frontend.routing.discovery import EventSource, config_sources
from deepseek_frontend.routing.events import (
    END_SEQUENCE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEventDecodeError,
    decode_batch,
    decode_sequence,
    encode_sequence,
)
from deepseek_frontend.routing.index import SourceKey

__all__ = [
    "KvEventSink",
    "KvEventSource",
    "KvEventSubscriber",
    "SubscriberStats",
    "sources_from_config",
    "subscribe",
]

logger = logging.getLogger(__name__)

#: seconds a replay may take before the gap is treated as unrecoverable
REPLAY_TIMEOUT_S = 2.0
#: blocks applied per event-loop turn before the subscriber yields (about 1 ms of hashing)
BLOCKS_PER_TURN = 256
#: batches ZMQ queues for a subscriber that has fallen behind (then it drops, and a gap follows)
RECEIVE_HWM = 1_000
#: the medium of device blocks (absent in a batch means device too)
DEVICE_MEDIUMS = (None, "GPU")

KvEventSource = EventSource
"""Where one data-parallel rank of a worker publishes its KV events (:class:`EventSource`)."""


class KvEventSink(Protocol):
    """Where a subscriber applies events: :class:`~deepseek_frontend.routing.index.KvIndex` or the
    router's wrapper around it."""

    def stored(
        self,
        source: SourceKey,
        engine_hashes: Sequence[Hashable],
        parent_engine_hash: Hashable | None,
        token_ids: Sequence[int],
        block_size: int,
    ) -> object: ...

    def removed(self, source: SourceKey, engine_hashes: Iterable[Hashable]) -> object: ...

    def clear(self, source: SourceKey) -> None: ...


def sources_from_config(
    worker_url: str, config: str | Mapping[str, object], dp_size: int = 1
) -> list[EventSource]:
    """The sources of a worker started with ``--kv-events-config CONFIG`` (SGLang's JSON form).

    ``config`` is the JSON string (as ``/server_info`` reports it) or its parsed form. Returns
    ``[]`` when the publisher is not ``zmq``. Raises ``ValueError`` for a malformed config.
    """
    return config_sources(worker_url, config, max(1, dp_size))


@dataclass(slots=True)
class SubscriberStats:
    batches: int = 0
    events: int = 0
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    restarts: int = 0
    clears: int = 0
    decode_errors: int = 0
    #: events skipped because they name a host tier (HiCache), not the device
    host_tier_events: int = 0
    #: the most blocks applied in one event-loop turn (bounded by BLOCKS_PER_TURN)
    max_turn_blocks: int = 0
    extra: dict[str, int] = field(default_factory=dict)


def subscribe(ctx: zmq.asyncio.Context, source: EventSource, receive_hwm: int) -> zmq.asyncio.Socket:
    """A SUB socket connected to ``source``'s endpoint, subscribed to its topic, holding at most
    ``receive_hwm`` messages (ZMQ drops what comes past it: a gap the sequence numbers show), closed
    without lingering. The KV-event and the load subscribers each read one."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, receive_hwm)
    sub.setsockopt(zmq.SUBSCRIBE, source.topic.encode())
    sub.connect(source.endpoint)
    return sub


class KvEventSubscriber:
    """Apply one source's event stream to ``index`` (see module docstring).

    ``blocks_per_turn``: blocks applied before yielding to the event loop.
    """

    def __init__(
        self,
        index: KvEventSink,
        source: EventSource,
        *,
        context: zmq.asyncio.Context | None = None,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
        blocks_per_turn: int = BLOCKS_PER_TURN,
    ) -> None:
        self.index = index
        self.source = source
        self.stats = SubscriberStats()
        self.replay_timeout_s = replay_timeout_s
        self.blocks_per_turn = max(1, blocks_per_turn)
        #: blocks applied since the subscriber last yielded to the loop
        self._turn = 0
        self._ctx = context or zmq.asyncio.Context.instance()
        self._next_seq: int | None = None
        #: live batches below this were also delivered by the last replay (duplicates, not a
        #: restart); cleared once a live batch at or past it arrives
        self._replayed_to: int | None = None
        self._task: asyncio.Task[None] | None = None
        #: set once the SUB socket is connected and the initial replay is done (tests wait on it)
        self.ready = asyncio.Event()

    @property
    def next_sequence(self) -> int | None:
        return self._next_seq

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kv-events {self.source.endpoint}")

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    # ------------------------------------------------------------------ loop

    async def _run(self) -> None:
        sub = subscribe(self._ctx, self.source, RECEIVE_HWM)
        try:
            if self.source.replay_endpoint and await self._replay(0) and self._next_seq is None:
                # the publisher's buffer is empty: it has sent nothing yet, so its first batch is
                # sequence 0 -- a later first batch means batches were lost while the SUB socket
                # joined (ZMQ drops what a PUB sends before a subscriber has joined): a gap
                self._next_seq = 0
            self.ready.set()
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    self.stats.decode_errors += 1
                    continue
                try:
                    seq = decode_sequence(frames[1])
                    batch = decode_batch(frames[2])
                except KvEventDecodeError as exc:
                    self.stats.decode_errors += 1
                    logger.warning("bad KV event from %s: %s", self.source.endpoint, exc)
                    continue
                await self.handle(seq, batch)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("KV event subscriber for %s stopped", self.source.endpoint)
            self._clear("subscriber failed")
        finally:
            sub.close(linger=0)

    async def handle(self, seq: int, batch: EventBatch) -> None:
        """Order one live batch (gap / duplicate / restart handling) and apply it."""
        expected = self._next_seq
        if self._replayed_to is not None and seq >= self._replayed_to:
            self._replayed_to = None  # caught up with live traffic
        if expected is not None and seq < expected:
            if self._replayed_to is not None:
                return  # queued while a replay delivered it
            self.stats.restarts += 1
            logger.warning(
                "KV events of %s restarted at sequence %d (expected %d): dropping its blocks",
                self.source.endpoint,
                seq,
                expected,
            )
            self._clear("publisher restarted")
            expected = None
        elif expected is not None and seq > expected:
            self.stats.gaps += 1
            filled = self.source.replay_endpoint is not None and await self._replay(expected)
            if self._next_seq is not None and seq < self._next_seq:
                return  # the replay delivered this batch already
            if not filled or self._next_seq != seq:
                logger.warning(
                    "KV events of %s lost sequences %d..%d: dropping its blocks",
                    self.source.endpoint,
                    expected,
                    seq - 1,
                )
                self._clear("sequence gap")
        await self._apply(batch)
        self._next_seq = seq + 1

    async def _replay(self, start: int) -> bool:
        """Ask the replay socket for every batch from ``start``; True when it filled the range."""
        assert self.source.replay_endpoint is not None
        self.stats.replays += 1
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.source.replay_endpoint)
        filled = True
        first = True
        try:
            await dealer.send_multipart([b"", encode_sequence(start)])
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), self.replay_timeout_s)
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) != 3:
                    continue
                seq = decode_sequence(frames[1])
                if seq == END_SEQUENCE:
                    break
                if first and seq > start and self._next_seq is not None:
                    filled = False  # the buffer no longer reaches back to `start`
                first = False
                if self._next_seq is not None and seq < self._next_seq:
                    continue
                if self._next_seq is not None and seq > self._next_seq:
                    filled = False
                try:
                    await self._apply(decode_batch(frames[2]))
                except KvEventDecodeError:
                    self.stats.decode_errors += 1
                    filled = False
                self._next_seq = seq + 1
            self._replayed_to = self._next_seq
        except (TimeoutError, zmq.ZMQError) as exc:
            self.stats.replay_failures += 1
            logger.warning("KV event replay from %s failed: %r", self.source.replay_endpoint, exc)
            filled = False
        finally:
            dealer.close(linger=0)
        return filled

    async def _spend(self, blocks: int) -> None:
        """Count ``blocks`` of work in this loop turn; yield to the loop once the turn's budget is spent."""
        self._turn += blocks
        if self._turn > self.stats.max_turn_blocks:
            self.stats.max_turn_blocks = self._turn
        if self._turn >= self.blocks_per_turn:
            self._turn = 0
            await asyncio.sleep(0)

    async def _apply(self, batch: EventBatch) -> None:
        key = self.source.key
        self.stats.batches += 1
        await self._spend(1)  # a batch costs its decoding even when it holds nothing
        for event in batch.events:
            self.stats.events += 1
            if isinstance(event, BlockStored):
                if event.medium not in DEVICE_MEDIUMS:
                    self.stats.host_tier_events += 1
                    continue
                names, size, parent = event.block_hashes, event.block_size, event.parent_block_hash
                done = 0
                while done < len(names):
                    part = names[done : done + self.blocks_per_turn - self._turn]
                    ids = event.token_ids[done * size : (done + len(part)) * size]
                    self.index.stored(key, part, parent, ids, size)
                    parent = part[-1]
                    done += len(part)
                    await self._spend(len(part))
            elif isinstance(event, BlockRemoved):
                if event.medium not in DEVICE_MEDIUMS:
                    self.stats.host_tier_events += 1
                    continue
                names = event.block_hashes
                done = 0
                while done < len(names):
                    part = names[done : done + self.blocks_per_turn - self._turn]
                    self.index.removed(key, part)
                    done += len(part)
                    await self._spend(len(part))
            elif isinstance(event, AllBlocksCleared):
                self._clear("AllBlocksCleared")

    def _clear(self, reason: str) -> None:
        self.stats.clears += 1
        self.stats.extra[reason] = self.stats.extra.get(reason, 0) + 1
        self.index.clear(self.source.key)
