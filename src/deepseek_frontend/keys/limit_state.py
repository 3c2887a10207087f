"""Where the rate limiter's per-tenant state lives and how it is locked.

Per tenant the limiter keeps a :class:`TenantRecord`: the requests and tokens buckets (level, the
time it was last brought up to date, the capacity it was computed with) and one in-flight request
count per frontend process. :class:`LocalLimitState` keeps the records in a dict (one process, no
lock: the event loop's thread only). :class:`SharedLimitState` keeps them in an anonymous shared
mmap that the supervisor creates before it forks the frontend processes, so every child reads and
writes the same buckets:

* a tenant's slot is found by hashing its name (open addressing, linear probing); a slot, once
  claimed, keeps its name for the life of the mmap (a tenant removed by a reload leaves its slot);
* every read-modify-write of a record holds a POSIX record lock (``fcntl.lockf``) on one byte of a
  temporary file opened in :meth:`SharedLimitState.create` and unlinked at once -- byte 0 guards
  claiming slots, byte ``1 + slot`` a slot's record. Record locks belong to the process: forked
  siblings exclude each other, and the kernel releases a lock when its holder dies, even by
  SIGKILL, so a dying process cannot leave the others waiting. A thread lock beside it excludes
  threads of one process, which a record lock does not;
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

__all__ = ["BucketState", "LocalLimitState", "SharedLimitState", "TenantRecord"]


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


@dataclass
class TenantRecord:
    requests: BucketState = field(default_factory=BucketState)
    tokens: BucketState = field(default_factory=BucketState)
    #: requests in flight, by process index
    in_flight: list[int] = field(default_factory=list)

    @property
    def in_flight_total(self) -> int:
        return sum(self.in_flight)


class LocalLimitState:
    """The records in process memory, for a single frontend process (no lock)."""

    processes = 1

    def __init__(self) -> None:
        self._records: dict[str, TenantRecord] = {}

    @contextmanager
    def record(self, name: str) -> Iterator[TenantRecord]:
        record = self._records.get(name)
        if record is None:
            record = self._records[name] = TenantRecord(in_flight=[0])
        yield record

    def reset_process(self, index: int) -> None:
        for record in self._records.values():
            record.in_flight[index] = 0

    def in_flight(self, name: str) -> int:
        with self.record(name) as record:
            return record.in_flight_total


#: a slot: used flag, name digest, then requests and tokens buckets (level, stamp, capacity)
_SLOT_HEAD = struct.Struct("<Q16s6d")


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
        #: slot index by tenant name, in this process (a claimed slot never changes its name)
        self._slot_of: dict[str, int] = {}
        self._thread_lock = threading.Lock()
        self._owner_pid = os.getpid()

    @classmethod
    def create(cls, slots: int = 1024, processes: int = 1) -> SharedLimitState:
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
    def record(self, name: str) -> Iterator[TenantRecord]:
        """The tenant's record, locked across processes; changes are written back on exit."""
        slot = self._slot(name)
        offset = slot * self._slot_size
        with self._locked(1 + slot):
            head = _SLOT_HEAD.unpack_from(self._memory, offset)
            record = TenantRecord(
                requests=BucketState(*head[2:5]),
                tokens=BucketState(*head[5:8]),
                in_flight=list(self._counts.unpack_from(self._memory, offset + _SLOT_HEAD.size)),
            )
            yield record
            r, t = record.requests, record.tokens
            _SLOT_HEAD.pack_into(
                self._memory, offset, 1, head[1], r.level, r.stamp, r.capacity, t.level, t.stamp, t.capacity
            )
            self._counts.pack_into(self._memory, offset + _SLOT_HEAD.size, *record.in_flight)

    def in_flight(self, name: str) -> int:
        """Requests of tenant ``name`` in flight in all processes."""
        with self.record(name) as record:
            return record.in_flight_total

    def reset_process(self, index: int) -> None:
        """Zero process ``index``'s in-flight counts in every slot (its requests died with it)."""
        if not 0 <= index < self.processes:
            raise ValueError(f"process index {index} out of range 0..{self.processes - 1}")
        with self._locked(0, length=0):  # the whole file: every slot at once
            for slot in range(self.slots):
                offset = slot * self._slot_size
                if _SLOT_HEAD.unpack_from(self._memory, offset)[0]:
                    struct.pack_into("<q", self._memory, offset + _SLOT_HEAD.size + 8 * index, 0)

    def _slot(self, name: str) -> int:
        slot = self._slot_of.get(name)
        if slot is not None:
            return slot
        digest = hashlib.sha256(name.encode()).digest()[:16]
        start = int.from_bytes(digest[:8], "little") % self.slots
        with self._locked(0):
            for probe in range(self.slots):
                slot = (start + probe) % self.slots
                offset = slot * self._slot_size
                used, slot_name = _SLOT_HEAD.unpack_from(self._memory, offset)[:2]
                if not used:
                    _SLOT_HEAD.pack_into(self._memory, offset, 1, digest, 0, 0, 0, 0, 0, 0)
                    break
                if slot_name == digest:
                    break
            else:
                raise RuntimeError(f"rate limit state is full ({self.slots} tenants)")
        self._slot_of[name] = slot
        return slot

    @contextmanager
    def _locked(self, start: int, length: int = 1) -> Iterator[None]:
        if os.getpid() != self._owner_pid:
            # a thread lock copied by fork may have been held by a thread the child does not have
            self._thread_lock = threading.Lock()
            self._owner_pid = os.getpid()
        with self._thread_lock:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_EX, length, start)
            try:
                yield
            finally:
                fcntl.lockf(self._lock_fd, fcntl.LOCK_UN, length, start)
