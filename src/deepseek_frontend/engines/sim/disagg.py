"""Prefill/decode disaggregation for the simulated engine: rooms, the bootstrap port, the KV transfer.

``sim-engine --disaggregation-mode prefill|decode --disaggregation-bootstrap-port P``. What a
frontend sees follows SGLang 0.5.23's PD mode (the facts are listed in docs/routing.md, section
"Prefill/decode disaggregation: the simulated engine"); the transfer itself is this module's own:

* a **prefill** worker serves its bootstrap port (:class:`BootstrapServer`, asyncio streams). Each
  ``/generate`` opens the request's ``bootstrap_room``; once prefilled, the room holds the prompt's
  KV (``kv_bytes_per_token`` bytes a token) until a decode worker has fetched it, or fails after
  ``bootstrap_timeout_s``. A room id is used once: a second request with a room still open, or one
  a decode worker already gave up on, fails ("Duplicate or cancelled bootstrap room").
* a **decode** worker fetches the room from ``bootstrap_host:bootstrap_port`` (:func:`fetch_kv`):
  it connects (retrying for ``handshake_timeout_s`` as SGLang retries its bootstrap query), asks for
  the room, waits for it up to ``waiting_timeout_s``, and receives the KV as real bytes, paced to
  ``transfer_bandwidth_mbps`` -- so the transfer's time grows with the prompt.

The wire (ours): each message is a 4-byte big-endian length and a JSON object. The decode side
sends ``{"room", "rid", "prefill_dp_rank"}``; the prefill side answers, once the room is ready,
``{"ok": true, "tokens", "bytes", "cached_tokens", "first_token", "output_ids"}`` followed by
``bytes`` raw bytes (the prompt's ids as 4-byte little-endian ints, then zeros), or ``{"ok": false,
"reason", "stage"?}``; the decode side then sends ``{"ok": true}`` (received) or ``{"abort": reason}``
(it gave up: the room fails).
``output_ids`` is the whole output the prefill worker's model state leads to (the simulated model's
plan): the decode worker writes it instead of planning the prompt again, as a real decode worker
continues from the transferred state instead of reading the prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

__all__ = [
    "DEFAULT_BOOTSTRAP_PORT",
    "BootstrapServer",
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

    def __post_init__(self) -> None:
        if self.mode not in DISAGG_MODES:
            raise ValueError(f"--disaggregation-mode must be one of {DISAGG_MODES}, got {self.mode!r}")
        if self.kv_bytes_per_token < _ID_BYTES:
            raise ValueError(f"--kv-bytes-per-token must be >= {_ID_BYTES}")
        if self.transfer_bandwidth_mbps < 0:
            raise ValueError("--transfer-bandwidth-mbps must be >= 0")

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
    ids: Sequence[int] = ()
    cached_tokens: int = 0
    first_token: int = 0
    plan: Sequence[int] = ()
    #: set once the KV is held (prefill done)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    #: None once a decode worker received the KV, else why the room failed
    outcome: asyncio.Future[KvTransferError | None] | None = None
    failure: KvTransferError | None = None


class BootstrapServer:
    """A prefill worker's bootstrap port: open rooms, hold their KV, hand it to decode workers."""

    def __init__(self, settings: DisaggSettings) -> None:
        self.settings = settings
        self._rooms: dict[int, _Room] = {}
        self._cancelled: OrderedDict[int, str] = OrderedDict()
        self._server: asyncio.AbstractServer | None = None
        self.port = settings.bootstrap_port
        #: counters for /sim/stats
        self.bytes_sent = 0
        self.transfers = 0
        self.failed_rooms = 0
        #: decode connections waiting on the bootstrap port for a room not ready yet
        self.waiting_decodes = 0

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
        entry = _Room(rid, outcome=asyncio.get_running_loop().create_future())
        self._rooms[room] = entry
        return entry

    def publish(
        self, room: int, ids: Sequence[int], cached_tokens: int, first_token: int, plan: Sequence[int]
    ) -> None:
        """The room's prompt is prefilled: its KV (and the output it leads to) is held for a decode
        worker to fetch."""
        entry = self._rooms.get(room)
        if entry is None:
            return
        entry.ids, entry.cached_tokens, entry.first_token = ids, cached_tokens, first_token
        entry.plan = plan
        entry.ready.set()

    async def handed_over(self, room: int) -> KvTransferError | None:
        """Wait until a decode worker received the room's KV (None) or the room failed (why): no
        decode came for it within ``bootstrap_timeout_s`` of now, or the transfer was cut."""
        entry = self._rooms[room]
        assert entry.outcome is not None
        started = time.monotonic()
        try:
            return await asyncio.wait_for(asyncio.shield(entry.outcome), self.settings.bootstrap_timeout_s)
        except TimeoutError:
            elapsed = time.monotonic() - started
            reason = f"Request {room} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping"
            error = KvTransferError(room, reason, "handshake")
            self._fail(room, error)
            return error

    def close(self, room: int) -> None:
        """The request ended: forget the room and its KV."""
        entry = self._rooms.pop(room, None)
        if entry is not None and entry.outcome is not None and not entry.outcome.done():
            entry.outcome.set_result(KvTransferError(room, ABORTED))

    def abort(self, rid: str) -> bool:
        """``/abort_request``: fail the room of request ``rid`` (its waiting decode is told)."""
        for room, entry in self._rooms.items():
            if entry.rid == rid:
                self._fail(room, KvTransferError(room, ABORTED))
                return True
        return False

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

    def stats(self) -> dict[str, int]:
        return {
            "pd_rooms_open": len(self._rooms),
            "pd_transfers_sent": self.transfers,
            "pd_bytes_sent": self.bytes_sent,
            "pd_rooms_failed": self.failed_rooms,
        }

    # ------------------------------------------------------------------ the bootstrap port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        room: int | None = None
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
            entry = await self._wait_for_room(room, reader)
            if entry is None:
                return
            if entry.failure is not None:
                await _send(writer, {"ok": False, "reason": entry.failure.reason})
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
            answer = await _receive(reader)
            if answer.get("ok") is True:
                self.transfers += 1
                if entry.outcome is not None and not entry.outcome.done():
                    entry.outcome.set_result(None)
            else:
                self._cancel(room, str(answer.get("abort") or ABORTED))
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError, TypeError):
            if room is not None and room in self._rooms and self._rooms[room].ready.is_set():
                # the decode worker went away mid-transfer
                self._fail(room, KvTransferError(room, "Lost connection with decode instance"))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _wait_for_room(self, room: int, reader: asyncio.StreamReader) -> _Room | None:
        """The room once it is ready; while waiting, a message from the decode worker is its abort
        (None then). The decode worker bounds the wait (its waiting timeout), not this side."""
        told = asyncio.ensure_future(_receive(reader))
        self.waiting_decodes += 1
        try:
            while True:
                entry = self._rooms.get(room)
                if entry is not None and entry.ready.is_set():
                    return entry
                # not open yet (the decode leg often arrives first) or not prefilled yet
                ready = asyncio.ensure_future(entry.ready.wait() if entry else asyncio.sleep(0.005))
                done, _ = await asyncio.wait({told, ready}, return_when=asyncio.FIRST_COMPLETED)
                if told in done:
                    ready.cancel()
                    message = told.result() if told.exception() is None else {}
                    self._cancel(room, str(message.get("abort") or ABORTED))
                    return None
        finally:
            self.waiting_decodes -= 1
            told.cancel()
            # let the watch finish before anything else reads this connection: a StreamReader takes
            # one reader at a time, and the cancelled watch holds it until its task runs again
            await asyncio.wait({told})

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
) -> KvArrival:
    """Receive ``room``'s KV from the prefill worker at ``host:port`` (see the module docstring).

    Raises :class:`KvTransferError`: "handshake" when the bootstrap port cannot be reached within
    ``handshake_timeout_s``; "transfer" when the room does not arrive within ``waiting_timeout_s``
    of connecting, the prefill worker reports it failed, or its KV is not this prompt's;
    ``prefill_dp_rank`` (the request's ``disagg_prefill_dp_rank``) names the prefill worker's DP rank
    holding the room, and a rank it does not have fails the handshake. Cancelling
    the call (an ``/abort_request``) tells the prefill worker the room is given up.
    """
    reader, writer = await _connect(host, port, room, settings.handshake_timeout_s)
    started = time.monotonic()
    received = False
    try:
        await _send(writer, {"room": room, "rid": rid, "prefill_dp_rank": prefill_dp_rank})
        try:
            header = await asyncio.wait_for(_receive(reader), settings.waiting_timeout_s)
        except TimeoutError:
            elapsed = time.monotonic() - started
            raise KvTransferError(
                room, f"Request {room} timed out after {elapsed:.1f}s in KVPoll.WaitingForInput"
            ) from None
        if header.get("ok") is not True:
            received = True  # the prefill side failed the room itself: nothing to tell it
            stage = "handshake" if header.get("stage") == "handshake" else "transfer"
            raise KvTransferError(room, str(header.get("reason") or ABORTED), stage)
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
        if not received:
            with contextlib.suppress(Exception):
                await _send(writer, {"abort": ABORTED})
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)


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
