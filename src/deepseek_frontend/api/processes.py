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
  the forced exit a second SIGINT would mean). SIGTERM is forwarded the same way. A child that
  exits on its own (a crash) makes the supervisor stop the others and exit 1, so the container
  restarts as a whole instead of serving with fewer processes than configured. Each child also
  asks the kernel for SIGTERM if the supervisor dies (``PR_SET_PDEATHSIG``).
* ``/metrics`` covers every process: each child also serves the app on a private Unix socket
  in a 0700 temporary directory; the process answering a scrape fetches its siblings' own
  metrics (``/metrics?scope=process``) through those sockets and returns all series with a
  ``worker="<index>"`` label (``sum without (worker)`` in PromQL gives the pod's figure).

What is per process: the tokenizer's prefix and run caches (a conversation's follow-up that
lands on another process tokenizes its prompt cold once there), the in-process simulated
engine, admission limits (``--max-concurrent-requests`` etc. apply per process) and health.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ProcessSlot", "fork_processes", "merge_expositions"]

log = logging.getLogger("deepseek_frontend.serve")

#: seconds a sibling has to answer a metrics scrape before its series are left out
SIBLING_METRICS_TIMEOUT_S = 2.0
#: seconds the supervisor waits for children to drain after forwarding a stop signal
STOP_GRACE_S = 30.0
_PR_SET_PDEATHSIG = 1


@dataclass
class ProcessSlot:
    """What a child knows about its process group: its index, the count, the sibling sockets."""

    index: int
    count: int
    directory: str
    #: the private Unix socket this child serves on (next to the shared TCP socket)
    private_socket: socket.socket | None = None
    #: the TCP socket this child accepts on: its own SO_REUSEPORT one, or the inherited one
    listening: socket.socket | None = None
    _clients: dict[int, Any] = field(default_factory=dict)

    def socket_path(self, index: int) -> str:
        return os.path.join(self.directory, f"worker-{index}.sock")

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
        """Every process's metrics, each series labelled ``worker="<index>"`` (see module docstring).

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
                response = await client.get("http://worker/metrics", params={"scope": "process"})
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
        return merge_expositions(texts, unreachable=missing)


def merge_expositions(texts: Mapping[str, str], unreachable: int = 0) -> bytes:
    """Prometheus text expositions of several processes -> one, each sample labelled ``worker``.

    Families keep their type and help; samples of a family from every process are written
    together (the text format requires one block per family). ``unreachable`` is exported as
    the gauge ``deepseek_frontend_metrics_workers_unreachable``.
    """
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Metric] = {}
    for worker, text in texts.items():
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
                merged.unit = family.unit
            for s in family.samples:
                labels = {**s.labels, "worker": worker}
                merged.samples.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
    gauge = Metric(
        "deepseek_frontend_metrics_workers_unreachable",
        "frontend processes that did not answer this scrape (their series are missing)",
        "gauge",
    )
    gauge.add_sample("deepseek_frontend_metrics_workers_unreachable", {}, float(unreachable))
    families[gauge.name] = gauge

    class _Merged:
        def collect(self) -> Any:
            return iter(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())  # type: ignore[arg-type]
    return generate_latest(registry)


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when the supervisor dies (no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _own_listener(shared: socket.socket, backlog: int) -> socket.socket:
    """This child's own socket on ``shared``'s address when ``shared`` has SO_REUSEPORT, else ``shared``."""
    reuse_port = getattr(socket, "SO_REUSEPORT", None)
    if reuse_port is None or not shared.getsockopt(socket.SOL_SOCKET, reuse_port):
        return shared
    own = socket.socket(shared.family, socket.SOCK_STREAM)
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    own.setsockopt(socket.SOL_SOCKET, reuse_port, 1)
    own.bind(shared.getsockname())
    own.listen(backlog)
    shared.close()  # connections now queue on the children's own sockets only
    return own


def fork_processes(count: int, listening: socket.socket, backlog: int = 2048) -> ProcessSlot | int:
    """Fork ``count`` children sharing ``listening``'s port; supervise them (see module docstring).

    Returns a :class:`ProcessSlot` in each child (which then builds its app and serves), and
    the exit status in the supervisor once every child has exited.
    """
    if not hasattr(os, "fork"):
        raise OSError("--workers needs os.fork (POSIX)")
    directory = tempfile.mkdtemp(prefix="deepseek-frontend-")
    supervisor = os.getpid()
    children: dict[int, int] = {}
    for index in range(count):
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the supervisor only
            _die_with_parent()
            if os.getppid() != supervisor:  # the supervisor died before prctl took effect
                os._exit(1)
            slot = ProcessSlot(index, count, directory)
            slot.listening = _own_listener(listening, backlog)
            slot.bind_private()
            return slot
        children[pid] = index
    listening.close()  # only the children accept
    log.info("supervising %d frontend processes: pids %s", count, ",".join(map(str, children)))
    try:
        return _supervise(children)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _supervise(children: dict[int, int]) -> int:
    """Forward SIGINT/SIGTERM to the children as SIGTERM; wait for all of them (exit status)."""
    stopping = False
    status = 0

    def forward(signum: int, _frame: Any) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            log.info("stopping %d frontend processes (signal %d)", len(children), signum)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline: float | None = None
    try:
        while children:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                # nothing exited: poll (a blocking wait would not see the grace deadline pass)
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
            if not stopping:
                log.error(
                    "frontend process %d (pid %d) exited with %d: stopping the others", index, pid, code
                )
                status = 1
                forward(signal.SIGTERM, None)
            elif code not in (0, -signal.SIGTERM):
                status = status or 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status
