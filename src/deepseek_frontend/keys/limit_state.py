"""Where the rate limiter's per-tenant state lives and how it is locked.

Per tenant the limiter keeps a :class:`TenantRecord`: the requests and tokens buckets (level, the
time it was last brought up to date, the capacity it was computed with) and one in-flight request
count per frontend process. :class:`LocalLimitState` keeps the records in a dict (one process, no
lock: the event loop's thread only). :class:`SharedLimitState` keeps them in an anonymous shared
mmap that the supervisor creates before it forks the frontend processes, so every child reads and
writes the same buckets.

A record is only worth keeping while it differs from a new one: a tenant whose requests and
tokens buckets are full again and who has nothing in flight anywhere is *idle* (:meth:`TenantRecord.idle`)
-- forgetting its record loses nothing, since a tenant seen for the first time starts with full
buckets. Both stores drop records on that ground, and when a reload removes a key
(:meth:`forget`, which drops a removed key's record once nothing of it is in flight).

The shared table (:data:`DEFAULT_SLOTS` slots, fixed when the mmap is made):

* a tenant's slot is found by hashing its name (open addressing, linear probing); a slot is empty,
  used, or freed (a tombstone: a probe goes on past it, a claim may reuse it). Each process caches
  the slot of a name and checks, under the slot's lock, that the slot still holds that name -- a
  slot may have been freed or taken over by another process since;
* a new tenant takes the first free slot on its probe path; when there is none, the least recently
  used *idle* slot is taken over (its tenant comes back with full buckets, as it would anyway);
* when every slot holds a tenant that is not idle (more tenants with requests in flight, or with
  buckets still refilling, than slots), the new tenant's limits are kept in this process's memory
  (:attr:`SharedLimitState.overflows` counts it, and a slot is tried again every
  :data:`OVERFLOW_RETRY_S`): they then hold per process -- each of N processes admits up to the
  limit -- instead of across processes, until a slot is free. Never an error;
* every read-modify-write of a record holds a POSIX record lock (``fcntl.lockf``) on one byte of a
  temporary file opened in :meth:`SharedLimitState.create` and unlinked at once -- byte 0 guards
  claiming and freeing slots, byte ``1 + slot`` a slot's record, always taken in that order (byte 0
  first). Record locks belong to the process: forked siblings exclude each other, and the kernel
  releases a lock when its holder dies, even by SIGKILL, so a dying process cannot leave the others
  waiting. A re-entrant thread lock beside it excludes threads of one process, which a record lock
  does not;
* the clock is ``time.monotonic`` (CLOCK_MONOTONIC is one clock for every process on the host).
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_SLOTS",
    "BucketState",
    "LimitStateStats",
    "LocalLimitState",
    "SharedLimitState",
    "TenantRecord",
]

#: slots of the shared table: tenants whose limits can be shared at once (idle ones are replaced)
DEFAULT_SLOTS = 4096
#: seconds a tenant kept in process memory (the shared table full) waits before trying for a slot again
OVERFLOW_RETRY_S = 1.0
#: the process-memory store sweeps idle records once it holds at least this many
LOCAL_SWEEP_MIN = 1024


@dataclass
class BucketState:
    """One token bucket: ``level`` at time ``stamp``, last computed with ``capacity`` (0: never)."""

    level: float = 0.0
    stamp: float = 0.0
    capacity: float = 0.0

    def refill(self, capacity: float, now: float) -> None:
        """Bring the level up to ``now`` at ``capacity`` per minute, at most ``capacity``.

        A bucket seen for the first time starts full; when the capacity changed (a reload) the
        level is clamped to the new one.
        """
        if self.capacity <= 0:
            self.level = capacity
        else:
            elapsed = max(0.0, now - self.stamp)
            self.level = min(capacity, self.level + elapsed * capacity / 60.0)
        self.capacity = capacity
        self.stamp = max(self.stamp, now)

    def full_at(self, now: float) -> bool:
        """Whether the bucket is full at ``now`` (or was never used): it holds nothing a new one would not."""
        if self.capacity <= 0:
            return True
        return self.level + max(0.0, now - self.stamp) * self.capacity / 60.0 >= self.capacity


@dataclass
class TenantRecord:
    requests: BucketState = field(default_factory=BucketState)
    tokens: BucketState = field(default_factory=BucketState)
    #: requests in flight, by process index
    in_flight: list[int] = field(default_factory=list)

    @property
    def in_flight_total(self) -> int:
        return sum(self.in_flight)

    def idle(self, now: float) -> bool:
        """Nothing in flight in any process and both buckets full: the record equals a new one."""
        return not any(self.in_flight) and self.requests.full_at(now) and self.tokens.full_at(now)


@dataclass(frozen=True)
class LimitStateStats:
    """What ``/metrics`` shows of a store: its slots (0: no fixed table), those in use, and this
    process's counts of records dropped (idle, or their key removed) and of tenants kept in process
    memory because the shared table was full."""

    slots: int
    used: int
    dropped: int
    overflows: int


class LocalLimitState:
    """The records in process memory, for a single frontend process (no lock).

    Idle records are swept once the dict has grown to twice its size after the last sweep (at
    least :data:`LOCAL_SWEEP_MIN`), so keys that come and go do not grow it for ever.
    """

    processes = 1

    def __init__(self) -> None:
        self._records: dict[str, TenantRecord] = {}
        self._sweep_at = LOCAL_SWEEP_MIN
        self.dropped = 0

    @contextmanager
    def record(self, name: str, now: float) -> Iterator[TenantRecord]:
        record = self._records.get(name)
        if record is None:
            if len(self._records) >= self._sweep_at:
                self._sweep(now)
            record = self._records[name] = TenantRecord(in_flight=[0])
        yield record

    def forget(self, name: str, now: float) -> bool:
        """Drop ``name``'s record (its key was removed) unless requests of it are in flight."""
        record = self._records.get(name)
        if record is None or any(record.in_flight):
            return False
        del self._records[name]
        self.dropped += 1
        return True

    def reset_process(self, index: int) -> None:
        for record in self._records.values():
            record.in_flight[index] = 0

    def in_flight(self, name: str, now: float) -> int:
        record = self._records.get(name)
        return record.in_flight_total if record is not None else 0

    def stats(self) -> LimitStateStats:
        return LimitStateStats(0, len(self._records), self.dropped, 0)

    def _sweep(self, now: float) -> None:
        idle = [name for name, record in self._records.items() if record.idle(now)]
        for name in idle:
            del self._records[name]
        self.dropped += len(idle)
        self._sweep_at = max(LOCAL_SWEEP_MIN, 2 * len(self._records))


#: a slot's head: state, name digest, requests and tokens buckets (level, stamp, capacity), last use
_SLOT_HEAD = struct.Struct("<Q16s7d")
_EMPTY, _USED, _FREED = 0, 1, 2


def _digest(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()[:16]


class SharedLimitState:
    """The records in an anonymous ``MAP_SHARED`` mmap, locked across processes.

    Create it with :meth:`create` in the supervisor before forking; every child then passes it to
    its :class:`~deepseek_frontend.keys.rate_limits.RateLimiter` with its own process index. A child
    forked again in place of a dead one calls :meth:`reset_process` with its index first: the
    requests its predecessor had in flight are no longer in flight.
    """

    def __init__(self, memory: mmap.mmap, lock_fd: int, slots: int, processes: int) -> None:
        self._memory = memory
        self._lock_fd = lock_fd
        self.slots = slots
        self.processes = processes
        self._counts = struct.Struct(f"<{processes}q")
        self._slot_size = _SLOT_HEAD.size + self._counts.size
        #: slot index by tenant name, in this process (checked under the slot's lock at each use)
        self._slot_of: dict[str, int] = {}
        #: tenants kept in this process's memory while the table is full, and when to try again
        self._overflow: dict[str, TenantRecord] = {}
        self._retry_at: dict[str, float] = {}
        self._overflow_sweep_at = LOCAL_SWEEP_MIN
        self._thread_lock = threading.RLock()
        self._owner_pid = os.getpid()
        #: this process's counts: records it dropped (taken over idle, or forgotten), tenants it
        #: had to keep in its own memory (the table full)
        self.dropped = 0
        self.overflows = 0

    @classmethod
    def create(cls, slots: int = DEFAULT_SLOTS, processes: int = 1) -> SharedLimitState:
        if slots < 1 or processes < 1:
            raise ValueError("slots and processes must be at least 1")
        slot_size = _SLOT_HEAD.size + 8 * processes
        memory = mmap.mmap(-1, slots * slot_size, flags=mmap.MAP_SHARED)
        lock_fd, lock_path = tempfile.mkstemp(prefix="deepseek-frontend-limits-")
        os.unlink(lock_path)  # only the open descriptor, inherited by the forked children, is needed
        return cls(memory, lock_fd, slots, processes)

    def close(self) -> None:
        self._memory.close()
        os.close(self._lock_fd)

    @contextmanager
    def record(self, name: str, now: float) -> Iterator[TenantRecord]:
        """The tenant's record, locked across processes; changes are written back on exit.

        When the table has no slot for it (every one holds a tenant that is not idle), the record
        is this process's own (see the module docstring)."""
        digest = _digest(name)
        slot = self._locate(name, digest, now)
        while slot is not None:
            offset = slot * self._slot_size
            with self._locked(1 + slot):
                head = _SLOT_HEAD.unpack_from(self._memory, offset)
                if head[0] == _USED and head[1] == digest:
                    record = self._read(offset, head)
                    yield record
                    self._write(offset, digest, record, now)
                    return
            # freed or taken over by another process since this one cached it: look again
            self._slot_of.pop(name, None)
            slot = self._locate(name, digest, now)
        yield self._overflow[name]

    def in_flight(self, name: str, now: float) -> int:
        """Requests of tenant ``name`` in flight in all processes."""
        with self.record(name, now) as record:
            return record.in_flight_total

    def forget(self, name: str, now: float) -> bool:
        """Free ``name``'s slot (its key was removed) unless requests of it are in flight somewhere;
        whether it was freed. A slot still busy is taken over once idle, like any other."""
        self._slot_of.pop(name, None)
        self._retry_at.pop(name, None)
        kept = self._overflow.pop(name, None)
        digest = _digest(name)
        with self._locked(0):
            slot = self._find(digest)
            if slot is None:
                return kept is not None
            offset = slot * self._slot_size
            with self._locked(1 + slot):
                if any(self._counts.unpack_from(self._memory, offset + _SLOT_HEAD.size)):
                    return False
                self._clear(offset, _FREED)
        self.dropped += 1
        return True

    def reset_process(self, index: int) -> None:
        """Zero process ``index``'s in-flight counts in every slot (its requests died with it)."""
        if not 0 <= index < self.processes:
            raise ValueError(f"process index {index} out of range 0..{self.processes - 1}")
        with self._locked(0, length=0):  # the whole file: every slot at once
            for slot in range(self.slots):
                offset = slot * self._slot_size
                if _SLOT_HEAD.unpack_from(self._memory, offset)[0] == _USED:
                    struct.pack_into("<q", self._memory, offset + _SLOT_HEAD.size + 8 * index, 0)

    def stats(self) -> LimitStateStats:
        """Slots in use (read without the lock: a gauge), and this process's counts."""
        used = sum(
            1
            for slot in range(self.slots)
            if _SLOT_HEAD.unpack_from(self._memory, slot * self._slot_size)[0] == _USED
        )
        return LimitStateStats(self.slots, used, self.dropped, self.overflows)

    # -- slots ---------------------------------------------------------------------------------

    def _locate(self, name: str, digest: bytes, now: float) -> int | None:
        """``name``'s slot (claimed if it has none), or None: kept in this process's memory."""
        slot = self._slot_of.get(name)
        if slot is not None:
            return slot
        kept = self._overflow.get(name)
        if kept is not None and now < self._retry_at.get(name, 0.0):
            return None
        with self._locked(0):
            slot = self._find(digest)
            if slot is None:
                slot = self._claim(digest, now, kept)
        if slot is None:
            if kept is None:
                if len(self._overflow) >= self._overflow_sweep_at:
                    self._sweep_overflow(now)
                self._overflow[name] = TenantRecord(in_flight=[0] * self.processes)
                self.overflows += 1
            self._retry_at[name] = now + OVERFLOW_RETRY_S
            return None
        if kept is not None:  # its buckets moved into the slot
            del self._overflow[name]
            self._retry_at.pop(name, None)
        if len(self._slot_of) >= 4 * self.slots:
            self._slot_of.clear()  # names of long-gone tenants: found again on their next use
        self._slot_of[name] = slot
        return slot

    def _sweep_overflow(self, now: float) -> None:
        idle = [name for name, record in self._overflow.items() if record.idle(now)]
        for name in idle:
            del self._overflow[name]
            self._retry_at.pop(name, None)
        self._overflow_sweep_at = max(LOCAL_SWEEP_MIN, 2 * len(self._overflow))

    def _find(self, digest: bytes) -> int | None:
        """The slot holding ``digest`` (byte 0 locked)."""
        start = int.from_bytes(digest[:8], "little") % self.slots
        for probe in range(self.slots):
            slot = (start + probe) % self.slots
            state, held = _SLOT_HEAD.unpack_from(self._memory, slot * self._slot_size)[:2]
            if state == _EMPTY:
                return None
            if state == _USED and held == digest:
                return slot
        return None

    def _claim(self, digest: bytes, now: float, initial: TenantRecord | None) -> int | None:
        """A slot for ``digest``, which holds none (byte 0 locked): the first empty or freed one on
        its probe path, else the least recently used idle one; None when every slot is busy."""
        start = int.from_bytes(digest[:8], "little") % self.slots
        for probe in range(self.slots):
            slot = (start + probe) % self.slots
            if _SLOT_HEAD.unpack_from(self._memory, slot * self._slot_size)[0] != _USED:
                with self._locked(1 + slot):
                    self._take(slot, digest, now, initial)
                return slot
        # every slot used: take over the least recently used idle one. Once the table is full no
        # slot is ever empty again (freed ones are tombstones), so a probe for the new tenant goes
        # round the whole table and finds it wherever it is.
        by_age = sorted(
            range(self.slots), key=lambda s: _SLOT_HEAD.unpack_from(self._memory, s * self._slot_size)[8]
        )
        for slot in by_age:
            offset = slot * self._slot_size
            if not self._read(offset, _SLOT_HEAD.unpack_from(self._memory, offset)).idle(now):
                continue  # read without its lock: only to skip the busy ones cheaply
            with self._locked(1 + slot):
                if self._read(offset, _SLOT_HEAD.unpack_from(self._memory, offset)).idle(now):
                    self._take(slot, digest, now, initial)
                    self.dropped += 1
                    return slot
        return None

    def _take(self, slot: int, digest: bytes, now: float, initial: TenantRecord | None) -> None:
        offset = slot * self._slot_size
        self._clear(offset, _USED, digest)
        record = initial if initial is not None else TenantRecord(in_flight=[0] * self.processes)
        self._write(offset, digest, record, now)

    # -- records -------------------------------------------------------------------------------

    def _read(self, offset: int, head: tuple) -> TenantRecord:
        return TenantRecord(
            requests=BucketState(*head[2:5]),
            tokens=BucketState(*head[5:8]),
            in_flight=list(self._counts.unpack_from(self._memory, offset + _SLOT_HEAD.size)),
        )

    def _write(self, offset: int, digest: bytes, record: TenantRecord, now: float) -> None:
        r, t = record.requests, record.tokens
        _SLOT_HEAD.pack_into(
            self._memory,
            offset,
            _USED,
            digest,
            r.level,
            r.stamp,
            r.capacity,
            t.level,
            t.stamp,
            t.capacity,
            now,
        )
        self._counts.pack_into(self._memory, offset + _SLOT_HEAD.size, *record.in_flight)

    def _clear(self, offset: int, state: int, digest: bytes = b"") -> None:
        _SLOT_HEAD.pack_into(self._memory, offset, state, digest, 0, 0, 0, 0, 0, 0, 0)
        self._counts.pack_into(self._memory, offset + _SLOT_HEAD.size, *([0] * self.processes))

    @contextmanager
    def _locked(self, start: int, length: int = 1) -> Iterator[None]:
        if os.getpid() != self._owner_pid:
            # a thread lock copied by fork may have been held by a thread the child does not have
            self._thread_lock = threading.RLock()
            self._owner_pid = os.getpid()
        with self._thread_lock:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_EX, length, start)
            try:
                yield
            finally:
                fcntl.lockf(self._lock_fd, fcntl.LOCK_UN, length, start)
