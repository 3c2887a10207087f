"""Per-rank load from SGLang's load publisher (``--load-publish-endpoint``), over ZMQ (I/O).

SGLang 0.5.23 ``managers/scheduler_components/load_publisher.py`` (engine-facts B6): when the worker
advertises ``load_endpoint_port_base`` in its ``kv_events`` descriptor, rank ``r`` publishes on
``load_endpoint_port_base + r`` frames ``[b"load", 8-byte big-endian sequence, msgpack LoadStat]``,
where ``LoadStat`` is the tagged array ``["LoadStat", num_running_reqs, num_waiting_reqs,
num_tokens, max_total_num_tokens, attn_dp_rank, num_waiting_uncached_tokens, num_total_tokens,
max_running_requests, total_prefill_uncached_tokens, total_prefill_busy_us]`` (the first six
fixed, later ones may be missing on older workers or followed by new ones). A stat goes out at
once when it changes (at most every 15 decode iterations; prefill and idle force one) and is
re-sent at least every second (``LOAD_PUBLISH_HEARTBEAT_S``); there is no replay.

A :class:`LoadSubscriber` keeps the latest :class:`LoadStat` of one rank and when it came; the
router counts it only while it is fresh (:data:`STALE_AFTER_S`), because a rank that went quiet
may be gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import msgpack
import zmq
import zmq.asyncio

from deepseek_frontend._tasks import cancel_and_wait
from deepseek_frontend.routing.discovery import EventSource
from deepseek_frontend.routing.subscriber import subscribe

__all__ = ["STALE_AFTER_S", "LoadStat", "LoadSubscriber", "decode_load_stat"]

logger = logging.getLogger(__name__)

#: stats the SUB socket holds unread (only the latest counts)
RECEIVE_HWM = 64
#: seconds after which a rank's last stat no longer counts (SGLang re-sends every second)
STALE_AFTER_S = 5.0


@dataclass(frozen=True, slots=True)
class LoadStat:
    running: int
    waiting: int
    #: KV tokens in use
    tokens: int
    max_tokens: int
    dp_rank: int | None = None
    #: uncached prompt tokens waiting for their prefill
    waiting_uncached_tokens: int = 0


def decode_load_stat(payload: bytes) -> LoadStat:
    """One ``LoadStat`` payload; raises ``ValueError`` when it is not one."""
    try:
        raw = msgpack.unpackb(payload, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"load payload is not msgpack: {exc}") from exc
    if not isinstance(raw, list) or len(raw) < 5 or raw[0] != "LoadStat":
        raise ValueError("load payload is not a LoadStat array")
    numbers = raw[1:5]
    if not all(isinstance(n, int) for n in numbers):
        raise ValueError("LoadStat counts must be integers")
    rank = raw[5] if len(raw) > 5 and isinstance(raw[5], int) else None
    uncached = raw[6] if len(raw) > 6 and isinstance(raw[6], int) else 0
    return LoadStat(*numbers, rank, uncached)


class LoadSubscriber:
    """The latest load of one rank (see module docstring)."""

    def __init__(self, source: EventSource, *, context: zmq.asyncio.Context | None = None) -> None:
        self.source = source
        self.latest: LoadStat | None = None
        #: time.monotonic() of the latest stat
        self.at = 0.0
        self.stats_received = 0
        self.decode_errors = 0
        self._ctx = context or zmq.asyncio.Context.instance()
        self._task: asyncio.Task[None] | None = None

    def current(self, now: float | None = None) -> LoadStat | None:
        """The latest stat while fresh, else None."""
        if self.latest is None:
            return None
        if (now if now is not None else time.monotonic()) - self.at > STALE_AFTER_S:
            return None
        return self.latest

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"load {self.source.endpoint}")

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _run(self) -> None:
        sub = subscribe(self._ctx, self.source, RECEIVE_HWM)
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    self.decode_errors += 1
                    continue
                try:
                    stat = decode_load_stat(frames[2])
                except ValueError as exc:
                    self.decode_errors += 1
                    logger.debug("bad load stat from %s: %s", self.source.endpoint, exc)
                    continue
                self.latest, self.at = stat, time.monotonic()
                self.stats_received += 1
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("load subscriber for %s stopped", self.source.endpoint)
        finally:
            sub.close(linger=0)
