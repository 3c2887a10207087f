"""``serve --workers N``: N frontend processes on one listening socket, under a supervisor.

How it works (Linux / POSIX, ``os.fork``):

* The supervisor binds the port, then forks N children *before* the app is built (no threads exist
  yet, and each child loads its own tokenizer and engine connections). Where the OS has
  ``SO_REUSEPORT`` (Linux), each child listens on the port with its own socket and accept queue
  and the kernel spreads new connections evenly over them by a hash of the connection's
  addresses; a shared accept queue (the fallback: every child accepts on the inherited socket)
  gives most connections of a burst to whichever process wakes first -- 2:1 measured with two
  processes. A connection (and so an HTTP keep-alive client) stays on one process.
* Signals: the children run in their own process group, so a terminal's Ctrl-C reaches only the
  supervisor, which forwards one SIGTERM to each child (uvicorn then drains: a graceful stop, not
  the forced exit a second SIGINT would mean). SIGTERM is forwarded the same way, and SIGHUP as
  SIGHUP (each child re-reads the configuration, server/reload.py; one that arrives while a child
  starts is counted and reloaded once it serves, server/hangups.py). Each child also
  asks the kernel for SIGTERM if the supervisor dies (``PR_SET_PDEATHSIG``).
* A child that exits on its own (a crash, an OOM kill) is forked again under the same index while
  the others keep serving. Restarts back off (:func:`restart_delay`: 0.5 s doubling to 30 s for a
  child that keeps dying within :data:`STABLE_S` of its start), so one that fails at start-up costs
  a fork every 30 s, not a busy loop. Before any child has served, though, a child that cannot
  start as configured (``serve``'s start-up failure, server/startup.py) stops the whole group: the
  supervisor prints the child's one line once and exits 2, as one process would. Restarts are
  counted in ``/metrics`` (``deepseek_frontend_process_restarts_total``), through a shared memory
  page the supervisor writes and the children read.
* The port never stops accepting: the supervisor makes every child's listening socket before
  forking it and keeps its own copy open, so a dead child's socket stays in the kernel's
  ``SO_REUSEPORT`` group with its accept queue (closing it would reset the connections queued
  there). Every child inherits every socket and watches its siblings' too: while a sibling is not
  accepting (dead, or not started yet) the others accept on its socket whenever connections wait
  there (:meth:`ProcessSlot.admits_from`), and its replacement takes it back once it serves. So
  connections the kernel gives a dead child's socket wait there for a moment, none refused or
  reset; only those the dead child had already accepted are lost with it.
* Connections are balanced over the processes. The kernel's hash splits a burst unevenly (138 and
  118 of 256 connections, measured), and the busier process's first tokens then wait longer
  (docs/performance.md, "Connections balanced over the processes"). Each child publishes how many
  connections it holds in the shared page. A child holding too many more than an accepting
  sibling (:func:`unbalanced`) leaves its new connections queued
  (:meth:`ProcessSlot.admits_own`), and that lighter sibling accepts them from its socket
  (:meth:`ProcessSlot.admits_from`) at its next event-loop iteration. A sibling whose loop has
  not turned for :data:`STALE_S` (a heartbeat every :data:`HEARTBEAT_S`: stopped, or stuck) is
  left nothing, and a process takes the connections it left queued for ``PATIENCE_S``
  (server/acceptor.py) itself: under a burst a busy sibling's iteration can take that long.
* ``/metrics`` covers every process: each child also serves the app on a private Unix socket
  in a 0700 temporary directory; the process answering a scrape fetches its siblings' own
  metrics (``/metrics?scope=process``) through those sockets and returns all series with a
  ``process="<index>"`` label (``sum without (process)`` in PromQL gives the pod's figure; the engine
  workers' series keep their own ``worker`` label, the worker's URL).

What is per process: the tokenizer's prefix and run caches (a conversation's follow-up that
lands on another process tokenizes its prompt cold once there), the in-process simulated
engine, admission limits (``--max-concurrent-requests`` etc. apply per process) and health.
What is shared: the API keys' limits (requests and tokens per minute, concurrent requests), kept
in a shared memory segment the supervisor makes before forking (keys/limit_state.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import mmap
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import hangups
from .startup import STARTUP_FAILED

__all__ = ["ProcessSlot", "fork_processes", "merge_expositions", "restart_delay", "unbalanced"]

log = logging.getLogger("deepseek_frontend.serve")

#: seconds a sibling has to answer a metrics scrape before its series are left out
SIBLING_METRICS_TIMEOUT_S = 2.0
#: seconds the supervisor waits for children to drain after forwarding a stop signal
STOP_GRACE_S = 30.0
_PR_SET_PDEATHSIG = 1
#: first delay before a dead child is forked again; it doubles while the child keeps dying young
RESTART_MIN_S = 0.5
#: the longest delay between two restarts of one child
RESTART_MAX_S = 30.0
#: seconds a child must have run for its next death to restart it after RESTART_MIN_S again
STABLE_S = 30.0
#: connections a process may hold past an accepting sibling before it leaves new ones to it...
BALANCE_MARGIN = 2
#: ...or this fraction (1/N) of the sibling's connections, when that is more
BALANCE_SHARE = 16
#: seconds between a child's heartbeats in the shared page (its event loop turns)
HEARTBEAT_S = 0.1
#: seconds without a heartbeat after which a sibling is not left connections (stopped, or stuck)
STALE_S = 0.5
_COUNTER = struct.Struct("<Q")


def _read(shared: mmap.mmap, field_index: int) -> int:
    return int(_COUNTER.unpack_from(shared, field_index * _COUNTER.size)[0])


def _write(shared: mmap.mmap, field_index: int, value: int) -> None:
    _COUNTER.pack_into(shared, field_index * _COUNTER.size, value)


def unbalanced(heavier: int, lighter: int) -> bool:
    """Whether a process holding ``heavier`` connections leaves new ones to one holding ``lighter``:
    it holds :data:`BALANCE_MARGIN` more, and a :data:`BALANCE_SHARE`-th more. The margin grows
    with the load: with 2 alone, two busy processes waited on each other all through a burst of
    1,024 connections (47-68K tokens/s, against 72-74K with the kernel's split as it fell)."""
    return heavier >= lighter + max(BALANCE_MARGIN, lighter // BALANCE_SHARE)


def restart_delay(quick_deaths: int) -> float:
    """Seconds to wait before forking a child again after ``quick_deaths`` deaths in a row, each
    within :data:`STABLE_S` of its start (1 for the first): ``RESTART_MIN_S`` doubling, at most
    ``RESTART_MAX_S``."""
    return min(RESTART_MAX_S, RESTART_MIN_S * 2.0 ** max(0, min(quick_deaths - 1, 16)))


@dataclass
class ProcessSlot:
    """What a child knows about its process group: its index, the count, the sibling sockets."""

    index: int
    count: int
    directory: str
    #: the TCP socket this child accepts on: its own SO_REUSEPORT one, or the inherited one
    listening: socket.socket | None = None
    #: shared with the supervisor and the siblings (:class:`_Group`): restarts, accepting flags,
    #: connection counts and heartbeats
    shared: mmap.mmap | None = None
    #: the other children's listening sockets, by index (empty when all share one socket)
    siblings: dict[int, socket.socket] = field(default_factory=dict)
    #: the private Unix socket this child serves on (next to the shared TCP socket)
    private_socket: socket.socket | None = None
    _clients: dict[int, Any] = field(default_factory=dict)
    #: the siblings whose sockets this child accepts on because they are down (logged once each)
    _covering: set[int] = field(default_factory=set)
    #: client connections of the public port this child holds
    _held: int = 0

    def restart_counts(self) -> dict[str, int]:
        """How often the supervisor forked each child again, by index (as the ``process`` label)."""
        if self.shared is None:
            return {}
        return {str(i): _read(self.shared, i) for i in range(self.count)}

    def mark_accepting(self) -> None:
        """Tell the siblings this child accepts on its socket (they stop accepting on it), with its
        count of connections and a first heartbeat."""
        if self.shared is not None:
            self.publish_connections(self._held)
            self.beat()
            _write(self.shared, self.count + self.index, 1)

    def count_connection(self, change: int) -> None:
        """A client connection of the public port opened (+1) or closed (-1): tell the siblings how
        many this child holds."""
        self._held += change
        self.publish_connections(self._held)

    def publish_connections(self, count: int) -> None:
        """Tell the siblings this child holds ``count`` client connections."""
        if self.shared is not None:
            _write(self.shared, 2 * self.count + self.index, count)

    def _accepting(self, index: int) -> bool:
        return self.shared is not None and _read(self.shared, self.count + index) != 0

    def _connections(self, index: int) -> int:
        return _read(self.shared, 2 * self.count + index) if self.shared is not None else 0

    def beat(self) -> None:
        """Tell the siblings this child's event loop turns (called every :data:`HEARTBEAT_S`)."""
        if self.shared is not None:
            _write(self.shared, 3 * self.count + self.index, int(time.monotonic() * 1000))

    def _alive(self, index: int, now_ms: int) -> bool:
        """Whether sibling ``index`` accepts and its loop beat within :data:`STALE_S`."""
        assert self.shared is not None
        beat = _read(self.shared, 3 * self.count + index)
        return self._accepting(index) and now_ms - beat <= STALE_S * 1000

    def admits_own(self, accepting_now: int = 0) -> bool:
        """Whether this child takes the next connection from its own socket: not while it holds
        too many more connections (:func:`unbalanced`) than an accepting sibling whose loop turns
        (a heartbeat within :data:`STALE_S`), which takes it instead.

        ``accepting_now``: connections this child accepted since it last published its count.
        """
        if self.shared is None:
            return True
        mine = self._connections(self.index) + accepting_now
        now_ms = int(time.monotonic() * 1000)
        return not any(
            unbalanced(mine, self._connections(i))
            for i in range(self.count)
            if i != self.index and self._alive(i, now_ms)
        )

    def admits_from(self, index: int, accepting_now: int = 0) -> bool:
        """Whether this child takes the next connection from sibling ``index``'s socket: always while
        that sibling is not accepting (dead, or not started), else while the sibling holds too many
        more connections than this child (:func:`unbalanced`: it leaves them to this one)."""
        if self.shared is None:
            return False
        if not self._accepting(index):
            if index not in self._covering:
                self._covering.add(index)
                log.info("accepting for frontend process %d while it is down", index)
            return True
        self._covering.discard(index)
        return unbalanced(self._connections(index), self._connections(self.index) + accepting_now)

    def socket_path(self, index: int) -> str:
        return os.path.join(self.directory, f"worker-{index}.sock")

    def report_startup_failure(self, line: str) -> None:
        """Leave this child's start-up failure (one line) for the supervisor, which prints it once
        for the whole group, or logs it with the restart (:func:`_supervise`)."""
        with open(_failure_path(self.directory, self.index), "w", encoding="utf-8") as fh:
            fh.write(line)

    def bind_private(self) -> socket.socket:
        """Bind and listen on this child's private Unix socket."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = self.socket_path(self.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock.bind(path)
        sock.listen(64)
        self.private_socket = sock
        return sock

    async def sibling_metrics(self, own: bytes) -> bytes:
        """Every process's metrics, each series labelled ``process="<index>"`` (see module docstring).

        A sibling that does not answer within :data:`SIBLING_METRICS_TIMEOUT_S` is left out and
        counted in ``deepseek_frontend_metrics_workers_unreachable``.
        """
        import httpx

        async def fetch(index: int) -> bytes | None:
            client = self._clients.get(index)
            if client is None:
                transport = httpx.AsyncHTTPTransport(uds=self.socket_path(index))
                client = httpx.AsyncClient(transport=transport, timeout=SIBLING_METRICS_TIMEOUT_S)
                self._clients[index] = client
            try:
                # closed after the answer: an idle connection left open would count as a client of
                # the sibling's between scrapes (``http_connections_open``)
                response = await client.get(
                    "http://worker/metrics", params={"scope": "process"}, headers={"connection": "close"}
                )
            except httpx.HTTPError:
                return None
            return response.content if response.status_code == 200 else None

        others = [i for i in range(self.count) if i != self.index]
        answers = await asyncio.gather(*(fetch(i) for i in others))
        texts = {str(self.index): own.decode()}
        missing = 0
        for index, answer in zip(others, answers, strict=True):
            if answer is None:
                missing += 1
            else:
                texts[str(index)] = answer.decode()
        return merge_expositions(texts, unreachable=missing, restarts=self.restart_counts())


def merge_expositions(
    texts: Mapping[str, str], unreachable: int = 0, restarts: Mapping[str, int] | None = None
) -> bytes:
    """Prometheus text expositions of several processes -> one, each sample labelled ``process``.

    Families keep their type and help; samples of a family from every process are written
    together (the text format requires one block per family). ``unreachable`` is exported as
    the gauge ``deepseek_frontend_metrics_workers_unreachable``; ``restarts`` (per worker index) as
    the counter ``deepseek_frontend_process_restarts_total``.
    """
    from prometheus_client.metrics_core import Metric

    from deepseek_frontend.fleet.metrics import merge_labelled, render_families

    # "process", not "worker": the engine-worker series already carry worker=<URL>
    families = merge_labelled(({"process": worker}, text) for worker, text in texts.items())
    gauge = Metric(
        "deepseek_frontend_metrics_workers_unreachable",
        "frontend processes that did not answer this scrape (their series are missing)",
        "gauge",
    )
    gauge.add_sample("deepseek_frontend_metrics_workers_unreachable", {}, float(unreachable))
    families[gauge.name] = gauge
    if restarts is not None:
        counter = Metric(
            "deepseek_frontend_process_restarts",
            "times the supervisor forked a frontend process again after it died",
            "counter",
        )
        for worker, value in restarts.items():
            counter.add_sample("deepseek_frontend_process_restarts_total", {"process": worker}, float(value))
        families[counter.name] = counter
    return render_families(families.values())


def _failure_path(directory: str, index: int) -> str:
    return os.path.join(directory, f"startup-failure-{index}")


def _take_failure(directory: str, index: int) -> str | None:
    """The start-up failure child ``index`` left (:meth:`ProcessSlot.report_startup_failure`), once."""
    path = _failure_path(directory, index)
    try:
        with open(path, encoding="utf-8") as fh:
            line = fh.read().strip()
    except FileNotFoundError:
        return None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return line or None


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when the supervisor dies (no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _listeners(shared: socket.socket, count: int, backlog: int) -> list[socket.socket]:
    """Each child's listening socket: ``shared`` for the first, and when ``shared`` has SO_REUSEPORT
    a socket of its own on the same address for each other child; without it, ``shared`` for all."""
    reuse_port = getattr(socket, "SO_REUSEPORT", None)
    if reuse_port is None or not shared.getsockopt(socket.SOL_SOCKET, reuse_port):
        return [shared] * count
    listeners = [shared]
    for _ in range(count - 1):
        own = socket.socket(shared.family, socket.SOCK_STREAM)
        own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        own.setsockopt(socket.SOL_SOCKET, reuse_port, 1)
        own.bind(shared.getsockname())
        own.listen(backlog)
        own.set_inheritable(True)
        listeners.append(own)
    return listeners


@dataclass
class _Group:
    """The supervisor's view of its children (see module docstring)."""

    count: int
    directory: str
    listeners: list[socket.socket]
    #: ``count`` each of restart counters, accepting flags, connection counts and heartbeats (u64,
    #: the last in ms of the monotonic clock); MAP_SHARED across forks
    shared: mmap.mmap
    supervisor: int = field(default_factory=os.getpid)
    #: pid -> index of the running children
    running: dict[int, int] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)
    quick_deaths: dict[int, int] = field(default_factory=dict)
    #: index -> monotonic time its replacement is due
    due: dict[int, float] = field(default_factory=dict)

    def fork(self, index: int) -> ProcessSlot | None:
        """Fork child ``index``: its :class:`ProcessSlot` in the child, None in the supervisor."""
        pid = os.fork()
        if pid == 0:
            # the supervisor's signal forwarding must not run here; a SIGHUP before the child's
            # loop listens is counted, and reloaded once it serves (hangups.py)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            hangups.catch()
            os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the supervisor only
            _die_with_parent()
            if os.getppid() != self.supervisor:  # the supervisor died before prctl took effect
                os._exit(1)
            own = self.listeners[index]
            siblings = {i: s for i, s in enumerate(self.listeners) if s is not own}
            slot = ProcessSlot(index, self.count, self.directory, own, self.shared, siblings)
            slot.bind_private()
            return slot
        self.running[pid] = index
        self.started[index] = time.monotonic()
        return None

    def accepting(self) -> bool:
        """Whether a child has told its siblings it accepts (it started serving)."""
        return any(_read(self.shared, self.count + i) for i in range(self.count))

    def died(self, index: int, pid: int, code: int, why: str | None = None) -> None:
        """Schedule child ``index``'s replacement after :func:`restart_delay`; ``why``: the
        start-up failure it reported, if any."""
        young = time.monotonic() - self.started.get(index, 0.0) < STABLE_S
        self.quick_deaths[index] = self.quick_deaths.get(index, 0) + 1 if young else 1
        delay = restart_delay(self.quick_deaths[index])
        self.due[index] = time.monotonic() + delay
        _write(self.shared, self.count + index, 0)  # its siblings accept on its socket meanwhile
        log.error(
            "frontend process %d (pid %d) exited with %d%s: restarting it in %.1f s",
            index,
            pid,
            code,
            f" ({why})" if why else "",
            delay,
        )

    def hangup(self, _signum: int, _frame: Any) -> None:
        """Forward a SIGHUP to every running child: each re-reads the configuration itself
        (server/reload.py); a child being forked again reads it as it is when it starts."""
        for pid in list(self.running):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGHUP)

    def count_restart(self, index: int) -> None:
        _write(self.shared, index, _read(self.shared, index) + 1)

    def close(self) -> None:
        for sock in {id(s): s for s in self.listeners}.values():
            sock.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def fork_processes(count: int, listening: socket.socket, backlog: int = 2048) -> ProcessSlot | int:
    """Fork ``count`` children sharing ``listening``'s port; supervise them (see module docstring).

    Returns a :class:`ProcessSlot` in each child (which then builds its app and serves) -- also in
    a child forked again after one died -- and the exit status in the supervisor once every child
    has exited.
    """
    if not hasattr(os, "fork"):
        raise OSError("--workers needs os.fork (POSIX)")
    group = _Group(
        count,
        tempfile.mkdtemp(prefix="deepseek-frontend-"),
        _listeners(listening, count, backlog),
        mmap.mmap(-1, 4 * max(1, count) * _COUNTER.size),  # anonymous, shared with the children
    )
    # SIGHUP is forwarded from before the first fork: a child forked before it arrived may have
    # read the configuration already (each child counts one that comes before its loop listens)
    previous_hangup = signal.signal(signal.SIGHUP, group.hangup)
    for index in range(count):
        slot = group.fork(index)
        if slot is not None:
            return slot
    log.info("supervising %d frontend processes: pids %s", count, ",".join(map(str, group.running)))
    result = _supervise(group)
    if isinstance(result, int):
        signal.signal(signal.SIGHUP, previous_hangup)
        group.close()
    return result


def _supervise(group: _Group) -> ProcessSlot | int:
    """Forward SIGINT/SIGTERM to the children as SIGTERM; fork dead children again (after their
    back-off) until stopped; then wait for all of them. Returns the exit status, or a forked
    child's :class:`ProcessSlot` in that child."""
    stopping = False
    status = 0
    children = group.running
    #: a child served once: from then on a child that cannot start is restarted (its cause may pass)
    served = False

    def forward(signum: int, _frame: Any) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            group.due.clear()
            log.info("stopping %d frontend processes (signal %d)", len(children), signum)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline: float | None = None
    try:
        while children or group.due:
            now = time.monotonic()
            for index, when in sorted(group.due.items()):
                if when <= now and not stopping:
                    del group.due[index]
                    group.count_restart(index)
                    slot = group.fork(index)
                    if slot is not None:
                        return slot
                    log.info("frontend process %d restarted", index)
            served = served or group.accepting()
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid, raw = 0, 0
            if pid == 0:
                # nothing exited: poll (a blocking wait would not see deadlines pass)
                if stopping:
                    deadline = deadline or time.monotonic() + STOP_GRACE_S
                    if time.monotonic() > deadline:
                        for child in children:
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(child, signal.SIGKILL)
                time.sleep(0.05)
                continue
            index = children.pop(pid)
            code = os.waitstatus_to_exitcode(raw)
            why = _take_failure(group.directory, index)
            if why is not None and not served and not stopping:
                # the configuration cannot start (a store, a worker, a tokenizer): every process would
                # fail the same way, so the group stops with the child's one line and status 2
                print(why, file=sys.stderr, flush=True)
                status = STARTUP_FAILED
                forward(signal.SIGTERM, None)
            elif not stopping:
                group.died(index, pid, code, why)
            elif code not in (0, -signal.SIGTERM) and status != STARTUP_FAILED:
                status = status or 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status
