"""Prefill/decode disaggregation for the simulated engine: rooms, the bootstrap port, the KV transfer.

``sim-engine --disaggregation-mode prefill|decode --disaggregation-bootstrap-port P``. What a
frontend sees follows SGLang 0.5.23's PD mode with its default ``--disaggregation-decode-allocation-policy
early`` (the facts are listed in docs/routing.md, section "Prefill/decode disaggregation: the
simulated engine"); the transfer itself is this module's own:

* a **prefill** worker serves its bootstrap port (:class:`BootstrapServer`, asyncio streams). Each
  ``/generate`` opens the request's ``bootstrap_room`` and computes nothing until the room's decode
  worker has pre-allocated the KV (``disaggregation/prefill.py`` ``pop_bootstrapped``), for at most
  ``bootstrap_timeout_s`` from its arrival; once prefilled, the room's KV (``kv_bytes_per_token``
  bytes a token) goes to the decode worker. A room id is used once: a second request with a room
  still open, or one a decode worker already gave up on, fails ("Duplicate or cancelled bootstrap
  room").
* a **decode** worker connects to ``bootstrap_host:bootstrap_port`` (:func:`fetch_kv`; retrying for
  ``handshake_timeout_s`` as SGLang retries its bootstrap query), asks for the room, pre-allocates
  the KV in its pool (:class:`DecodeMemory`) and says so, then waits for the KV up to
  ``waiting_timeout_s`` from that moment (``disaggregation/common/conn.py`` ``_check_waiting_timeout``)
  and receives it as real bytes, paced to ``transfer_bandwidth_mbps`` -- so the transfer's time grows
  with the prompt.

The wire (ours): each message is a 4-byte big-endian length and a JSON object. The decode side
sends ``{"room", "rid", "prefill_dp_rank"}`` (the handshake), then ``{"allocated": true}`` once its
KV is pre-allocated; the prefill side answers, once the room is prefilled, ``{"ok": true, "tokens",
"bytes", "cached_tokens", "first_token", "output_ids"}`` followed by ``bytes`` raw bytes (the prompt's
ids as 4-byte little-endian ints, then zeros), or at any time ``{"ok": false, "reason", "stage"?}``;
the decode side then sends ``{"ok": true}`` (received). Any other message from the decode side is
``{"abort": reason}`` (it gave up: the room fails).
``output_ids`` is the whole output the prefill worker's model state leads to (the simulated model's
plan): the decode worker writes it instead of planning the prompt again, as a real decode worker
continues from the transferred state instead of reading the prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

__all__ = [
    "DEFAULT_BOOTSTRAP_PORT",
    "BootstrapServer",
    "DecodeMemory",
    "DisaggSettings",
    "KvArrival",
    "KvTransferError",
    "fetch_kv",
    "missing_room_message",
]

DisaggMode = Literal["null", "prefill", "decode"]
DISAGG_MODES: tuple[str, ...] = ("null", "prefill", "decode")
#: SGLang's ``--disaggregation-bootstrap-port`` default
DEFAULT_BOOTSTRAP_PORT = 8998
#: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT and SGLANG_DISAGGREGATION_WAITING_TIMEOUT (seconds)
SGLANG_BOOTSTRAP_TIMEOUT_S = 300.0
SGLANG_WAITING_TIMEOUT_S = 300.0
#: a decode worker queries an unreachable bootstrap server 15 times, 1 s apart, then gives up
SGLANG_HANDSHAKE_TIMEOUT_S = 15.0
#: rooms a prefill worker keeps open at once, and room ids a decode worker gave up on remembered
MAX_OPEN_ROOMS = 4096
MAX_CANCELLED_ROOMS = 4096
#: bytes per write of a paced transfer
_SLICE = 64 * 1024
_ID_BYTES = 4
#: the message SGLang's decode side records when it or its peer gave up on a room
ABORTED = "Aborted by AbortReq."


@dataclass(frozen=True, slots=True)
class DisaggSettings:
    """A worker's PD role and the knobs of its (simulated) transfer."""

    mode: DisaggMode = "null"
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT
    kv_bytes_per_token: int = 64
    #: megabits per second of a KV transfer; 0: as fast as the socket goes
    transfer_bandwidth_mbps: float = 0.0
    bootstrap_timeout_s: float = SGLANG_BOOTSTRAP_TIMEOUT_S
    waiting_timeout_s: float = SGLANG_WAITING_TIMEOUT_S
    handshake_timeout_s: float = SGLANG_HANDSHAKE_TIMEOUT_S
    #: a decode worker's KV pool in tokens (SGLang's ``--max-total-tokens``); None: unbounded
    max_total_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in DISAGG_MODES:
            raise ValueError(f"--disaggregation-mode must be one of {DISAGG_MODES}, got {self.mode!r}")
        if self.kv_bytes_per_token < _ID_BYTES:
            raise ValueError(f"--kv-bytes-per-token must be >= {_ID_BYTES}")
        if self.transfer_bandwidth_mbps < 0:
            raise ValueError("--transfer-bandwidth-mbps must be >= 0")
        if self.max_total_tokens is not None and self.max_total_tokens < 1:
            raise ValueError("--max-total-tokens must be >= 1")

    def min_transfer_s(self, nbytes: int) -> float:
        """The least time ``nbytes`` take at the configured bandwidth (0 when unpaced)."""
        if not self.transfer_bandwidth_mbps:
            return 0.0
        return nbytes * 8 / (self.transfer_bandwidth_mbps * 1e6)


class KvTransferError(Exception):
    """A room that could not be received (decode) or handed over (prefill).

    ``stage`` "handshake": the bootstrap server was never reached; "transfer": reached, but the
    room's KV did not arrive. ``str()`` is SGLang's ``KVTransferError`` spelling.
    """

    def __init__(self, room: int, reason: str, stage: Literal["handshake", "transfer"] = "transfer") -> None:
        super().__init__(reason)
        self.room = room
        self.reason = reason
        self.stage = stage

    def __str__(self) -> str:
        return f"KVTransferError(bootstrap_room={self.room}): {self.reason}"


def missing_room_message(rid: str) -> str:
    """SGLang's scheduler message for a PD request without ``bootstrap_room`` (HTTP 400 abort)."""
    return f"Invalid request: Disaggregated request received without bootstrap room id. req.rid={rid!r}"


def decode_failure_message(rid: str, error: KvTransferError) -> str:
    """SGLang's decode-side abort message (status 500) for a failed handshake or transfer."""
    what = "handshake" if error.stage == "handshake" else "transfer"
    return (
        f"Decode {what} failed for request rank=0 decode_req.req.rid={rid!r} "
        f"decode_req.req.bootstrap_room={error.room} with exception {error}"
    )


def prefill_failure_message(rid: str, error: KvTransferError) -> str:
    """SGLang's prefill-side abort message (status 500): no decode bootstrapped, or the transfer failed."""
    what = "bootstrap" if error.stage == "handshake" else "transfer"
    return (
        f"Prefill {what} failed for request rank=0 req.rid={rid!r} "
        f"req.bootstrap_room={error.room} with exception {error}"
    )


def kv_payload(ids: Sequence[int], bytes_per_token: int) -> bytes:
    """The KV a room carries: the prompt's ids (4-byte little-endian), then zeros up to the size."""
    head = array("i", ids).tobytes()
    return head + bytes(len(ids) * bytes_per_token - len(head))


async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    data = orjson.dumps(message)
    writer.write(len(data).to_bytes(4, "big") + data)
    await writer.drain()


async def _receive(reader: asyncio.StreamReader) -> dict[str, Any]:
    size = int.from_bytes(await reader.readexactly(4), "big")
    if size > 1 << 24:
        raise ValueError("bootstrap message too long")
    message = orjson.loads(await reader.readexactly(size))
    if not isinstance(message, dict):
        raise ValueError("bootstrap message is not an object")
    return message


@dataclass(slots=True)
class _Room:
    """One open room on a prefill worker."""

    rid: str
    #: when the prefill leg arrived: the bootstrap timeout counts from here (SGLang's sender
    #: ``init_time``, set as the request enters the bootstrap queue)
    arrived: float = 0.0
    ids: Sequence[int] = ()
    cached_tokens: int = 0
    first_token: int = 0
    plan: Sequence[int] = ()
    #: set once a decode worker has pre-allocated the room's KV (SGLang: its KV indices arrived)
    allocated: asyncio.Event = field(default_factory=asyncio.Event)
    #: set once the KV is held (prefill done), or the room failed
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    #: None once a decode worker received the KV, else why the room failed
    outcome: asyncio.Future[KvTransferError | None] | None = None
    failure: KvTransferError | None = None


class BootstrapServer:
    """A prefill worker's bootstrap port: open rooms, learn when each room's decode worker has
    pre-allocated, hold the rooms' KV, hand it over.

    SGLang's default ``--disaggregation-decode-allocation-policy early`` (``disaggregation/prefill.py``
    ``pop_bootstrapped``): a prefill leg computes nothing until its decode worker has pre-allocated
    the KV (:meth:`bootstrapped`); that wait is bounded by ``bootstrap_timeout_s`` from the leg's
    arrival (``disaggregation/common/conn.py`` ``_check_bootstrap_timeout``).
    """

    def __init__(self, settings: DisaggSettings) -> None:
        self.settings = settings
        self._rooms: dict[int, _Room] = {}
        self._cancelled: OrderedDict[int, str] = OrderedDict()
        #: rooms whose prefill leg ended without handing the KV over, and why (a decode asking late
        #: for one is told it failed)
        self._ended: OrderedDict[int, KvTransferError] = OrderedDict()
        self._server: asyncio.AbstractServer | None = None
        self.port = settings.bootstrap_port
        #: counters for /sim/stats
        self.bytes_sent = 0
        self.transfers = 0
        self.failed_rooms = 0
        #: decode connections waiting on the bootstrap port for a room not ready yet
        self.waiting_decodes = 0
        #: seconds prefill legs waited for their decode worker's allocation before computing
        self.bootstrap_wait_s = 0.0
        #: a fault: prefilled rooms are never sent (the transfer hangs; /sim/fault ``pd_transfer``)
        self.hold_transfers = False

    async def start(self, host: str) -> int:
        """Listen on ``host:bootstrap_port`` (0: a free port); returns the bound port."""
        self._server = await asyncio.start_server(self._serve, host, self.settings.bootstrap_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    # ------------------------------------------------------------------ the /generate side

    def open(self, room: int, rid: str) -> _Room:
        """Register a request's room; raises :class:`KvTransferError` (handshake stage) for a room
        that is open already, one a decode worker gave up on, or when too many are open."""
        if room in self._rooms or room in self._cancelled:
            raise KvTransferError(room, "Duplicate or cancelled bootstrap room", "handshake")
        if len(self._rooms) >= MAX_OPEN_ROOMS:
            raise KvTransferError(room, f"more than {MAX_OPEN_ROOMS} rooms open on this worker", "handshake")
        loop = asyncio.get_running_loop()
        entry = _Room(rid, arrived=loop.time(), outcome=loop.create_future())
        self._rooms[room] = entry
        return entry

    def holds(self, rid: str) -> bool:
        """Whether an open room belongs to request ``rid``."""
        return any(entry.rid == rid for entry in self._rooms.values())

    async def bootstrapped(self, room: int) -> KvTransferError | None:
        """Wait until the room's decode worker has pre-allocated its KV (None), or why the room
        failed: no allocation within ``bootstrap_timeout_s`` of the leg's arrival ("timed out ...
        in KVPoll.Bootstrapping"), or an abort."""
        entry = self._rooms[room]
        assert entry.outcome is not None
        loop = asyncio.get_running_loop()
        left = entry.arrived + self.settings.bootstrap_timeout_s - loop.time()
        allocated = asyncio.ensure_future(entry.allocated.wait())
        try:
            await asyncio.wait(
                {allocated, entry.outcome}, timeout=max(left, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            allocated.cancel()
        self.bootstrap_wait_s += loop.time() - entry.arrived
        if entry.failure is not None:
            return entry.failure
        if entry.allocated.is_set():
            return None
        elapsed = loop.time() - entry.arrived
        reason = f"Request {room} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping"
        error = KvTransferError(room, reason, "handshake")
        self._fail(room, error)
        return error

    def publish(
        self, room: int, ids: Sequence[int], cached_tokens: int, first_token: int, plan: Sequence[int]
    ) -> None:
        """The room's prompt is prefilled: its KV (and the output it leads to) is held for a decode
        worker to fetch."""
        entry = self._rooms.get(room)
        if entry is None or entry.failure is not None:
            return
        entry.ids, entry.cached_tokens, entry.first_token = ids, cached_tokens, first_token
        entry.plan = plan
        entry.ready.set()

    async def handed_over(self, room: int) -> KvTransferError | None:
        """Wait until the decode worker received the room's KV (None) or the room failed (why). The
        decode worker bounds this wait (its waiting timeout, then it gives the room up)."""
        entry = self._rooms[room]
        assert entry.outcome is not None
        return await asyncio.shield(entry.outcome)

    def close(self, room: int) -> None:
        """The request ended: forget the room and its KV (a decode still to ask for it is told it
        failed)."""
        entry = self._rooms.pop(room, None)
        if entry is None:
            return
        if entry.outcome is not None and not entry.outcome.done():
            entry.failure = KvTransferError(room, ABORTED)
            entry.outcome.set_result(entry.failure)
            entry.ready.set()
        if entry.failure is not None:
            self._ended[room] = entry.failure
            while len(self._ended) > MAX_CANCELLED_ROOMS:
                self._ended.popitem(last=False)

    def abort_prefix(self, prefix: str) -> int:
        """``/abort_request`` (by prefix, as SGLang's scheduler matches its PD queues): fail the
        rooms of every request whose rid starts with ``prefix`` (their waiting decodes are told)."""
        hit = [room for room, entry in self._rooms.items() if entry.rid.startswith(prefix)]
        for room in hit:
            self._fail(room, KvTransferError(room, ABORTED))
        return len(hit)

    def _fail(self, room: int, error: KvTransferError) -> None:
        entry = self._rooms.get(room)
        if entry is None or entry.outcome is None or entry.outcome.done():
            return
        self.failed_rooms += 1
        entry.failure = error
        entry.outcome.set_result(error)
        entry.ready.set()  # wake a decode worker waiting for it: it gets the failure

    def _cancel(self, room: int, reason: str) -> None:
        """A decode worker gave up on ``room``: fail it if open, else refuse it when it comes."""
        if room in self._rooms:
            self._fail(room, KvTransferError(room, reason))
            return
        self._cancelled[room] = reason
        while len(self._cancelled) > MAX_CANCELLED_ROOMS:
            self._cancelled.popitem(last=False)

    def stats(self) -> dict[str, Any]:
        waiting = sum(1 for e in self._rooms.values() if not e.allocated.is_set() and e.failure is None)
        return {
            "pd_rooms_open": len(self._rooms),
            "pd_rooms_waiting_for_decode": waiting,
            "pd_bootstrap_wait_ms": round(self.bootstrap_wait_s * 1000, 3),
            "pd_transfers_sent": self.transfers,
            "pd_bytes_sent": self.bytes_sent,
            "pd_rooms_failed": self.failed_rooms,
        }

    # ------------------------------------------------------------------ the bootstrap port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One decode worker's connection for one room: its ask (the handshake), its allocation,
        the KV sent once prefilled, its acknowledgement. A message from the decode side other than
        the one expected is its abort: the room fails."""
        room: int | None = None
        told: asyncio.Future[dict[str, Any]] | None = None
        try:
            ask = await _receive(reader)
            room = int(ask["room"])
            rank = ask.get("prefill_dp_rank")
            if rank not in (None, 0):
                # one DP rank here: SGLang's bootstrap server has no route for another
                reason = (
                    f"Could not fetch bootstrap info for: prefill_dp_rank: {rank} prefill_cp_rank: 0 "
                    "target_tp_rank: 0 and target_pp_rank 0"
                )
                await _send(writer, {"ok": False, "reason": reason, "stage": "handshake"})
                return
            told = asyncio.ensure_future(_receive(reader))
            self.waiting_decodes += 1
            try:
                entry, told = await self._until_ready(room, told, reader)
            finally:
                self.waiting_decodes -= 1
            if entry is None:
                return
            if entry.failure is not None:
                await _send(writer, {"ok": False, "reason": entry.failure.reason})
                return
            if self.hold_transfers:
                await asyncio.wait({told})  # never sent: until the decode gives the room up or leaves
                message = told.result() if told.exception() is None else {}
                self._cancel(room, str(message.get("abort") or ABORTED))
                return
            payload = kv_payload(entry.ids, self.settings.kv_bytes_per_token)
            header = {
                "ok": True,
                "tokens": len(entry.ids),
                "bytes": len(payload),
                "cached_tokens": entry.cached_tokens,
                "first_token": entry.first_token,
                "output_ids": list(entry.plan),
            }
            await _send(writer, header)
            await self._paced_write(writer, payload)
            answer = await told
            if answer.get("ok") is True:
                self.transfers += 1
                if entry.outcome is not None and not entry.outcome.done():
                    entry.outcome.set_result(None)
            else:
                self._cancel(room, str(answer.get("abort") or ABORTED))
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError, TypeError):
            if room is not None and room in self._rooms:
                # the decode worker went away
                self._fail(room, KvTransferError(room, "Lost connection with decode instance"))
        finally:
            if told is not None and not told.done():
                told.cancel()
                await asyncio.wait({told})
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _until_ready(
        self, room: int, told: asyncio.Future[dict[str, Any]], reader: asyncio.StreamReader
    ) -> tuple[_Room | None, asyncio.Future[dict[str, Any]]]:
        """Follow one room until its KV is ready or it failed: wait for the prefill leg to open it
        (the decode leg often arrives first), take the decode's allocation message (the prefill may
        compute from then on), wait for the prefill. ``(None, ...)`` when the decode side gave up
        meanwhile (any other message is its abort: the room fails); else the room and the watch of
        the decode's next message (its acknowledgement, or an abort)."""
        allocated = False
        while True:
            entry = self._rooms.get(room)
            if entry is None and room in self._cancelled:
                return None, told
            if entry is None and room in self._ended:
                return _Room("", failure=self._ended[room]), told
            if entry is not None:
                if entry.failure is not None:
                    return entry, told
                if allocated:
                    entry.allocated.set()
                    if entry.ready.is_set():
                        return entry, told
            other = asyncio.ensure_future(entry.ready.wait() if entry is not None else asyncio.sleep(0.005))
            try:
                await asyncio.wait({told, other}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                other.cancel()
            if not told.done():
                continue
            message = told.result() if told.exception() is None else {}
            if message.get("allocated") is True and not allocated:
                allocated = True
                told = asyncio.ensure_future(_receive(reader))
                continue
            self._cancel(room, str(message.get("abort") or ABORTED))
            return None, told

    async def _paced_write(self, writer: asyncio.StreamWriter, payload: bytes) -> None:
        settings = self.settings
        view = memoryview(payload)
        started = time.monotonic()
        for at in range(0, len(view), _SLICE):
            part = view[at : at + _SLICE]
            writer.write(part)
            await writer.drain()
            self.bytes_sent += len(part)
            due = started + settings.min_transfer_s(at + len(part))
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)


class DecodeMemory:
    """A decode worker's KV pool (SGLang's ``--max-total-tokens``), pre-allocated first come, first
    served: a decode leg holds its prompt plus its ``max_new_tokens`` from its pre-allocation to its
    end, and one that does not fit waits -- and, the queue being in order, so does every leg behind
    it (``disaggregation/decode.py`` ``DecodePreallocQueue.pop_preallocated`` stops at the first
    request that does not fit). ``capacity`` None: unbounded."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for _, f in self._waiters if not f.done())

    def need(self, tokens: int) -> int:
        """What a leg of ``tokens`` holds (at most the whole pool: such a leg runs alone)."""
        return tokens if self.capacity is None else min(tokens, self.capacity)

    async def allocate(self, tokens: int) -> None:
        """Hold ``tokens`` (:meth:`need`), waiting in order for them; cancelling gives the place up."""
        if not self._waiters and self._fits(tokens):
            self.used += tokens
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((tokens, waiter))
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(tokens)  # granted as it was cancelled: give it back
            raise

    def release(self, tokens: int) -> None:
        self.used -= tokens
        while self._waiters:
            tokens_next, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if not self._fits(tokens_next):
                return
            self._waiters.popleft()
            self.used += tokens_next
            waiter.set_result(None)

    def _fits(self, tokens: int) -> bool:
        return self.capacity is None or self.used + tokens <= self.capacity


@dataclass(frozen=True, slots=True)
class KvArrival:
    """What a decode worker received for a room."""

    tokens: int
    nbytes: int
    seconds: float
    cached_tokens: int
    first_token: int
    plan: tuple[int, ...] | None


async def fetch_kv(
    host: str | None,
    port: int | None,
    room: int,
    rid: str,
    ids: Sequence[int],
    settings: DisaggSettings,
    prefill_dp_rank: int | None = None,
    allocate: Callable[[], Awaitable[object]] | None = None,
) -> KvArrival:
    """Receive ``room``'s KV from the prefill worker at ``host:port`` (see the module docstring).

    The steps are SGLang's decode side (``disaggregation/decode.py``): the handshake with the
    bootstrap server first, then the pre-allocation of the KV (``allocate``: the decode worker's
    memory, awaited while the connection is watched for the prefill failing the room), which is
    reported to the prefill worker -- under the ``early`` policy the prefill computes only from then
    on -- then the wait for the KV, bounded by ``waiting_timeout_s`` from that report
    (``conn.py`` ``_check_waiting_timeout``: the clock starts when the KV indices are sent).

    Raises :class:`KvTransferError`: "handshake" when the bootstrap port cannot be reached within
    ``handshake_timeout_s`` or has no route for ``prefill_dp_rank`` (the request's
    ``disagg_prefill_dp_rank``); "transfer" when the room does not arrive in time, the prefill
    worker reports it failed, or its KV is not this prompt's. Cancelling the call (an
    ``/abort_request``) tells the prefill worker the room is given up.
    """
    reader, writer = await _connect(host, port, room, settings.handshake_timeout_s)
    received = False
    told: asyncio.Future[dict[str, Any]] | None = None
    try:
        await _send(writer, {"room": room, "rid": rid, "prefill_dp_rank": prefill_dp_rank})
        told = asyncio.ensure_future(_receive(reader))
        if allocate is not None:
            allocation = asyncio.ensure_future(allocate())
            try:
                await asyncio.wait({told, allocation}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not allocation.done():
                    allocation.cancel()
                    await asyncio.wait({allocation})
            if not allocation.done() or allocation.cancelled():
                # the prefill side answered first: a failure (the room or the rank)
                header = told.result()
                received = True
                raise KvTransferError(room, str(header.get("reason") or ABORTED), _stage(header))
        await _send(writer, {"allocated": True})
        started = time.monotonic()
        try:
            header = await asyncio.wait_for(asyncio.shield(told), settings.waiting_timeout_s)
        except TimeoutError:
            elapsed = time.monotonic() - started
            raise KvTransferError(
                room, f"Request {room} timed out after {elapsed:.1f}s in KVPoll.WaitingForInput"
            ) from None
        if header.get("ok") is not True:
            received = True  # the prefill side failed the room itself: nothing to tell it
            raise KvTransferError(room, str(header.get("reason") or ABORTED), _stage(header))
        nbytes = int(header["bytes"])
        begun = time.monotonic()
        payload = await reader.readexactly(nbytes)
        seconds = time.monotonic() - begun
        if int(header["tokens"]) != len(ids) or payload[: len(ids) * _ID_BYTES] != array("i", ids).tobytes():
            raise KvTransferError(room, "KV checksum mismatch")
        await _send(writer, {"ok": True})
        received = True
        plan = header.get("output_ids")
        return KvArrival(
            len(ids),
            nbytes,
            seconds,
            int(header["cached_tokens"]),
            int(header["first_token"]),
            tuple(int(t) for t in plan) if isinstance(plan, list) and plan else None,
        )
    except (OSError, asyncio.IncompleteReadError, ValueError, KeyError, TypeError) as exc:
        reason = f"Failed to get kvcache from prefill instance, it might be dead ({exc})"
        raise KvTransferError(room, reason) from None
    finally:
        if told is not None and not told.done():
            told.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait({told})
        if not received:
            with contextlib.suppress(Exception):
                await _send(writer, {"abort": ABORTED})
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)


def _stage(header: dict[str, Any]) -> Literal["handshake", "transfer"]:
    return "handshake" if header.get("stage") == "handshake" else "transfer"


async def _connect(
    host: str | None, port: int | None, room: int, timeout_s: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the bootstrap port, retrying once a second up to ``timeout_s`` (SGLang retries
    its bootstrap query 15 times, 1 s apart); then the room fails as SGLang's does, whose receiver
    is aborted ("Aborted by AbortReq.")."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if not host or port is None:
                raise OSError(f"no bootstrap address ({host}:{port})")
            remaining = max(deadline - time.monotonic(), 0.1)
            return await asyncio.wait_for(asyncio.open_connection(host, int(port)), min(remaining, 5.0))
        except (OSError, TimeoutError, ValueError):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KvTransferError(room, ABORTED, "handshake") from None
            await asyncio.sleep(min(1.0, remaining))
